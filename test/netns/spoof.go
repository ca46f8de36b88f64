package netns

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
)

// SpoofUDP sends one UDP datagram over IPv4 from inside ns with a forged
// source address and the given TTL: the IP header is built byte by byte on
// a raw socket (IPPROTO_RAW implies IP_HDRINCL), as an attacker on the
// fabric forges a router's or a node's packets. ns must have a route to
// dst.
func (ns *NS) SpoofUDP(src, dst netip.AddrPort, ttl uint8, payload []byte) error {
	if !src.Addr().Is4() || !dst.Addr().Is4() {
		return errors.New("netns: SpoofUDP builds IPv4 packets only")
	}
	pkt := udp4Packet(src, dst, ttl, payload)
	return ns.do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
		if err != nil {
			return fmt.Errorf("netns: raw socket: %w", err)
		}
		defer func() { _ = unix.Close(fd) }()
		if err := unix.Sendto(fd, pkt, 0, &unix.SockaddrInet4{Addr: dst.Addr().As4()}); err != nil {
			return fmt.Errorf("netns: send a forged packet to %s: %w", dst, err)
		}
		return nil
	})
}

// SpoofIPIP sends one IPIP packet over IPv4 from inside ns: an outer
// header from outer's source to its destination (a node address), with
// protocol 4, around a UDP datagram from inner's source to its
// destination, as a host on the fabric injects packets with a forged
// source through a node's tunnel. ns must have a route to the outer
// destination.
func (ns *NS) SpoofIPIP(outerSrc, outerDst netip.Addr, innerSrc, innerDst netip.AddrPort, payload []byte) error {
	if !outerSrc.Is4() || !outerDst.Is4() || !innerSrc.Addr().Is4() || !innerDst.Addr().Is4() {
		return errors.New("netns: SpoofIPIP builds IPv4 packets only")
	}
	inner := udp4Packet(innerSrc, innerDst, 64, payload)
	// The kernel fills in the outer header's checksum, not the inner's.
	binary.BigEndian.PutUint16(inner[10:], ipv4HeaderChecksum(inner[:20]))
	const ipLen = 20
	pkt := make([]byte, ipLen+len(inner))
	pkt[0] = 0x45
	binary.BigEndian.PutUint16(pkt[2:], uint16(len(pkt))) //nolint:gosec // a test packet, far below 64 KiB
	pkt[8] = 64
	pkt[9] = unix.IPPROTO_IPIP
	s, d := outerSrc.As4(), outerDst.As4()
	copy(pkt[12:16], s[:])
	copy(pkt[16:20], d[:])
	copy(pkt[ipLen:], inner)
	return ns.do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
		if err != nil {
			return fmt.Errorf("netns: raw socket: %w", err)
		}
		defer func() { _ = unix.Close(fd) }()
		if err := unix.Sendto(fd, pkt, 0, &unix.SockaddrInet4{Addr: d}); err != nil {
			return fmt.Errorf("netns: send a forged IPIP packet to %s: %w", outerDst, err)
		}
		return nil
	})
}

// ipv4HeaderChecksum is the checksum of an IPv4 header whose checksum
// field is zero.
func ipv4HeaderChecksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}

// udp4Packet returns an IPv4 header (DSCP CS6, the class BFD uses), a UDP
// header with its checksum, and payload. The kernel fills in the IP
// header's checksum and identification.
func udp4Packet(src, dst netip.AddrPort, ttl uint8, payload []byte) []byte {
	const ipLen, udpLen = 20, 8
	b := make([]byte, ipLen+udpLen+len(payload))
	b[0] = 0x45
	b[1] = 0xc0
	binary.BigEndian.PutUint16(b[2:], uint16(len(b))) //nolint:gosec // a test packet, far below 64 KiB
	b[8] = ttl
	b[9] = unix.IPPROTO_UDP
	s, d := src.Addr().As4(), dst.Addr().As4()
	copy(b[12:16], s[:])
	copy(b[16:20], d[:])
	u := b[ipLen:]
	binary.BigEndian.PutUint16(u[0:], src.Port())
	binary.BigEndian.PutUint16(u[2:], dst.Port())
	binary.BigEndian.PutUint16(u[4:], uint16(udpLen+len(payload))) //nolint:gosec // as above
	copy(u[udpLen:], payload)
	// Checksum over the pseudo-header (addresses, protocol, UDP length)
	// and the UDP header and data.
	var sum uint32
	add := func(p []byte) {
		for i := 0; i+1 < len(p); i += 2 {
			sum += uint32(binary.BigEndian.Uint16(p[i:]))
		}
		if len(p)%2 == 1 {
			sum += uint32(p[len(p)-1]) << 8
		}
	}
	add(s[:])
	add(d[:])
	sum += unix.IPPROTO_UDP + uint32(len(u)) //nolint:gosec // a test packet, far below 64 KiB
	add(u)
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	ck := ^uint16(sum)
	if ck == 0 {
		ck = 0xffff
	}
	binary.BigEndian.PutUint16(u[6:], ck)
	return b
}

// CaptureUDP listens on link inside ns (a packet socket: it sees what
// arrives on the link, whoever it is addressed to) and returns the payload
// of the first IPv4 UDP datagram match accepts, or an error after
// timeout.
func (ns *NS) CaptureUDP(link string, timeout time.Duration, match func(src, dst netip.AddrPort, ttl uint8, payload []byte) bool) ([]byte, error) {
	var out []byte
	err := ns.do(func() error {
		ifi, err := net.InterfaceByName(link)
		if err != nil {
			return fmt.Errorf("netns: capture on %s: %w", link, err)
		}
		const ethPIP = 0x0800
		proto := int(htons(ethPIP))
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, proto)
		if err != nil {
			return fmt.Errorf("netns: packet socket: %w", err)
		}
		defer func() { _ = unix.Close(fd) }()
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(ethPIP), Ifindex: ifi.Index}); err != nil {
			return fmt.Errorf("netns: bind the packet socket to %s: %w", link, err)
		}
		tv := unix.NsecToTimeval((100 * time.Millisecond).Nanoseconds())
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			return fmt.Errorf("netns: packet socket timeout: %w", err)
		}
		buf := make([]byte, 2048)
		for deadline := time.Now().Add(timeout); time.Now().Before(deadline); {
			n, _, err := unix.Recvfrom(fd, buf, 0)
			if err != nil {
				if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
					continue
				}
				return fmt.Errorf("netns: capture on %s: %w", link, err)
			}
			p := buf[:n]
			if n < 28 || p[0]>>4 != 4 || p[9] != unix.IPPROTO_UDP {
				continue
			}
			ihl := int(p[0]&0x0f) * 4
			if n < ihl+8 {
				continue
			}
			src := netip.AddrPortFrom(netip.AddrFrom4([4]byte(p[12:16])), binary.BigEndian.Uint16(p[ihl:]))
			dst := netip.AddrPortFrom(netip.AddrFrom4([4]byte(p[16:20])), binary.BigEndian.Uint16(p[ihl+2:]))
			if payload := p[ihl+8:]; match(src, dst, p[8], payload) {
				out = append([]byte(nil), payload...)
				return nil
			}
		}
		return fmt.Errorf("netns: no matching UDP datagram on %s in %v", link, timeout)
	})
	return out, err
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
