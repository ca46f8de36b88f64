//go:build controlplane || routing

package e2e

// Helpers shared by this package's controlplane tests and its routing
// tests (the speaker against FRR and BIRD, which need the API server too).

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/test/ccmtest"
)

const classPool = `apiVersion: vipcast.io/v1alpha1
kind: IPPool
metadata: {name: vips}
spec:
  addresses: ["10.100.0.0/24"]`

// foreignIP is an address another load-balancer implementation publishes:
// in no vipcast pool.
const foreignIP = "198.51.100.7"

func inVIPs(ips []string) bool {
	if len(ips) != 1 {
		return false
	}
	ip, err := netip.ParseAddr(ips[0])
	return err == nil && netip.MustParsePrefix("10.100.0.0/24").Contains(ip)
}

func withLocal() ccmtest.ServiceOption {
	return func(s *v1.Service) { s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal }
}

func lbStatusFor(ip string) *v1.LoadBalancerStatus {
	mode := v1.LoadBalancerIPModeProxy
	return &v1.LoadBalancerStatus{Ingress: []v1.LoadBalancerIngress{{IP: ip, IPMode: &mode}}}
}

// getPool reads an IPPool; nil when it does not exist.
func (e *env) getPool(name string) *unstructured.Unstructured {
	e.T.Helper()
	u, err := e.CP.Dynamic.Resource(vipcastv1alpha1.IPPoolsResource).Get(context.Background(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		e.T.Fatalf("reading IPPool %s: %v", name, err)
	}
	return u
}

// patchPool applies a JSON merge patch to an IPPool.
func (e *env) patchPool(name, patch string) {
	e.T.Helper()
	if _, err := e.CP.Dynamic.Resource(vipcastv1alpha1.IPPoolsResource).Patch(context.Background(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		e.T.Fatalf("patching IPPool %s: %v", name, err)
	}
}

// poolCondition returns an IPPool's condition of type typ.
func (e *env) poolCondition(name, typ string) (status, reason, message string) {
	u := e.getPool(name)
	if u == nil {
		return "", "", "no such pool"
	}
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == typ {
			return fmt.Sprint(m["status"]), fmt.Sprint(m["reason"]), fmt.Sprint(m["message"])
		}
	}
	return "", "", "no " + typ + " condition"
}

// waitVIP waits until the Service has exactly one VIP and returns it.
func (e *env) waitVIP(ns, name string) netip.Addr {
	e.T.Helper()
	var vip netip.Addr
	e.Eventually(60*time.Second, fmt.Sprintf("a VIP for %s/%s", ns, name), func() (bool, error) {
		ips := e.serviceVIPs(ns, name)
		if len(ips) != 1 {
			return false, fmt.Errorf("VIPs %v", ips)
		}
		vip = ips[0]
		return true, nil
	})
	return vip
}

// consistently checks cond every 200ms for d; the first failure fails the
// test.
func (e *env) consistently(d time.Duration, what string, cond func() error) {
	e.T.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if err := cond(); err != nil {
			e.T.Fatalf("%s: %v", what, err)
		}
	}
}

// keepsVIP checks for d that the Service's only VIP is still vip.
func (e *env) keepsVIP(d time.Duration, ns, name string, vip netip.Addr) {
	e.T.Helper()
	e.consistently(d, fmt.Sprintf("%s/%s keeping VIP %s", ns, name, vip), func() error {
		if got := e.serviceVIPs(ns, name); !slices.Equal(got, []netip.Addr{vip}) {
			return fmt.Errorf("VIPs now %v", got)
		}
		return nil
	})
}

// touchService adds a label to a Service so the service controller calls
// EnsureLoadBalancer again.
func (e *env) touchService(ns, name, value string) {
	e.T.Helper()
	patch := fmt.Sprintf(`{"metadata":{"labels":{"touched":%q}}}`, value)
	if _, err := e.CP.Client.CoreV1().Services(ns).Patch(context.Background(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		e.T.Fatalf("patching Service %s/%s: %v", ns, name, err)
	}
}

// writeStatus writes ips into the Service's status, as another controller
// would.
func (e *env) writeStatus(ns, name string, ips ...string) {
	e.T.Helper()
	ctx := context.Background()
	svc, err := e.CP.Client.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		e.T.Fatal(err)
	}
	svc.Status.LoadBalancer.Ingress = nil
	for _, ip := range ips {
		svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, v1.LoadBalancerIngress{IP: ip})
	}
	if _, err := e.CP.Client.CoreV1().Services(ns).UpdateStatus(ctx, svc, metav1.UpdateOptions{}); err != nil {
		e.T.Fatalf("status of %s/%s: %v", ns, name, err)
	}
}

