//go:build controlplane

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/ccm"
	"github.com/vipcast/vipcast/test/ccmtest"
)

const mixPools = `
apiVersion: vipcast.io/v1alpha1
kind: IPPool
metadata: {name: v4-main}
spec:
  addresses: ["10.20.0.0/24", "10.20.1.10-10.20.1.200"]
  allocation: {priority: 10}
---
apiVersion: vipcast.io/v1alpha1
kind: IPPool
metadata: {name: v6-main}
spec:
  addresses: ["2001:db8:20::/64"]
  allocation: {priority: 10}
---
apiVersion: vipcast.io/v1alpha1
kind: IPPool
metadata: {name: dual}
spec:
  addresses: ["10.30.0.0/24", "2001:db8:30::/120"]
  allocation: {priority: 20}
---
apiVersion: vipcast.io/v1alpha1
kind: IPPool
metadata: {name: reserved}
spec:
  addresses: ["10.40.0.0/27"]
  autoAssign: false
`

// expectation says what one test Service must end up with.
type expectation struct {
	pool       string        // pool every address must come from
	families   []v1.IPFamily // address families, in order
	requested  []netip.Addr  // exact addresses, if requested
	sharingKey string
}

// mixedServices builds n Services covering every allocation path: v4, v6,
// dual-stack (required and preferred), explicit pool, requested IPs through
// the annotation and through spec.loadBalancerIP, and shared IPs.
func mixedServices(ns string, n int) ([]*v1.Service, map[string]expectation) {
	var svcs []*v1.Service
	exp := map[string]expectation{}
	v4, v6 := v1.IPv4Protocol, v1.IPv6Protocol
	for i := range n {
		name := fmt.Sprintf("svc-%03d", i)
		var s *v1.Service
		var e expectation
		switch i % 8 {
		case 0:
			s = ccmtest.LBService(ns, name, withFamilies(v1.IPFamilyPolicyRequireDualStack, v4, v6))
			e = expectation{pool: "dual", families: []v1.IPFamily{v4, v6}}
		case 1:
			s = ccmtest.LBService(ns, name, withFamilies(v1.IPFamilyPolicySingleStack, v6))
			e = expectation{pool: "v6-main", families: []v1.IPFamily{v6}}
		case 2:
			ip := netip.MustParseAddr(fmt.Sprintf("10.20.1.%d", 100+i/8))
			s = ccmtest.LBService(ns, name, withAnnotation(ccm.AnnotationIPs, ip.String()))
			e = expectation{pool: "v4-main", families: []v1.IPFamily{v4}, requested: []netip.Addr{ip}}
		case 3:
			s = ccmtest.LBService(ns, name, withAnnotation(ccm.AnnotationPool, "dual"))
			e = expectation{pool: "dual", families: []v1.IPFamily{v4}}
		case 4:
			key := fmt.Sprintf("grp-%d", i/16)
			s = ccmtest.LBService(ns, name, withAnnotation(ccm.AnnotationSharingKey, key), withPorts(int32(1000+i)))
			e = expectation{pool: "v4-main", families: []v1.IPFamily{v4}, sharingKey: key}
		case 5:
			s = ccmtest.LBService(ns, name, withAnnotation(ccm.AnnotationPool, "dual"),
				withFamilies(v1.IPFamilyPolicyPreferDualStack, v6, v4))
			e = expectation{pool: "dual", families: []v1.IPFamily{v6, v4}}
		case 6:
			ip := netip.MustParseAddr(fmt.Sprintf("10.40.0.%d", i/8))
			s = ccmtest.LBService(ns, name)
			s.Spec.LoadBalancerIP = ip.String()
			e = expectation{pool: "reserved", families: []v1.IPFamily{v4}, requested: []netip.Addr{ip}}
		default:
			s = ccmtest.LBService(ns, name)
			e = expectation{pool: "v4-main", families: []v1.IPFamily{v4}}
		}
		svcs = append(svcs, s)
		exp[ns+"/"+name] = e
	}
	return svcs, exp
}

// createAll creates Services from workers goroutines, as a burst of clients would.
func (e *env) createAll(svcs []*v1.Service, workers int) {
	e.T.Helper()
	<-e.createAllAsync(svcs, workers)
}

