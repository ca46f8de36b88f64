package ipam

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// newAlloc returns an allocator with pools installed, failing on any
// rejected pool.
func newAlloc(t testing.TB, pools ...Pool) *Allocator {
	t.Helper()
	a := New()
	if errs := a.SetPools(pools); errs != nil {
		t.Fatalf("SetPools: %v", errs)
	}
	return a
}

// addrs parses addresses.
func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

// v4 is a single-stack IPv4 request from namespace "default".
func v4(owner string) Request {
	return Request{Owner: owner, Namespace: "default", Families: []Family{IPv4}}
}

// mustAssign assigns and checks the pool and addresses.
func mustAssign(t testing.TB, a *Allocator, req Request, wantPool string, want ...string) Assignment {
	t.Helper()
	got, err := a.Assign(req)
	if err != nil {
		t.Fatalf("Assign(%s): %v", req.Owner, err)
	}
	if got.Pool != wantPool || !slices.Equal(got.IPs, addrs(want...)) {
		t.Fatalf("Assign(%s) = %s %v, want %s %v", req.Owner, got.Pool, got.IPs, wantPool, want)
	}
	checkOK(t, a)
	return got
}

// mustFail assigns and checks the error's reason and that its message
// contains every fragment.
func mustFail(t testing.TB, a *Allocator, req Request, reason Reason, fragments ...string) {
	t.Helper()
	before, had := a.Assigned(req.Owner)
	got, err := a.Assign(req)
	if err == nil {
		t.Fatalf("Assign(%s) = %v, want %s error", req.Owner, got, reason)
	}
	checkErr(t, err, reason, fragments...)
	after, has := a.Assigned(req.Owner)
	if had != has || before.Pool != after.Pool || !slices.Equal(before.IPs, after.IPs) {
		t.Fatalf("failed Assign(%s) changed the assignment from %v to %v", req.Owner, before, after)
	}
	checkOK(t, a)
}

func checkErr(t testing.TB, err error, reason Reason, fragments ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want %s", reason)
	}
	if ReasonOf(err) != reason {
		t.Fatalf("reason %q, want %q: %v", ReasonOf(err), reason, err)
	}
	for _, f := range fragments {
		if !strings.Contains(err.Error(), f) {
			t.Fatalf("error %q does not mention %q", err, f)
		}
	}
}

func checkOK(t testing.TB, a *Allocator) {
	t.Helper()
	if err := a.checkInvariants(); err != nil {
		t.Fatalf("invariant broken: %v", err)
	}
}

func mustHolders(t testing.TB, a *Allocator, ip string, want ...string) {
	t.Helper()
	if got := a.Holders(netip.MustParseAddr(ip)); !slices.Equal(got, want) {
		t.Fatalf("Holders(%s) = %v, want %v", ip, got, want)
	}
}

func mustInUse(t testing.TB, a *Allocator, pool string, v4, v6 int) {
	t.Helper()
	s, ok := a.Stats(pool)
	if !ok {
		t.Fatalf("Stats(%s): no such pool", pool)
	}
	if s.IPv4.InUse != v4 || s.IPv6.InUse != v6 {
		t.Fatalf("Stats(%s) in use %d/%d, want %d/%d", pool, s.IPv4.InUse, s.IPv6.InUse, v4, v6)
	}
}
