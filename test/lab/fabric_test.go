//go:build lab

package lab_test

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/test/harness"
	"github.com/vipcast/vipcast/test/lab"
	"github.com/vipcast/vipcast/test/lab/nodeapi"
	"github.com/vipcast/vipcast/test/routers"
)

// fabric is the fabric's view of a Service's life in the real cluster,
// with lab.HeldService, whose endpoints the test writes over the demo
// Deployment's pods, one then two per node:
//
//   - Service created → VIP in status → ECMP route over both nodes at the
//     ToR → the BGPPeer Ready → every endpoint answers the client, through
//     both nodes;
//   - endpoints added and removed: IPVS follows, removed pods never answer;
//   - Local: each node forwards to its own endpoints only and the backend
//     sees the client's address; a node without one withdraws, keeps its
//     virtual server without real servers (stray packets are refused, not
//     forwarded), and `kubectl vipcast why` says why;
//   - SIGTERM on node1's speaker: its next hop leaves the ToR's kernel
//     within a second, traffic carries on through node2, and node1 is back
//     once the kubelet has started its speaker again;
//   - BFD (300ms x 3, FRR's bfdd) turned on in the BGPPeer: the whole VM of
//     node2 frozen bfdTrials times, and its speaker frozen bfdTrials times:
//     each time its next hop leaves the ToR's route through BFD, not the
//     hold timer, and node1's BFD session never goes down meanwhile; BFD
//     turned off again;
//   - the Service deleted: the route goes, and each node's IPVS and dummy
//     link hold nothing of its VIP.
func fabric(t *testing.T, l *lab.Lab) {
	ctx := t.Context()
	node1, node2 := l.Nodes[0], l.Nodes[1]
	pods1, pods2 := node1.Pods, node2.Pods
	if len(pods1) < 2 || len(pods2) < 2 {
		t.Fatalf("the demo's pods per node: %v and %v, want two on each", names(pods1), names(pods2))
	}

	// Service created → VIP in status → ECMP route at the ToR → traffic.
	ready := []lab.Pod{pods1[0], pods2[0]}
	start := time.Now()
	vip, err := l.ApplyHeld(ctx, ready)
	if err != nil {
		t.Fatal(err)
	}
	if !lab.PoolPrefix.Contains(vip) {
		t.Fatalf("VIP %s is outside the pool %s", vip, lab.PoolPrefix)
	}
	published := time.Since(start)
	took := waitRoute(t, l, vip, 2*time.Minute, node1, node2)
	t.Logf("VIP %s published %v after the Service was created; ECMP route over both nodes at the ToR %v after that", vip, published.Round(time.Millisecond), took.Round(time.Millisecond))
	checkPeerReady(t, l)
	addr := netip.AddrPortFrom(vip, 80)
	reach(t, l, addr, ready, nil)
	for _, n := range []*lab.Node{node1, node2} {
		waitIPVS(t, n, vip, backendsOf(ready...))
	}
	throughBoth(t, l, addr)

	// More endpoints, then fewer: two per node, then the other one of
	// each node.
	all := []lab.Pod{pods1[0], pods1[1], pods2[0], pods2[1]}
	setEndpoints(t, l, all, nil)
	for _, n := range []*lab.Node{node1, node2} {
		waitIPVS(t, n, vip, backendsOf(all...))
	}
	reach(t, l, addr, all, nil)
	few := []lab.Pod{pods1[1], pods2[1]}
	setEndpoints(t, l, few, nil)
	for _, n := range []*lab.Node{node1, node2} {
		waitIPVS(t, n, vip, backendsOf(few...))
	}
	reach(t, l, addr, few, all)

	// Local: each node forwards to its own endpoint only and the backend
	// sees the client's address; a node without one withdraws.
	patchService(t, l, lab.HeldService, `{"spec":{"externalTrafficPolicy":"Local"}}`)
	waitIPVS(t, node1, vip, backendsOf(pods1[1]))
	waitIPVS(t, node2, vip, backendsOf(pods2[1]))
	for i := range 10 {
		body, err := l.Get(ctx, addr)
		if err != nil {
			t.Fatalf("request %d through %s with Local: %v", i, addr, err)
		}
		if !strings.HasSuffix(body, "client 192.168.50.2") {
			t.Fatalf("with externalTrafficPolicy Local the backend saw %q, want the client's own address 192.168.50.2", body)
		}
	}
	setEndpoints(t, l, []lab.Pod{pods1[1]}, nil)
	took = waitRoute(t, l, vip, 30*time.Second, node1)
	t.Logf("Local, no endpoint left on node2: its next hop left the ToR in %v", took.Round(time.Millisecond))
	waitIPVS(t, node2, vip, nil) // kept without real servers: stray packets are refused, not forwarded
	reach(t, l, addr, []lab.Pod{pods1[1]}, nil)
	whyLocal(t, l, vip)
	// In-cluster clients with one tier: under Local, with every endpoint
	// on the other node, a pod on a node without one (its address in the
	// chart's speaker.ipvs.clusterCIDRs) reaches the VIP by the in-cluster
	// map, as with two tiers (contract) it does through tier 1.
	t.Run("LocalInCluster", func(t *testing.T) { localInCluster(t, l, vip) })

	// Back to Cluster with two endpoints per node.
	patchService(t, l, lab.HeldService, `{"spec":{"externalTrafficPolicy":"Cluster"}}`)
	setEndpoints(t, l, all, nil)
	waitRoute(t, l, vip, 30*time.Second, node1, node2)
	for _, n := range []*lab.Node{node1, node2} {
		waitIPVS(t, n, vip, backendsOf(all...))
	}

	// The Service contract with one tier, as contract checks it with
	// two: one client's new connections through both nodes reach one pod
	// under sessionAffinity ClientIP (each node's IPVS persistence, mh
	// without the port); a UDP flow whose endpoint goes away reaches
	// another pod (expire_nodest_conn).
	t.Run("ClientIP", func(t *testing.T) { clientIPAffinity(t, l, addr) })
	t.Run("StaleUDP", func(t *testing.T) { staleUDP(t, l, netip.AddrPortFrom(vip, 53), all) })
	setEndpoints(t, l, all, nil)
	for _, n := range []*lab.Node{node1, node2} {
		waitIPVS(t, n, vip, backendsOf(all...))
	}

	// SIGTERM on node1's speaker: its next hop goes at once and traffic
	// carries on through node2; the kubelet starts it again. How fast is
	// logged, not asserted (it is the emulated node's speed, seen at 1.5 s
	// on a loaded CI machine); what is asserted is that the speaker's
	// withdrawal, not the hold timer, removed it.
	start = time.Now()
	if err := node1.Speaker(ctx, "TERM", false); err != nil {
		t.Fatal(err)
	}
	took = waitRoute(t, l, vip, 10*time.Second, node2)
	sent := time.Since(start) - took
	t.Logf("SIGTERM on node1's speaker: next hop gone from the ToR kernel %v later (signal delivery into the VM %v)", took.Round(time.Millisecond), sent.Round(time.Millisecond))
	if took >= l.Opts.HoldTime/2 {
		t.Errorf("next hop removed %v after SIGTERM: the hold timer (%v), not the speaker's withdrawal, removed it", took, l.Opts.HoldTime)
	}
	reach(t, l, addr, all, nil)
	if err := node1.Speaker(ctx, "start", false); err != nil {
		t.Fatal(err)
	}
	took = waitRoute(t, l, vip, time.Minute, node1, node2)
	t.Logf("node1's speaker, started again by the kubelet, is back at the ToR %v later", took.Round(time.Millisecond))

	// A frozen node, the whole VM and then only its speaker: BFD takes it
	// out of the ToR's ECMP route within 300ms x 3, far inside the hold
	// time, and it comes back when it thaws.
	if err := l.SetPeerBFD(ctx, true); err != nil {
		t.Fatal(err)
	}
	for _, n := range []*lab.Node{node1, node2} {
		if err := l.ToR.WaitBFDUp(n.Addr, 2*time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	node1BFD, err := l.ToR.BFDPeer(node1.Addr)
	if err != nil {
		t.Fatal(err)
	}
	frozenTrials(t, l, vip, "the whole VM (SIGSTOP of qemu)", node2.Freeze, node2.Thaw)
	frozenTrials(t, l, vip, "its speaker (SIGSTOP)",
		func() error { return node2.Speaker(ctx, "STOP", false) },
		func() error { return node2.Speaker(ctx, "CONT", false) })
	// Emulated VMs keep 300ms x 3: node1's session never went down
	// meanwhile.
	if p, err := l.ToR.BFDPeer(node1.Addr); err != nil || p.SessionDownEvents != node1BFD.SessionDownEvents {
		t.Errorf("node1's BFD session at the ToR: %+v, %v; want no down event since %+v", p, err, node1BFD)
	}
	// BFD off again: the speakers take the sessions AdminDown, which FRR
	// 8.4's bgpd counts as a failure all the same (test/e2e
	// TestSpeakerFabricBFD; docs/routers.md: remove BFD on the router first),
	// so the BGP sessions start again without BFD.
	if err := l.SetPeerBFD(ctx, false); err != nil {
		t.Fatal(err)
	}
	for _, n := range []*lab.Node{node1, node2} {
		if err := waitBFDNotUp(ctx, l, n.Addr); err != nil {
			t.Fatal(err)
		}
	}
	took = waitRoute(t, l, vip, time.Minute, node1, node2)
	t.Logf("BFD off in the BGPPeer: both nodes back in the ToR's route %v after their BFD sessions went down", took.Round(time.Millisecond))

	// The Service goes: the route goes, and each node's IPVS and dummy
	// link hold nothing of its VIP.
	if err := l.DeleteHeld(ctx); err != nil {
		t.Fatal(err)
	}
	waitRoute(t, l, vip, 30*time.Second)
	for _, n := range []*lab.Node{node1, node2} {
		waitGone(t, n, vip)
	}
}

// whyLocal checks what `kubectl vipcast why` (the real kubectl and the
// lab's plugin) says of lab.HeldService while it is Local with an
// endpoint on node1 only: node1 announces the VIP with its next hop, node2
// does not and says why.
func whyLocal(t *testing.T, l *lab.Lab, vip netip.Addr) {
	t.Helper()
	node1, node2 := l.Nodes[0], l.Nodes[1]
	svc := lab.DemoNamespace + "/" + lab.HeldService
	const reason = "externalTrafficPolicy Local and no ready endpoint on this node"
	var out string
	deadline := time.Now().Add(30 * time.Second)
	for {
		var err error
		out, err = l.Kubectl(t.Context(), "vipcast", "why", svc)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(out, "\n")
		// has reports whether node's row holds every part.
		has := func(node string, parts ...string) bool {
			for _, line := range lines {
				if f := strings.Fields(line); len(f) == 0 || f[0] != node {
					continue
				}
				ok := true
				for _, p := range parts {
					ok = ok && strings.Contains(line, p)
				}
				if ok {
					return true
				}
			}
			return false
		}
		if has(node1.Name, vip.String()+"/32", node1.Addr.String()) && has(node2.Name, reason) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("kubectl vipcast why %s 30s after node2 lost its endpoint:\n%s", svc, out)
		}
		time.Sleep(time.Second)
	}
	t.Logf("kubectl vipcast why %s (Local, endpoint on node1 only):\n%s", svc, out)
}

// bfdTrials is how many times frozenTrials freezes a node: each trial
// takes about 3.4 s of the suite, and every one must go through BFD.
// The distribution is make bench's (50 trials in the namespace tier);
// here the trials show that BFD, not the hold timer, removes a frozen
// node of a real cluster.
const bfdTrials = 5

// waitBFDNotUp waits until the ToR's BFD session with addr has left Up,
// its peer having said it went administratively down.
func waitBFDNotUp(ctx context.Context, l *lab.Lab, addr netip.Addr) error {
	var p routers.BFDPeer
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		var err error
		p, err = l.ToR.BFDPeer(addr)
		return err == nil && p.Status != "up", nil
	})
	if err != nil {
		return fmt.Errorf("the ToR's BFD session with %s: %+v 20s after BFD was turned off in the BGPPeer", addr, p)
	}
	if p.RemoteDiagnostic != "administratively down" {
		return fmt.Errorf("the ToR's BFD session with %s went %s with remote diagnostic %q, want administratively down", addr, p.Status, p.RemoteDiagnostic)
	}
	return nil
}

