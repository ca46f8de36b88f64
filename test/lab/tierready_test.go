//go:build lab

package lab_test

import (
	"context"
	"encoding/json"
	"net/netip"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/test/lab"
)

// notReadySeries is node1's count of nodes whose speaker it takes as not
// ready (--speaker-service).
const notReadySeries = `vipcast_speaker_tier1_nodes{state="not_ready"}`

// tier1Ready: with two tiers, a node whose speaker does not work gets no
// new flows from the other nodes' tier 1. node2's speaker is frozen
// (SIGSTOP: its readiness probe fails, the kubelet marks the pod not
// ready) and node2's IPIP fallback device taken down, as on a node that
// lacks the tunnel: a flow tier 1 sends there is lost. Until node1 takes
// node2 as not ready, new connections from the client to the demo VIP are
// counted (the control: some must be lost, or nothing here could fail);
// once it does, every new connection must open. node2 is restored at the
// end and node1 takes it back.
func tier1Ready(t *testing.T, l *lab.Lab, vip netip.Addr) {
	ctx := t.Context()
	node1, node2 := l.Nodes[0], l.Nodes[1]
	if len(node1.Pods) == 0 || len(node2.Pods) == 0 {
		t.Fatalf("the demo's pods per node: %v and %v, want some on each", names(node1.Pods), names(node2.Pods))
	}
	addr := netip.AddrPortFrom(vip, 80)
	nodeTunnels(t, l)
	waitNotReady(t, node1, 0, 30*time.Second)

	restore := func() {
		// Bounded: the test's context may be gone already.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if out, err := node2.Exec(ctx, "ip", "link", "set", "tunl0", "up"); err != nil {
			t.Errorf("node2: tunl0 up: %v: %s", err, out)
		}
		if err := node2.Speaker(ctx, "CONT", false); err != nil {
			t.Error(err)
		}
	}
	defer restore()
	start := time.Now()
	if err := node2.Speaker(ctx, "STOP", false); err != nil {
		t.Fatal(err)
	}
	if out, err := node2.Exec(ctx, "ip", "link", "set", "tunl0", "down"); err != nil {
		t.Fatalf("node2: tunl0 down: %v: %s", err, out)
	}

	// The control: node2 still taken as ready.
	lost, tried := 0, 0
	for deadline := start.Add(90 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if v, err := node1.Metric(ctx, notReadySeries); err == nil && v == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node1 did not take node2's frozen speaker as not ready within 90s (%d of %d connections lost meanwhile)", lost, tried)
		}
		tried++
		if !dialed(ctx, l, addr) {
			lost++
		}
	}
	t.Logf("node2's speaker frozen and its tunnel down: node1 took it as not ready %s later; meanwhile %d of %d new connections were lost",
		time.Since(start).Round(time.Millisecond), lost, tried)
	if lost == 0 {
		t.Errorf("no connection lost while node1 still sent new flows to node2 (%d tried): the check below proves nothing", tried)
	}

	// node2 drained: every new connection opens.
	const n = 40
	failed := 0
	for range n {
		if !dialed(ctx, l, addr) {
			failed++
		}
		time.Sleep(50 * time.Millisecond)
	}
	if failed > 0 {
		t.Errorf("%d of %d new connections lost with node2's speaker not ready: tier 1 still sends node2 new flows", failed, n)
	} else {
		t.Logf("node2 not ready: %d of %d new connections opened", n, n)
	}

	restore()
	took := waitNotReady(t, node1, 0, 2*time.Minute)
	t.Logf("node2 restored: node1 took it back after %s", took.Round(time.Millisecond))
}

// waitNotReady waits until node's count of nodes whose speaker is not
// ready is want, and returns how long that took.
func waitNotReady(t *testing.T, node *lab.Node, want float64, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	var v float64
	var err error
	for time.Since(start) < timeout {
		if v, err = node.Metric(t.Context(), notReadySeries); err == nil && v == want {
			return time.Since(start)
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("%s on %s: %v (%v) after %s, want %v", notReadySeries, node.Name, v, err, timeout, want)
	return 0
}

// nodeTunnels: with two tiers, each node's speaker has published its
// node's NodeTunnel through the chart's RBAC and admission policy: its
// address, that it announces, owned by its Node. It logs the size of a
// NodeTunnel and of a Node as the API server sends them (JSON), what a
// write of each costs every speaker watching them.
func nodeTunnels(t *testing.T, l *lab.Lab) {
	ctx := t.Context()
	for _, n := range l.Nodes {
		var u *vipcastv1alpha1.NodeTunnel
		deadline := time.Now().Add(30 * time.Second)
		for {
			obj, err := l.CP.Dynamic.Resource(vipcastv1alpha1.NodeTunnelsResource).Get(ctx, n.Name, metav1.GetOptions{})
			if err == nil {
				u = &vipcastv1alpha1.NodeTunnel{}
				b, _ := json.Marshal(obj.Object)
				if err := json.Unmarshal(b, u); err != nil {
					t.Fatal(err)
				}
				node, err := l.CP.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				nb, _ := json.Marshal(node)
				owned := len(u.OwnerReferences) == 1 && u.OwnerReferences[0].Kind == "Node" && u.OwnerReferences[0].UID == node.UID
				if u.Spec.IPv4 == n.Addr.String() && u.Spec.Announces && owned {
					t.Logf("%s: NodeTunnel %+v, %d bytes as served; its Node %d bytes", n.Name, u.Spec, len(b), len(nb))
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: NodeTunnel %+v (err %v), want ipv4 %s, announces, owned by its Node", n.Name, u, err, n.Addr)
			}
			time.Sleep(time.Second)
		}
	}
}
