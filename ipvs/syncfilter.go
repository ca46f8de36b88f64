package ipvs

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync"
)

// What a relay lets into the local backup daemon, entry by entry.
//
// A version 1 sync message (after the 8-byte header) is a run of
// connections, each padded to 4 bytes:
//
//	type (0 IPv4, 1 IPv6) | protocol | version (4 bits) and size (12 bits)
//	flags (32 bits) | state (16) | client port | virtual port | real port
//	fwmark (32) | timeout in seconds (32)
//	client, virtual and real addresses (4 or 16 bytes each)
//	options (type, length, data), up to size
//
// The backup enters each connection as it is written: the kernel binds it
// to a real server of its own table when one matches, and otherwise keeps
// it with the forwarding method and real address the message names. One
// forged entry would send a chosen client's flow, by IPIP, to any address
// (a man in the middle), end a connection's entry early, or pin it for
// 2^32 seconds. The relay keeps only the entries the node's own tier 1
// could have written: tunnel forwarding, to a virtual server of its tier 1
// and one of that virtual server's tunnel real servers (the nodes), with a
// timeout of at most syncMaxTimeout (longer ones are cut to it).

const (
	// syncConnLen4 and syncConnLen6 are the fixed parts of an IPv4 and an
	// IPv6 sync connection.
	syncConnLen4 = 36
	syncConnLen6 = 72
	// syncFwdMask and syncFwdTunnel are the forwarding method bits of a
	// connection's flags (IP_VS_CONN_F_FWD_MASK, IP_VS_CONN_F_TUNNEL).
	syncFwdMask   = 0x0007
	syncFwdTunnel = 0x0002
	// syncMaxTimeout bounds the timeout of a relayed connection, in
	// seconds: four times the kernel's default for an established TCP
	// connection (900 s). A longer one is cut to it.
	syncMaxTimeout = 3600
)

// Why a relay drops a connection of a sync message.
const (
	// SyncDropMalformed: the message does not parse (the whole message
	// goes).
	SyncDropMalformed = "malformed"
	// SyncDropNotTunnel: a forwarding method other than tunnel.
	SyncDropNotTunnel = "not-tunnel"
	// SyncDropUnknownTarget: no tier-1 virtual server of this node with
	// that tunnel real server.
	SyncDropUnknownTarget = "unknown-target"
)

// syncTargets are the tier-1 virtual servers of the node and their tunnel
// real servers: what a relayed connection may name. The Dataplane updates
// it as it applies plans; the relay reads it for every message.
type syncTargets struct {
	mu  sync.RWMutex
	svc map[Key]map[netip.AddrPort]struct{}
}

// reset makes t the tier-1 virtual servers of st.
func (t *syncTargets) reset(st State) {
	m := make(map[Key]map[netip.AddrPort]struct{}, len(st.Services))
	for k, s := range st.Services {
		if d := tunnelDests(s); d != nil {
			m[k] = d
		}
	}
	t.mu.Lock()
	t.svc = m
	t.mu.Unlock()
}

// update sets the entries of keys from st (removing those st lacks or that
// have no tunnel real server).
func (t *syncTargets) update(st State, keys []Key) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.svc == nil {
		t.svc = map[Key]map[netip.AddrPort]struct{}{}
	}
	for _, k := range keys {
		if d := tunnelDests(st.Services[k]); d != nil {
			t.svc[k] = d
		} else {
			delete(t.svc, k)
		}
	}
}

// allows reports whether k is a tier-1 virtual server with real server
// dest.
func (t *syncTargets) allows(k Key, dest netip.AddrPort) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	_, ok := t.svc[k][dest]
	return ok
}

// tunnelDests returns s's tunnel real servers, nil when it has none.
func tunnelDests(s Service) map[netip.AddrPort]struct{} {
	var out map[netip.AddrPort]struct{}
	for _, b := range s.Backends {
		if !b.Tunnel {
			continue
		}
		if out == nil {
			out = map[netip.AddrPort]struct{}{}
		}
		out[netip.AddrPortFrom(b.Addr.Unmap(), b.Port)] = struct{}{}
	}
	return out
}

// SyncFilterResult is what filterSyncMessage did to one message.
type SyncFilterResult struct {
	// Kept are the connections passed on; Clamped those of them whose
	// timeout was cut to syncMaxTimeout.
	Kept, Clamped int
	// Dropped counts the connections left out, by reason (SyncDrop*).
	Dropped map[string]int
}