// frozenTrials freezes node2 bfdTrials times with freeze and thaws it with
// thaw, and reports how long its next hop took to leave the ToR's route
// to vip after each freeze, next to the target (detection time + 100 ms)
// and the hold time. The figures are reported, not asserted; what is
// asserted is that BFD, not the hold timer, removed the node.
func frozenTrials(t *testing.T, l *lab.Lab, vip netip.Addr, what string, freeze, thaw func() error) {
	t.Helper()
	node1, node2 := l.Nodes[0], l.Nodes[1]
	b := l.Opts.BFD
	target := time.Duration(b.Multiplier)*b.MinTx + 100*time.Millisecond
	var took []time.Duration
	for range bfdTrials {
		if err := l.ToR.WaitBFDUp(node2.Addr, 2*time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := freeze(); err != nil {
			t.Fatal(err)
		}
		d := waitRoute(t, l, vip, l.Opts.HoldTime+10*time.Second, node1)
		took = append(took, d)
		if err := thaw(); err != nil {
			t.Fatal(err)
		}
		if d >= l.Opts.HoldTime/2 {
			t.Errorf("frozen %s left the ToR's route after %v: the hold timer (%v), not BFD, removed it", what, d, l.Opts.HoldTime)
		}
		waitRoute(t, l, vip, 2*time.Minute, node1, node2)
	}
	t.Logf("node2 frozen, %s: its next hop left the ToR's route after %s (BFD %v x %d; hold time %v)",
		what, harness.Distribution(took, target), b.MinTx, b.Multiplier, l.Opts.HoldTime)
}

func waitRoute(t *testing.T, l *lab.Lab, vip netip.Addr, timeout time.Duration, nodes ...*lab.Node) time.Duration {
	t.Helper()
	took, err := l.WaitRoute(t.Context(), vip, timeout, l.Addrs(nodes...)...)
	if err != nil {
		t.Fatalf("%v\n%s", err, routeDiagnosis(t.Context(), l, vip, nodes))
	}
	return took
}

// routeDiagnosis says, for a route to vip that did not come as wanted,
// how the ToR sees the session of each wanted node missing from it and
// what that node's speaker logged last (its newest run): the last lines
// of a failure are what CI's summary quotes.
func routeDiagnosis(ctx context.Context, l *lab.Lab, vip netip.Addr, nodes []*lab.Node) string {
	got, err := l.Routes(netip.PrefixFrom(vip, 32))
	if err != nil {
		return fmt.Sprintf("the ToR's route to %s: %v", vip, err)
	}
	var b strings.Builder
	for _, n := range nodes {
		if slices.Contains(got, n.Addr) {
			continue
		}
		s, err := l.ToR.Neighbor(n.Addr)
		fmt.Fprintf(&b, "the ToR's session with %s: %+v %v\n", n.Name, s, err)
		out, err := n.Exec(ctx, "sh", "-c", "tail -n 12 \"$(ls -t "+lab.SpeakerLogFiles+" | head -n 1)\"")
		fmt.Fprintf(&b, "%s's speaker, the last lines of its newest run: %v\n%s", n.Name, err, out)
	}
	return b.String()
}

// checkNodesInitialized: vipcast-ccm removed the uninitialized taint and
// set the provider ID.
func checkNodesInitialized(t *testing.T, l *lab.Lab) {
	t.Helper()
	for _, n := range l.Nodes {
		var node *v1.Node
		deadline := time.Now().Add(30 * time.Second)
		for {
			var err error
			node, err = l.CP.Client.CoreV1().Nodes().Get(t.Context(), n.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			initialized := node.Spec.ProviderID == "vipcast://"+n.Name && !slices.ContainsFunc(node.Spec.Taints, func(tt v1.Taint) bool {
				return tt.Key == "node.cloudprovider.kubernetes.io/uninitialized"
			})
			if initialized {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %s not initialized by vipcast-ccm: providerID %q, taints %v", n.Name, node.Spec.ProviderID, node.Spec.Taints)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

func setEndpoints(t *testing.T, l *lab.Lab, ready, terminating []lab.Pod) {
	t.Helper()
	if err := l.SetEndpoints(t.Context(), ready, terminating); err != nil {
		t.Fatal(err)
	}
}

func patchService(t *testing.T, l *lab.Lab, name, patch string) {
	t.Helper()
	if _, err := l.CP.Client.CoreV1().Services(lab.DemoNamespace).Patch(t.Context(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// reach sends requests through addr from the client until every pod in want
// has answered (at most 100), with no failed request and no answer from a
// pod outside want (such as one in gone).
func reach(t *testing.T, l *lab.Lab, addr netip.AddrPort, want, gone []lab.Pod) {
	t.Helper()
	wantSet := map[string]bool{}
	for _, p := range want {
		wantSet[p.Name] = true
	}
	seen := map[string]int{}
	for i := 0; i < 100 && len(seen) < len(wantSet); i++ {
		body, err := l.Get(t.Context(), addr)
		if err != nil {
			t.Fatalf("request %d through %s: %v (answers so far %v)", i, addr, err, seen)
		}
		name, _, _ := strings.Cut(body, " ")
		if !wantSet[name] {
			t.Fatalf("request %d through %s answered by %q, want one of %v (gone: %v)", i, addr, body, slices.Sorted(maps.Keys(wantSet)), names(gone))
		}
		seen[name]++
	}
	if len(seen) < len(wantSet) {
		t.Fatalf("after 100 requests through %s only %v answered, want all of %v", addr, seen, slices.Sorted(maps.Keys(wantSet)))
	}
	t.Logf("through %s: %v", addr, seen)
}

func names(pods []lab.Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Name)
	}
	return out
}

// backendsOf renders pods as the node agent lists real servers.
func backendsOf(pods ...lab.Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, netip.AddrPortFrom(p.Addr, nodeapi.BackendPort).String()+" w1")
	}
	slices.Sort(out)
	return out
}

// waitIPVS waits until n has vip on its dummy link and a virtual server for
// vip:80 with exactly backends (none: it refuses new connections, as a node
// without a local endpoint under externalTrafficPolicy Local does).
func waitIPVS(t *testing.T, n *lab.Node, vip netip.Addr, backends []string) {
	t.Helper()
	key := netip.AddrPortFrom(vip, 80).String() + "/TCP"
	var last nodeapi.State
	var err error
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		if last, err = n.State(ctx); err == nil {
			var got []string
			found := false
			for _, s := range last.Services {
				if s.Key == key {
					got, found = s.Backends, true
				}
			}
			if found && slices.Equal(got, backends) && slices.Contains(last.VIPs, vip.String()) {
				return
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s: IPVS %+v (err %v), want %s with %v", n.Name, last, err, key, backends)
}

// waitGone waits until n has no virtual server and no address of vip.
func waitGone(t *testing.T, n *lab.Node, vip netip.Addr) {
	t.Helper()
	var last nodeapi.State
	var err error
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if last, err = n.State(t.Context()); err == nil && !slices.ContainsFunc(last.Services, func(s nodeapi.Service) bool {
			return strings.HasPrefix(s.Key, vip.String()+":")
		}) && !slices.Contains(last.VIPs, vip.String()) {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s: after the Service of %s was deleted IPVS still holds %+v (err %v)", n.Name, vip, last, err)
}

// throughBoth checks that the ToR's ECMP sends the client's connections
// through both nodes: under Cluster every backend sees the address of the
// node that forwarded the connection (its pod bridge for a local pod, its
// rack address for another node's pod).
func throughBoth(t *testing.T, l *lab.Lab, addr netip.AddrPort) {
	t.Helper()
	via := map[string]int{}
	for i := 0; i < 60 && len(via) < len(l.Nodes); i++ {
		body, err := l.Get(t.Context(), addr)
		if err != nil {
			t.Fatalf("request %d through %s: %v", i, addr, err)
		}
		_, client, _ := strings.Cut(body, ", client ")
		a, err := netip.ParseAddr(client)
		if err != nil {
			t.Fatalf("answer %q names no client address", body)
		}
		for _, n := range l.Nodes {
			if a == n.Addr || a == n.PodCIDR.Addr().Next() {
				via[n.Name]++
			}
		}
	}
	if len(via) < len(l.Nodes) {
		t.Fatalf("the client's connections went through %v only, want every node (ECMP at the ToR)", via)
	}
	t.Logf("connections forwarded per node (ECMP at the ToR): %v", via)
}

// checkPeerReady: vipcast-ccm published the BGPPeer's Ready condition.
func checkPeerReady(t *testing.T, l *lab.Lab) {
	t.Helper()
	var conds []any
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		u, err := l.CP.Dynamic.Resource(v1alpha1.BGPPeersResource).Get(t.Context(), lab.PeerName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		conds, _, _ = unstructured.NestedSlice(u.Object, "status", "conditions")
		gen, _, _ := unstructured.NestedInt64(u.Object, "status", "observedGeneration")
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if m["type"] == v1alpha1.ConditionReady && m["status"] == "True" && gen == u.GetGeneration() {
				return
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("BGPPeer %s: conditions %v, want Ready=True for its generation (written by vipcast-ccm)", lab.PeerName, conds)
}
