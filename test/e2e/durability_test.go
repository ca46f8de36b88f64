//go:build controlplane

package e2e

import (
	"fmt"
	"net/netip"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/vipcast/vipcast/ccm"
	"github.com/vipcast/vipcast/test/ccmtest"
)

const durabilityPools = `
apiVersion: vipcast.io/v1alpha1
kind: IPPool
metadata: {name: big-v4}
spec:
  addresses: ["10.50.0.0/22"]
---
apiVersion: vipcast.io/v1alpha1
kind: IPPool
metadata: {name: big-v6}
spec:
  addresses: ["2001:db8:50::/64"]
`

// durabilityServices returns n Services: mostly IPv4, some IPv6, some
// sharing pairs.
func durabilityServices(ns string, n int) []*v1.Service {
	var svcs []*v1.Service
	for i := range n {
		name := fmt.Sprintf("d-%03d", i)
		switch i % 5 {
		case 1:
			svcs = append(svcs, ccmtest.LBService(ns, name, withFamilies(v1.IPFamilyPolicySingleStack, v1.IPv6Protocol)))
		case 2:
			svcs = append(svcs, ccmtest.LBService(ns, name,
				withAnnotation(ccm.AnnotationSharingKey, fmt.Sprintf("k-%d", i/10)), withPorts(int32(2000+i))))
		default:
			svcs = append(svcs, ccmtest.LBService(ns, name))
		}
	}
	return svcs
}

// snapshot returns every Service's published VIPs in ns.
func (e *env) snapshot(ns string) map[string][]netip.Addr {
	out := map[string][]netip.Addr{}
	for key, s := range e.ListServices(ns) {
		if ips := ingressIPs(e.T, s); len(ips) > 0 {
			out[key] = ips
		}
	}
	return out
}

// waitSomeAllocated waits until at least n Services in ns have a VIP.
func (e *env) waitSomeAllocated(ns string, n int) {
	e.T.Helper()
	e.Eventually(60*time.Second, fmt.Sprintf("%d Services with a VIP", n), func() (bool, error) {
		return len(e.snapshot(ns)) >= n, nil
	})
}

// killMidBurst creates 500 Services in namespace burst, SIGKILLs victim once
// 100 have VIPs and returns the VIPs published at that moment.
func (e *env) killMidBurst(victim *ccmtest.CCM) map[string][]netip.Addr {
	e.T.Helper()
	created := e.createAllAsync(durabilityServices("burst", 500), 8)
	e.waitSomeAllocated("burst", 100)
	victim.Signal(syscall.SIGKILL)
	<-victim.Done()
	before := e.snapshot("burst")
	<-created
	return before
}

// checkUnchanged fails for every Service whose VIPs in before differ now.
func checkUnchanged(t testing.TB, before map[string][]netip.Addr, now map[string]*v1.Service) {
	t.Helper()
	changed := 0
	for key, ips := range before {
		s, ok := now[key]
		if !ok {
			t.Errorf("%s disappeared", key)
			continue
		}
		if got := ingressIPs(t, s); !equalAddrs(got, ips) {
			changed++
			t.Errorf("%s: VIP changed from %v to %v", key, ips, got)
		}
	}
	t.Logf("%d VIPs published before the disruption, %d changed", len(before), changed)
}

// TestKillDuringAllocation: SIGKILL the CCM while it allocates 500 Services
// and start it again: every Service ends with a VIP, no address is held by
// two non-sharing Services, and no VIP published before the kill changed.
func TestKillDuringAllocation(t *testing.T) {
	e := newEnv(t)
	e.mustApplyPools(durabilityPools)
	e.Namespace("burst", nil)
	first := e.StartCCM("first")
	before := e.killMidBurst(first)
	if len(before) >= 500 {
		t.Fatalf("all 500 Services had VIPs before the kill; the test did not interrupt allocation")
	}
	t.Logf("killed the CCM with %d of 500 Services allocated", len(before))

	e.StartCCM("second")
	got := e.waitAllAllocated(120*time.Second, "burst", func(*v1.Service) int { return 1 })
	if len(got) != 500 {
		t.Fatalf("%d Services, want 500", len(got))
	}
	checkUnchanged(t, before, got)
	checkNoDoubleHolders(t, got)
}

// TestLeaderChange: two CCM replicas; the leader is killed while allocating
// 500 Services; the standby takes over with the same guarantees.
func TestLeaderChange(t *testing.T) {
	e := newEnv(t)
	e.mustApplyPools(durabilityPools)
	e.Namespace("burst", nil)
	replicas := []*ccmtest.CCM{e.StartCCM("r1"), e.StartCCM("r2")}
	var leader, standby *ccmtest.CCM
	e.Eventually(30*time.Second, "one replica to become leader", func() (bool, error) {
		for i, r := range replicas {
			if r.IsLeader() {
				leader, standby = r, replicas[1-i]
				return true, nil
			}
		}
		return false, nil
	})
	before := e.killMidBurst(leader)
	t.Logf("killed the leader with %d of 500 Services allocated", len(before))
	if len(before) >= 500 {
		t.Fatalf("all 500 Services had VIPs before the kill; the test did not interrupt allocation")
	}
	got := e.waitAllAllocated(120*time.Second, "burst", func(*v1.Service) int { return 1 })
	if !standby.IsLeader() {
		t.Fatalf("the standby replica never took the lease")
	}
	checkUnchanged(t, before, got)
	checkNoDoubleHolders(t, got)
}
