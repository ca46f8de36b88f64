//go:build lab

package lab_test

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/vipcast/vipcast/test/lab"
)

// attacks runs, in the real cluster with the chart's two tiers, the
// attacks of the trust issue that need no test-only setup:
//
//   - a host on the fabric that is not a node (the client behind the
//     ToR) sends IPIP packets to node1's address, around a datagram from a
//     forged pod address to one of node1's pods: node1's tunnel guard drops
//     each before decapsulation (its counters grow by as many);
//   - the same host sends BFD control packets to node1's BFD ports and
//     opens a connection to its metrics port: node1's host guard drops
//     them (vipcast_ipvs_guard_dropped_packets_total{reason="bfd"} and
//     {reason="metrics"} grow), while the ToR, a BFD peer and an allowed
//     metrics source, keeps its BFD session and reads the metrics;
//   - a tenant's ServiceAccount with the cluster's own `edit` role on the
//     demo namespace sets vipcast.io/allocated-from-pool on the demo
//     Service: the chart's admission policy denies it, naming the
//     annotation, while the same tenant may set another annotation (RBAC
//     alone does not refuse it).
func attacks(t *testing.T, l *lab.Lab) {
	t.Run("forged IPIP", func(t *testing.T) { forgedIPIP(t, l) })
	t.Run("stranger to BFD and metrics", func(t *testing.T) { strangerToHostPorts(t, l) })
	t.Run("tenant sets the pool record", func(t *testing.T) { tenantPoolRecord(t, l) })
}

