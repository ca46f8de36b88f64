//go:build routing

package ipvs

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	tnetns "github.com/vipcast/vipcast/test/netns"
)

const (
	// dumpTestAddrs is how many addresses the namespace holds: enough
	// that one address dump spans many netlink messages, so that a change
	// between two of them interrupts it.
	dumpTestAddrs = 2000
	// dumpTestTries bounds the dumps each half of the test makes.
	dumpTestTries = 100
	// dumpTestChurns bounds the changes one churn makes.
	dumpTestChurns = 100_000
)

// dumpTestAddr is the i-th address of the namespace's loopback.
func dumpTestAddr(i int) netip.Addr {
	return netip.MustParseAddr(fmt.Sprintf("fd00:d0::%x", i))
}

// dumpTestHostAddr is a as a host address (/32, /128) for netlink.
func dumpTestHostAddr(a netip.Addr) *netlink.Addr {
	return &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(a, a.BitLen())), Flags: unix.IFA_F_NODAD}
}

// TestDumpSurvivesAddressChurn interrupts real address dumps on purpose: a
// namespace's loopback holds dumpTestAddrs IPv6 addresses while another
// socket adds and deletes an address of a veth link over and over, as DHCP,
// the kubelet or the CNI change a node's addresses under the speaker. A
// plain AddrList of lo must see netlink.ErrDumpInterrupted (else the test
// interrupts nothing and proves nothing); dump over the same AddrList must
// return every address of lo each time, retrying the interrupted attempts.
//
// The churn is on another link than the dumped one because the kernel (6.18
// here) checks a dump's consistency racily: a change to the dumped link's
// own list, which shifts the dump's position in it, now and then yields a
// list with an address missing or twice and no NLM_F_DUMP_INTR, which no
// retry can tell. The links whose addresses the speaker reads are its own,
// which it alone changes; the changes it races with are on other links, as
// here.
func TestDumpSurvivesAddressChurn(t *testing.T) {
	tnetns.Require(t)
	ns := tnetns.New(t, "dumpintr")
	nsh, err := netns.GetFromName(ns.Name)
	if err != nil {
		t.Fatalf("open netns %s: %v", ns.Name, err)
	}
	t.Cleanup(func() { _ = nsh.Close() })
	// Two sockets: one dumps, the other changes the addresses meanwhile.
	h, err := netlink.NewHandleAt(nsh, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatalf("netlink handle in %s: %v", ns.Name, err)
	}
	t.Cleanup(h.Close)
	ch, err := netlink.NewHandleAt(nsh, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatalf("netlink handle in %s: %v", ns.Name, err)
	}
	t.Cleanup(ch.Close)
	lo, err := h.LinkByName("lo")
	if err != nil {
		t.Fatalf("lo in %s: %v", ns.Name, err)
	}
	for i := range dumpTestAddrs {
		if err := h.AddrAdd(lo, dumpTestHostAddr(dumpTestAddr(i+1))); err != nil {
			t.Fatalf("add %s: %v", dumpTestAddr(i+1), err)
		}
	}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "vcdump0"}, PeerName: "vcdump1"}
	if err := h.LinkAdd(veth); err != nil {
		t.Fatalf("veth in %s: %v", ns.Name, err)
	}
	churnLink, err := h.LinkByName(veth.Name)
	if err != nil {
		t.Fatalf("%s: %v", veth.Name, err)
	}
	if err := h.LinkSetUp(churnLink); err != nil {
		t.Fatalf("set %s up: %v", veth.Name, err)
	}
	churned := dumpTestHostAddr(netip.MustParseAddr("fd00:d1::1"))

	// churn adds and deletes churned on churnLink, over ch, until the
	// returned stop is called; stop returns the error of a change.
	churn := func() (stop func() error) {
		quit, done := make(chan struct{}), make(chan error, 1)
		go func() {
			for range dumpTestChurns {
				select {
				case <-quit:
					done <- nil
					return
				default:
				}
				if err := ch.AddrAdd(churnLink, churned); err != nil {
					done <- fmt.Errorf("add %s: %w", churned.IPNet, err)
					return
				}
				if err := ch.AddrDel(churnLink, churned); err != nil {
					done <- fmt.Errorf("delete %s: %w", churned.IPNet, err)
					return
				}
			}
			done <- nil
		}()
		return func() error {
			close(quit)
			return <-done
		}
	}
	list := func() ([]netlink.Addr, error) { return h.AddrList(lo, unix.AF_INET6) }

	// A plain dump under churn: interrupted at least once in
	// dumpTestTries.
	interrupted := 0
	func() {
		stop := churn()
		defer func() {
			if err := stop(); err != nil {
				t.Errorf("churn: %v", err)
			}
		}()
		for try := 0; try < dumpTestTries && interrupted == 0; try++ {
			if _, err := list(); errors.Is(err, netlink.ErrDumpInterrupted) {
				interrupted++
			} else if err != nil {
				t.Fatalf("AddrList: %v", err)
			}
		}
	}()
	if interrupted == 0 {
		t.Fatalf("no AddrList of %d addresses was interrupted in %d tries under churn: the test interrupts nothing", dumpTestAddrs, dumpTestTries)
	}

	// dump over the same AddrList: the addresses churn during every
	// attempt but the last one a call may make, so each call must return
	// the complete list, and some calls must have retried an
	// interrupted attempt.
	retried := 0
	for try := range dumpTestTries {
		attempt := 0
		addrs, err := dump("addresses of lo", func() ([]netlink.Addr, error) {
			attempt++
			if attempt < dumpAttempts {
				stop := churn()
				defer func() {
					if err := stop(); err != nil {
						t.Errorf("churn: %v", err)
					}
				}()
			}
			got, err := list()
			if errors.Is(err, netlink.ErrDumpInterrupted) {
				retried++
			}
			return got, err
		})
		if err != nil {
			t.Fatalf("dump %d: %v", try, err)
		}
		if wrong := wrongDumpTestAddrs(addrs); len(wrong) > 0 {
			t.Fatalf("dump %d returned %d addresses, wrong: %v", try, len(addrs), wrong)
		}
	}
	if retried == 0 {
		t.Fatalf("no attempt of %d dumps under churn was interrupted: dump retried nothing", dumpTestTries)
	}
	t.Logf("dump retried %d interrupted attempts over %d dumps", retried, dumpTestTries)
}

// wrongDumpTestAddrs lists what makes addrs other than lo's addresses,
// ::1 and the dumpTestAddrs fixed ones, each once: the addresses it lacks,
// holds twice or holds beside them.
func wrongDumpTestAddrs(addrs []netlink.Addr) []string {
	want := []netip.Addr{netip.IPv6Loopback()}
	for i := range dumpTestAddrs {
		want = append(want, dumpTestAddr(i+1))
	}
	seen := map[netip.Addr]int{}
	for _, a := range addrs {
		ip, _ := netip.AddrFromSlice(a.IP)
		seen[ip]++
	}
	var wrong []string
	for _, a := range want {
		switch seen[a] {
		case 1:
		case 0:
			wrong = append(wrong, a.String()+" (missing)")
		default:
			wrong = append(wrong, fmt.Sprintf("%s (%d times)", a, seen[a]))
		}
		delete(seen, a)
	}
	for a := range seen {
		wrong = append(wrong, a.String()+" (not on lo)")
	}
	return wrong
}