// patchService applies a JSON merge patch to a Service.
func (e *env) patchService(ns, name, patch string) {
	e.T.Helper()
	if _, err := e.CP.Client.CoreV1().Services(ns).Patch(context.Background(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		e.T.Fatalf("patching Service %s/%s with %s: %v", ns, name, patch, err)
	}
}

// waitStatus waits until the Service's status satisfies ok.
func (e *env) waitStatus(ns, name, what string, ok func([]string) bool) []string {
	e.T.Helper()
	var got []string
	e.Eventually(30*time.Second, fmt.Sprintf("%s/%s status %s", ns, name, what), func() (bool, error) {
		got = e.statusOf(ns, name)
		return ok(got), fmt.Errorf("status %v", got)
	})
	return got
}

// waitEvent waits for a SyncLoadBalancerFailed Event on the Service whose
// message contains every one of want.
func (e *env) waitEvent(ns, name string, want ...string) {
	e.T.Helper()
	e.waitEventReason(ns, name, v1.EventTypeWarning, "SyncLoadBalancerFailed", want...)
}

// waitEventReason waits for an Event of type and reason on the object
// called name (cluster-scoped objects' Events are in "default") whose
// message contains every one of want.
func (e *env) waitEventReason(ns, name, typ, reason string, want ...string) {
	e.T.Helper()
	var seen []string
	e.Eventually(60*time.Second, fmt.Sprintf("an Event on %s/%s mentioning %q", ns, name, want), func() (bool, error) {
		evs, err := e.CP.Client.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{
			FieldSelector: "involvedObject.name=" + name,
		})
		if err != nil {
			return false, err
		}
		seen = seen[:0]
		for _, ev := range evs.Items {
			seen = append(seen, ev.Reason+": "+ev.Message)
			if ev.Reason != reason || ev.Type != typ {
				continue
			}
			ok := true
			for _, w := range want {
				ok = ok && strings.Contains(ev.Message, w)
			}
			if ok {
				e.T.Logf("%s/%s: %s", ns, name, ev.Message)
				return true, nil
			}
		}
		return false, fmt.Errorf("events so far: %q", seen)
	})
}

// runWorkers calls fn(0..n-1) from workers goroutines and fails on error.
func (e *env) runWorkers(n, workers int, fn func(int) error) {
	e.T.Helper()
	next := make(chan int)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := fn(i); err != nil {
					errs <- err
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		e.T.Fatal(err)
	}
}

// waitPeerSessions waits until the BGPPeer's status counts nodes with the
// session and established of them Established.
func (e *env) waitPeerSessions(peer string, nodes, established int64) {
	e.T.Helper()
	e.Eventually(30*time.Second, fmt.Sprintf("BGPPeer %s counting %d nodes, %d Established", peer, nodes, established), func() (bool, error) {
		u, err := e.CP.Dynamic.Resource(vipcastv1alpha1.BGPPeersResource).Get(context.Background(), peer, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		n, _, _ := unstructured.NestedInt64(u.Object, "status", "nodes")
		up, _, _ := unstructured.NestedInt64(u.Object, "status", "nodesEstablished")
		return n == nodes && up == established, fmt.Errorf("nodes %d, nodesEstablished %d", n, up)
	})
}

// peerDoc is the YAML of a BGPPeer towards a loopback router; the speaker
// connects from 127.0.0.2. extra is appended to spec (indented two spaces).
func peerDoc(name string, addr netip.Addr, port int, peerASN, localASN uint32, extra string) string {
	return fmt.Sprintf(`apiVersion: vipcast.io/v1alpha1
kind: BGPPeer
metadata:
  name: %s
spec:
  peerAddress: %s
  port: %d
  peerASN: %d
  localASN: %d
  sourceAddress: 127.0.0.2
  holdTime: 9s
  keepaliveTime: 3s
%s`, name, addr, port, peerASN, localASN, extra)
}

// applyObject creates a vipcast object (IPPool or BGPPeer) from YAML.
func (e *env) applyPeer(doc string) {
	e.T.Helper()
	if _, err := e.CP.Dynamic.Resource(vipcastv1alpha1.BGPPeersResource).Create(context.Background(), mustUnstructured(e.T, doc), metav1.CreateOptions{}); err != nil {
		e.T.Fatalf("creating BGPPeer: %v", err)
	}
}

// waitPeerReady waits until a BGPPeer's Ready condition has status and
// reason and its message contains every want.
func (e *env) waitPeerReady(name, status, reason string, want ...string) {
	e.T.Helper()
	e.Eventually(30*time.Second, fmt.Sprintf("BGPPeer %s to be Ready=%s (%s)", name, status, reason), func() (bool, error) {
		u, err := e.CP.Dynamic.Resource(vipcastv1alpha1.BGPPeersResource).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if m["type"] != vipcastv1alpha1.ConditionReady {
				continue
			}
			msg := fmt.Sprint(m["message"])
			ok := m["status"] == status && m["reason"] == reason
			for _, w := range want {
				ok = ok && strings.Contains(msg, w)
			}
			return ok, fmt.Errorf("Ready=%v reason=%v message=%q", m["status"], m["reason"], msg)
		}
		return false, errors.New("no Ready condition")
	})
}

// serviceVIPs returns a Service's published VIPs.
func (e *env) serviceVIPs(ns, name string) []netip.Addr {
	e.T.Helper()
	s, err := e.CP.Client.CoreV1().Services(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		e.T.Fatalf("reading Service %s/%s: %v", ns, name, err)
	}
	return ingressIPs(e.T, s)
}

// statusOf returns the status addresses of a Service.
func (e *env) statusOf(ns, name string) []string {
	e.T.Helper()
	svc, err := e.CP.Client.CoreV1().Services(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		e.T.Fatal(err)
	}
	var out []string
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		out = append(out, ing.IP)
	}
	return out
}