func strangerToHostPorts(t *testing.T, l *lab.Lab) {
	node1, client := l.Nodes[0], netip.MustParseAddr("192.168.50.2")
	// BFD on for the attack (fabric turned it off): the guard's BFD rule
	// is there while the node runs BFD sessions. Off again after, as the
	// scenarios that follow expect.
	if err := l.SetPeerBFD(t.Context(), true); err != nil {
		t.Fatal(err)
	}
	defer bfdOff(t, l)
	if err := l.ToR.WaitBFDUp(node1.Addr, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	const bfdDrops, metricsDrops = `vipcast_ipvs_guard_dropped_packets_total{reason="bfd"}`, `vipcast_ipvs_guard_dropped_packets_total{reason="metrics"}`
	metric := func(series string) float64 {
		t.Helper()
		v, err := node1.Metric(t.Context(), series) // from the ToR, an allowed source
		if err != nil {
			t.Fatalf("%s: reading %s from the ToR: %v", node1.Name, series, err)
		}
		return v
	}
	bfdBefore, metricsBefore := metric(bfdDrops), metric(metricsDrops)
	// A BFD Control packet (version 1, Down, detect multiplier 3, length
	// 24) with Your Discriminator 0, from a host that is no BFD peer.
	bfd := []byte{0x20, 0x40, 3, 24, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0x0f, 0x42, 0x40, 0, 0x0f, 0x42, 0x40, 0, 0, 0, 0}
	const sent = 5
	for _, port := range []uint16{3784, 4784} {
		for range sent {
			if err := l.ClientNS.SpoofUDP(netip.AddrPortFrom(client, 49152), netip.AddrPortFrom(node1.Addr, port), 255, bfd); err != nil {
				t.Fatal(err)
			}
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	if c, err := l.ClientNS.DialContext(ctx, "tcp", net.JoinHostPort(node1.Addr.String(), lab.MetricsPort)); err == nil {
		c.Close()
		t.Errorf("the client, not an allowed metrics source, connected to %s's metrics port", node1.Name)
	}
	var bfdGot, metricsGot float64
	for range 20 {
		if bfdGot, metricsGot = metric(bfdDrops)-bfdBefore, metric(metricsDrops)-metricsBefore; bfdGot >= 2*sent && metricsGot >= 1 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if bfdGot < 2*sent || metricsGot < 1 {
		t.Errorf("%s's host guard dropped %v of %d BFD packets and %v metrics connection attempts from the client", node1.Name, bfdGot, 2*sent, metricsGot)
	} else {
		t.Logf("%s's host guard dropped %v BFD packets (of %d) and %v packets to the metrics port from the client", node1.Name, bfdGot, 2*sent, metricsGot)
	}
	if p, err := l.ToR.BFDPeer(node1.Addr); err != nil || p.Status != "up" {
		t.Errorf("the ToR's BFD session with %s: %+v, %v; want up", node1.Name, p, err)
	}
	if st, err := l.ToR.Neighbor(node1.Addr); err != nil || st.State != "Established" {
		t.Errorf("the ToR's session with %s: %+v, %v; want Established", node1.Name, st, err)
	}
}

// bfdOff turns BFD off in the lab's BGPPeer and waits until the ToR's BFD
// sessions are no longer up and its BGP sessions with every node are
// Established again (FRR's bgpd restarts them when BFD goes AdminDown).
func bfdOff(t *testing.T, l *lab.Lab) {
	ctx := context.Background()
	if err := l.SetPeerBFD(ctx, false); err != nil {
		t.Fatal(err)
	}
	for _, n := range l.Nodes {
		if err := waitBFDNotUp(ctx, l, n.Addr); err != nil {
			t.Fatal(err)
		}
	}
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		for _, n := range l.Nodes {
			st, err := l.ToR.Neighbor(n.Addr)
			if err != nil {
				return false, err
			}
			if st.State != "Established" {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("the ToR's sessions with the nodes not Established a minute after BFD was turned off: %v", err)
	}
}

// guardDrops is node n's tunnel guard's count of dropped packets
// (nodeapi.State.GuardDrops).
func guardDrops(t *testing.T, n *lab.Node) int64 {
	t.Helper()
	st, err := n.State(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if st.GuardDrops < 0 {
		t.Fatalf("%s: no drop rule in the tunnel guard (tables %v)", n.Name, st.Tables)
	}
	return st.GuardDrops
}

func forgedIPIP(t *testing.T, l *lab.Lab) {
	node1 := l.Nodes[0]
	if len(node1.Pods) == 0 {
		t.Fatalf("no demo pod on %s", node1.Name)
	}
	pod := netip.AddrPortFrom(node1.Pods[0].Addr, 8080)
	forged := netip.AddrPortFrom(netip.MustParseAddr("10.244.200.9"), 5353)
	const sent = 10
	before := guardDrops(t, node1)
	for range sent {
		if err := l.ClientNS.SpoofIPIP(netip.MustParseAddr("192.168.50.2"), node1.Addr, forged, pod, []byte("forged")); err != nil {
			t.Fatal(err)
		}
	}
	// The counters are read after the packets crossed the ToR: poll briefly.
	var after int64
	for range 20 {
		if after = guardDrops(t, node1); after-before >= sent {
			break
		}
	}
	if after-before < sent {
		t.Errorf("%s's tunnel guard dropped %d of %d IPIP packets from the client, a host that is not a node", node1.Name, after-before, sent)
	} else {
		t.Logf("%s's tunnel guard dropped %d packets for %d forged IPIP packets from the client", node1.Name, after-before, sent)
	}
}

func tenantPoolRecord(t *testing.T, l *lab.Lab) {
	ctx := t.Context()
	admin := l.CP.Client
	const sa = "tenant"
	ns := lab.DemoNamespace
	if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "tenant-edit"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "edit"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: ns}},
	}
	if _, err := admin.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_ = admin.RbacV1().RoleBindings(ns).Delete(ctx, rb.Name, metav1.DeleteOptions{})
		_ = admin.CoreV1().ServiceAccounts(ns).Delete(ctx, sa, metav1.DeleteOptions{})
		_, _ = admin.CoreV1().Services(ns).Patch(ctx, lab.DemoService, types.MergePatchType,
			[]byte(`{"metadata":{"annotations":{"example.com/tenant":null}}}`), metav1.PatchOptions{})
	})
	cfg := rest.CopyConfig(l.CP.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":" + sa}
	tenant, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	patch := func(p string) error {
		_, err := tenant.CoreV1().Services(ns).Patch(ctx, lab.DemoService, types.MergePatchType, []byte(p), metav1.PatchOptions{})
		return err
	}
	// The control: the tenant edits its Service (RBAC lets it, once the
	// API server's authorizer, which follows RoleBindings through a
	// watch, has the new one: seen forbidden 70 ms after its creation).
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		err := patch(`{"metadata":{"annotations":{"example.com/tenant":"x"}}}`)
		if err == nil {
			break
		}
		if !apierrors.IsForbidden(err) || time.Now().After(deadline) {
			t.Fatalf("tenant with edit could not annotate its own Service: %v", err)
		}
	}
	before, err := admin.CoreV1().Services(ns).Get(ctx, lab.DemoService, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	const record = "vipcast.io/allocated-from-pool"
	err = patch(`{"metadata":{"annotations":{"` + record + `":"some-other-pool"}}}`)
	if err == nil || !strings.Contains(err.Error(), record) {
		t.Errorf("tenant set %s: err = %v, want a denial naming it", record, err)
	} else {
		t.Logf("tenant denied: %v", err)
	}
	after, err := admin.CoreV1().Services(ns).Get(ctx, lab.DemoService, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if after.Annotations[record] != before.Annotations[record] {
		t.Errorf("%s went from %q to %q", record, before.Annotations[record], after.Annotations[record])
	}
}