// createAllAsync is createAll in the background; the channel closes when all
// creates returned. Errors are reported with t.Errorf.
func (e *env) createAllAsync(svcs []*v1.Service, workers int) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.createWith(svcs, workers)
	}()
	return done
}

func (e *env) createWith(svcs []*v1.Service, workers int) {
	ch := make(chan *v1.Service)
	var wg sync.WaitGroup
	errs := make(chan error, len(svcs))
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := range ch {
				if _, err := e.CP.Client.CoreV1().Services(s.Namespace).Create(context.Background(), s, metav1.CreateOptions{}); err != nil {
					errs <- fmt.Errorf("creating %s/%s: %w", s.Namespace, s.Name, err)
				}
			}
		}()
	}
	for _, s := range svcs {
		ch <- s
	}
	close(ch)
	wg.Wait()
	close(errs)
	for err := range errs {
		e.T.Errorf("%v", err)
	}
}

// waitAllAllocated waits until every Service in ns has as many ingress
// addresses as want says.
func (e *env) waitAllAllocated(timeout time.Duration, ns string, want func(*v1.Service) int) map[string]*v1.Service {
	e.T.Helper()
	var svcs map[string]*v1.Service
	e.Eventually(timeout, "every Service in "+ns+" to have its VIPs", func() (bool, error) {
		svcs = e.ListServices(ns)
		missing := 0
		for _, s := range svcs {
			if len(s.Status.LoadBalancer.Ingress) != want(s) {
				missing++
			}
		}
		if missing > 0 {
			return false, fmt.Errorf("%d of %d Services still without their VIPs", missing, len(svcs))
		}
		return true, nil
	})
	return svcs
}

// checkNoDoubleHolders fails if an address is held by two Services that do
// not share it under the same sharing key with disjoint ports.
func checkNoDoubleHolders(t testing.TB, svcs map[string]*v1.Service) {
	t.Helper()
	holders := map[netip.Addr][]*v1.Service{}
	for _, s := range svcs {
		for _, ip := range ingressIPs(t, s) {
			holders[ip] = append(holders[ip], s)
		}
	}
	for ip, hs := range holders {
		if len(hs) < 2 {
			continue
		}
		key := hs[0].Annotations[ccm.AnnotationSharingKey]
		ports := map[string]string{}
		for _, s := range hs {
			if k := s.Annotations[ccm.AnnotationSharingKey]; key == "" || k != key {
				t.Errorf("%s is held by %s/%s and %s/%s, which may not share it", ip, hs[0].Namespace, hs[0].Name, s.Namespace, s.Name)
			}
			for _, p := range s.Spec.Ports {
				pk := fmt.Sprintf("%s/%d", p.Protocol, p.Port)
				if other, clash := ports[pk]; clash {
					t.Errorf("%s port %s is used by both %s and %s/%s", ip, pk, other, s.Namespace, s.Name)
				}
				ports[pk] = s.Namespace + "/" + s.Name
			}
		}
	}
}

// inPool reports whether ip lies in one of mixPools' pools.
func inPool(pool string, ip netip.Addr) bool {
	prefixes := map[string][]string{
		"v4-main": {"10.20.0.0/24", "10.20.1.0/24"}, "v6-main": {"2001:db8:20::/64"},
		"dual": {"10.30.0.0/24", "2001:db8:30::/120"}, "reserved": {"10.40.0.0/27"},
	}
	for _, p := range prefixes[pool] {
		if netip.MustParsePrefix(p).Contains(ip) {
			return true
		}
	}
	return false
}

func familyOf(ip netip.Addr) v1.IPFamily {
	if ip.Is4() {
		return v1.IPv4Protocol
	}
	return v1.IPv6Protocol
}