// filterSyncMessage returns msg, a version 1 sync message that passed
// checkSyncMessage, with only the connections allowed accepts (see above),
// timeouts cut to syncMaxTimeout; nil when none is left. A message that
// does not parse is dropped whole. msg is modified (the timeouts).
func filterSyncMessage(msg []byte, allowed func(Key, netip.AddrPort) bool) ([]byte, SyncFilterResult) {
	res := SyncFilterResult{Dropped: map[string]int{}}
	conns, err := splitSyncMessage(msg)
	if err != nil {
		res.Dropped[SyncDropMalformed]++
		return nil, res
	}
	out := make([]byte, syncHeaderLen, len(msg))
	copy(out, msg[:syncHeaderLen])
	for _, c := range conns {
		reason, clamped := checkSyncConn(c.fixed, allowed)
		if reason != "" {
			res.Dropped[reason]++
			continue
		}
		if clamped {
			res.Clamped++
		}
		res.Kept++
		out = append(out, c.whole...)
	}
	if res.Kept == 0 {
		return nil, res
	}
	binary.BigEndian.PutUint16(out[2:4], uint16(len(out))) //nolint:gosec // at most len(msg), which fits
	out[4] = byte(res.Kept)                                //nolint:gosec // at most msg's count, one byte
	return out, res
}

// syncConn is one connection of a message: its fixed part, and the whole
// of it with options and padding.
type syncConn struct {
	fixed, whole []byte
}

// splitSyncMessage splits msg's connections as the kernel's backup walks
// them (ip_vs_process_message): count from the header, each one's size
// from its own, padded to 4 bytes; options must end within the size.
func splitSyncMessage(msg []byte) ([]syncConn, error) {
	if len(msg) < syncHeaderLen {
		return nil, fmt.Errorf("%d bytes, shorter than a header", len(msg))
	}
	if msg[6] != 0 || msg[7] != 0 {
		return nil, fmt.Errorf("spare bytes %#x %#x, want zero", msg[6], msg[7])
	}
	n := int(msg[4])
	conns := make([]syncConn, 0, n)
	off := syncHeaderLen
	for i := range n {
		if off+4 > len(msg) {
			return nil, fmt.Errorf("connection %d: past the end", i)
		}
		verSize := binary.BigEndian.Uint16(msg[off+2 : off+4])
		if verSize>>12 != 0 {
			return nil, fmt.Errorf("connection %d: version %d", i, verSize>>12)
		}
		size := int(verSize & 0x0fff)
		fixed := syncConnLen4
		switch msg[off] {
		case 0:
		case 1:
			fixed = syncConnLen6
		default:
			return nil, fmt.Errorf("connection %d: type %d", i, msg[off])
		}
		if size < fixed || off+size > len(msg) {
			return nil, fmt.Errorf("connection %d: size %d", i, size)
		}
		if err := checkSyncOptions(msg[off+fixed : off+size]); err != nil {
			return nil, fmt.Errorf("connection %d: %w", i, err)
		}
		end := min(off+(size+3)&^3, len(msg))
		conns = append(conns, syncConn{fixed: msg[off : off+fixed], whole: msg[off:end]})
		off = end
	}
	if off != len(msg) {
		return nil, fmt.Errorf("%d bytes after the %d connections", len(msg)-off, n)
	}
	return conns, nil
}

// checkSyncOptions checks that a connection's options (type, length,
// data) end exactly at its end, each with a length.
func checkSyncOptions(b []byte) error {
	for len(b) > 0 {
		if len(b) < 2 || b[1] == 0 || 2+int(b[1]) > len(b) {
			return fmt.Errorf("option %d: bad length", b[0])
		}
		b = b[2+int(b[1]):]
	}
	return nil
}

// checkSyncConn returns why connection c (its fixed part) is dropped, ""
// when it is kept, and whether its timeout was cut.
func checkSyncConn(c []byte, allowed func(Key, netip.AddrPort) bool) (reason string, clamped bool) {
	if binary.BigEndian.Uint32(c[4:8])&syncFwdMask != syncFwdTunnel {
		return SyncDropNotTunnel, false
	}
	alen := 4
	if c[0] == 1 {
		alen = 16
	}
	vaddr, _ := netip.AddrFromSlice(c[24+alen : 24+2*alen])
	daddr, _ := netip.AddrFromSlice(c[24+2*alen : 24+3*alen])
	k := Key{VIP: vaddr, Port: binary.BigEndian.Uint16(c[12:14]), Protocol: Protocol(c[1])}
	if !allowed(k, netip.AddrPortFrom(daddr, binary.BigEndian.Uint16(c[14:16]))) {
		return SyncDropUnknownTarget, false
	}
	if binary.BigEndian.Uint32(c[20:24]) > syncMaxTimeout {
		binary.BigEndian.PutUint32(c[20:24], syncMaxTimeout)
		return "", true
	}
	return "", false
}
