//go:build kernel

package ipvs

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vipcast/vipcast/test/vm"
)

// TestKernelSpoofedACK: with the two tiers, sloppy_tcp lets one spoofed
// TCP ACK to a VIP create an IPVS entry in state ESTABLISHED for 900 s (as
// a real mid-flow pickup after an ECMP move needs). What bounds them is the
// kernel's entry defence, which New turns on in its automatic mode
// (drop_entry 1): once the node's available memory is below
// net.ipv4.vs.amemthresh (forced here by raising the threshold above any
// memory), the kernel switches it on (drop_entry reads 2) and drops old
// entries that carried few packets. Without vipcast's setting it stays off
// (0) whatever the memory.
func TestKernelSpoofedACK(t *testing.T) {
	if !vm.InVM() {
		kernelSuite.Run(t)
		return
	}
	f := newMoveFabric(t)
	for n := range f.nodes {
		twoTierNode(t, f, n)
	}
	f.steer(t, 0)
	state, expires := spoofACK(t, f, 40001)
	if state != "ESTABLISHED" || expires < 800 {
		t.Errorf("lone ACK: entry %q (%d s), want ESTABLISHED for about 900 s (the attack this defends against)", state, expires)
	}
	nsSysctls(t, f.nodes[0], map[string]string{"net/ipv4/vs/amemthresh": strconv.Itoa(1 << 30)})
	defer nsSysctls(t, f.nodes[0], map[string]string{"net/ipv4/vs/amemthresh": "1024"})
	// The kernel looks at the available memory once a second.
	var got string
	for range 10 {
		if got = nsSysctl(t, f.nodes[0], "net/ipv4/vs/drop_entry"); got == "2" {
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Errorf("available memory below amemthresh: drop_entry = %s after 5 s, want 2 (the defence on)", got)
}

// spoofACK sends a TCP segment with only ACK set from the client's address
// and port sport to the VIP, through node 0, until node 0 has an IPVS entry
// for it (at most 10 times, 500 ms apart: the first may wait for the
// fabric's neighbour resolution), and returns the entry's state and
// seconds to expiry ("" when it never had one).
func spoofACK(t *testing.T, f *moveFabric, sport int) (state string, expires int) {
	t.Helper()
	seg := make([]byte, 20)
	binary.BigEndian.PutUint16(seg[0:], uint16(sport)) //nolint:gosec // a test port
	binary.BigEndian.PutUint16(seg[2:], movePort)
	binary.BigEndian.PutUint32(seg[4:], 0x01020304) // sequence
	binary.BigEndian.PutUint32(seg[8:], 0x05060708) // acknowledgement
	seg[12], seg[13] = 5<<4, 0x10                   // header length, ACK
	binary.BigEndian.PutUint16(seg[14:], 65535)     // window
	pseudo := append(append(f.src.AsSlice(), f.vip.AsSlice()...), 0, 6, 0, 20)
	binary.BigEndian.PutUint16(seg[16:], checksum(append(pseudo, seg...)))
	for try := 1; try <= 10; try++ {
		must(t, inNS(t, f.client, func() error {
			c, err := net.ListenPacket("ip4:tcp", f.src.String())
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.WriteTo(seg, &net.IPAddr{IP: f.vip.AsSlice()})
			return err
		}))
		for deadline := time.Now().Add(500 * time.Millisecond); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if state, expires = ipvsEntry(t, f, sport); state != "" {
				if try > 1 {
					t.Logf("the entry for port %d appeared after %d ACKs", sport, try)
				}
				return state, expires
			}
		}
	}
	return "", 0
}

// ipvsEntry reads node 0's /proc/net/ip_vs_conn for the entry from the
// client's port sport.
func ipvsEntry(t *testing.T, f *moveFabric, sport int) (state string, expires int) {
	t.Helper()
	must(t, inNS(t, f.nodes[0], func() error {
		fd, err := os.Open("/proc/net/ip_vs_conn")
		if err != nil {
			return err
		}
		defer fd.Close()
		want := fmt.Sprintf("%04X", sport)
		sc := bufio.NewScanner(fd)
		for sc.Scan() {
			// Pro FromIP FPrt ToIP TPrt DestIP DPrt State Expires
			fl := strings.Fields(sc.Text())
			if len(fl) >= 9 && fl[0] == "TCP" && fl[2] == want {
				state = fl[7]
				expires, _ = strconv.Atoi(fl[8])
			}
		}
		return sc.Err()
	}))
	return state, expires
}