// TestAllocation: pools plus 200 LoadBalancer Services of every kind all get
// correct VIPs with ipMode Proxy; deleting them releases the addresses.
func TestAllocation(t *testing.T) {
	t.Parallel() // control plane and vipcast-ccm only (see TestMain)
	e := newEnv(t)
	e.mustApplyPools(mixPools)
	e.StartCCM("a")
	e.Namespace("mix", nil)
	svcs, exp := mixedServices("mix", 200)
	e.createAll(svcs, 8)
	e.waitAllAllocated(90*time.Second, "mix", func(s *v1.Service) int { return len(exp[s.Namespace+"/"+s.Name].families) })
	// The pool annotation is written in the background once allocation is
	// quiet; wait for it on every Service.
	var got map[string]*v1.Service
	e.Eventually(60*time.Second, "every Service to carry its pool annotation", func() (bool, error) {
		got = e.ListServices("mix")
		missing := 0
		for _, s := range got {
			if s.Annotations[ccm.AnnotationPool] == "" {
				missing++
			}
		}
		return missing == 0, fmt.Errorf("%d Services without %s", missing, ccm.AnnotationPool)
	})

	sharedIP := map[string]netip.Addr{}
	for key, s := range got {
		want := exp[key]
		ips := ingressIPs(t, s)
		for i, ip := range ips {
			if familyOf(ip) != want.families[i] {
				t.Errorf("%s: ingress[%d] %s is %s, want %s", key, i, ip, familyOf(ip), want.families[i])
			}
			if !inPool(want.pool, ip) {
				t.Errorf("%s: %s is not in pool %s", key, ip, want.pool)
			}
		}
		if want.requested != nil && !equalAddrs(ips, want.requested) {
			t.Errorf("%s: got %v, requested %v", key, ips, want.requested)
		}
		if ann := s.Annotations[ccm.AnnotationPool]; ann != want.pool {
			t.Errorf("%s: annotation %s=%q, want %q", key, ccm.AnnotationPool, ann, want.pool)
		}
		if want.sharingKey != "" {
			if prev, ok := sharedIP[want.sharingKey]; ok && prev != ips[0] {
				t.Errorf("%s: sharing key %s got %s, its partner got %s", key, want.sharingKey, ips[0], prev)
			}
			sharedIP[want.sharingKey] = ips[0]
		}
	}
	checkNoDoubleHolders(t, got)
	e.Eventually(20*time.Second, "pool status to count the addresses in use", func() (bool, error) {
		v4, dual6 := e.poolInUse("v4-main", "ipv4"), e.poolInUse("dual", "ipv6")
		return v4 > 0 && dual6 == 50, fmt.Errorf("v4-main ipv4 in use %d, dual ipv6 in use %d", v4, dual6)
	})

	// Deleting every Service releases every address: the pools drain to
	// zero and a released address can be requested again.
	for key := range got {
		s := got[key]
		if err := e.CP.Client.CoreV1().Services(s.Namespace).Delete(context.Background(), s.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	e.Eventually(60*time.Second, "Services to be gone and pools drained", func() (bool, error) {
		left := len(e.ListServices("mix"))
		total := 0
		for _, pool := range []string{"v4-main", "v6-main", "dual", "reserved"} {
			total += e.poolInUse(pool, "ipv4") + e.poolInUse(pool, "ipv6")
		}
		return left == 0 && total == 0, fmt.Errorf("%d Services left, %d addresses in use", left, total)
	})
	again := e.createService(ccmtest.LBService("mix", "again", withAnnotation(ccm.AnnotationIPs, "10.20.1.100")))
	e.Eventually(30*time.Second, "a released address to be handed out again", func() (bool, error) {
		s, err := e.CP.Client.CoreV1().Services("mix").Get(context.Background(), again.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		ips := ingressIPs(t, s)
		return len(ips) == 1 && ips[0] == netip.MustParseAddr("10.20.1.100"), nil
	})
}

// poolInUse reads status.<family>.inUse of an IPPool (0 if unset).
func (e *env) poolInUse(pool, family string) int {
	u, err := e.CP.Dynamic.Resource(vipcastv1alpha1.IPPoolsResource).Get(context.Background(), pool, metav1.GetOptions{})
	if err != nil {
		if !apierrors.IsNotFound(err) {
			e.T.Logf("reading IPPool %s: %v", pool, err)
		}
		return -1
	}
	n, _, _ := unstructured.NestedInt64(u.Object, "status", family, "inUse")
	return int(n)
}

func equalAddrs(a, b []netip.Addr) bool {
	a, b = append([]netip.Addr(nil), a...), append([]netip.Addr(nil), b...)
	sort.Slice(a, func(i, j int) bool { return a[i].Less(a[j]) })
	sort.Slice(b, func(i, j int) bool { return b[i].Less(b[j]) })
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
