package ipam

import (
	"net/netip"
	"testing"
)

func TestPoolOf(t *testing.T) {
	a := New()
	// A rejected pool owns nothing: the older accepted one keeps its addresses.
	if errs := a.SetPools([]Pool{
		{Name: "v4", Addresses: []string{"192.0.2.0/24", "198.51.100.10-198.51.100.20"}, AvoidBuggyIPs: true, AutoAssign: true},
		{Name: "v6", Addresses: []string{"2001:db8::/120"}},
		{Name: "late", Addresses: []string{"192.0.2.128/25", "203.0.113.0/24"}},
	}); len(errs) != 1 || ReasonOf(errs["late"]) != ReasonOverlap {
		t.Fatalf("SetPools = %v, want pool late rejected for overlap", errs)
	}
	for ip, want := range map[string]string{
		"192.0.2.0":        "v4", // avoided, still the pool's
		"192.0.2.1":        "v4",
		"192.0.2.255":      "v4",
		"192.0.3.0":        "",
		"198.51.100.9":     "",
		"198.51.100.10":    "v4",
		"198.51.100.20":    "v4",
		"198.51.100.21":    "",
		"203.0.113.1":      "", // only in the rejected pool
		"2001:db8::":       "v6",
		"2001:db8::ff":     "v6",
		"2001:db8::100":    "",
		"::ffff:192.0.2.1": "", // mapped: an IPv6 address, in no pool
	} {
		got, ok := a.PoolOf(netip.MustParseAddr(ip))
		if got != want || ok != (want != "") {
			t.Errorf("PoolOf(%s) = %q, %v; want %q", ip, got, ok, want)
		}
	}
	if got, ok := a.PoolOf(netip.Addr{}); ok {
		t.Errorf("PoolOf(invalid) = %q, want none", got)
	}
	// Holding an address does not change its pool, nor does losing the pool.
	mustAssign(t, a, v4("s"), "v4", "192.0.2.1")
	a.SetPools(nil)
	if got, ok := a.PoolOf(netip.MustParseAddr("192.0.2.1")); ok {
		t.Errorf("PoolOf after removing every pool = %q, want none", got)
	}
}
