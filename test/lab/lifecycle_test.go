//go:build lab

package lab_test

import (
	"context"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/vipcast/vipcast/ipvs"
	"github.com/vipcast/vipcast/speaker"
	"github.com/vipcast/vipcast/test/lab"
)

// upgradeTag names the second release the lab pushes (chart and images
// 0.1.0-lab-upgrade), which `helm upgrade` moves to.
const upgradeTag = "lab-upgrade"

// tunnelPrefix turns the speakers' two-tier dataplane on.
const tunnelPrefix = "100.127.0.0/16"

// lifeFlows connections each exchange a request every lifeInterval, and a
// stream sends a request on a new connection every lifeInterval, while
// the cluster goes through clusterLifecycle. Fewer and slower than
// TestHeldAcrossECMP's: each node is one emulated CPU that also runs a
// kubelet, containerd and the pods. More load starved the CCM's pods
// until their (then impatient) liveness probes failed; and at 200 ms the
// nodes had no idle CPU left (top: load 8 to 12, the backends and
// containerd's shims first), so a new speaker took about two minutes
// from its pod's creation to Ready against 30 s without the traffic, and
// with test/e2e beside it in CI the upgrade's rollout passed 5 minutes.
const (
	lifeFlows    = 40
	lifeInterval = 500 * time.Millisecond
)

// rolloutBound bounds each rollout of clusterLifecycle: a guard against
// a rollout that hangs, not a figure; the log gives each one's time.
const rolloutBound = 8 * time.Minute

// clusterLifecycle takes the real cluster through what its operators do,
// with the client's traffic running; the speakers run the chart's default
// two tiers (held/TwoTier left them so):
//
//  1. under held connections and a steady stream of new ones, helm upgrade
//     to images with a new tag (the DaemonSet rolls node by node: each
//     node leaves the ToR's route and comes back), then kubectl rollout
//     restart of the CCM: no request fails, no connection breaks, the VIP
//     stays;
//  2. kubectl drain of a node: its route goes before its pods do (the
//     backends serve 5 s after SIGTERM, as with a preStop delay);
//  3. a third node joins: the CCM initializes it, its speaker peers, the
//     ToR's ECMP group grows, the VIP stays, held connections survive;
//     then Kubernetes' own specs that need three nodes run and pass
//     (upstreamThreeNodes);
//  4. helm uninstall: no virtual server, VIP, link, nftables table, route
//     or IPVS sync daemon of vipcast is left on any node or at the ToR; the
//     Service keeps its status.
func clusterLifecycle(t *testing.T, l *lab.Lab, vip netip.Addr) {
	ctx := t.Context()
	addr := netip.AddrPortFrom(vip, 80)
	patchService(t, l, lab.DemoService, `{"spec":{"externalTrafficPolicy":"Cluster"}}`)
	waitTier1(t, l, vip)

	// 1. Upgrade and CCM restart under traffic.
	held, err := l.Hold(ctx, addr, lifeFlows, lifeInterval)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Stop()
	stream := l.Stream(ctx, addr, lifeInterval, 3000)
	routes := watchRoutes(t, l, vip)
	time.Sleep(2 * time.Second)
	heldBefore, _, _ := held.Status()
	speakers, ccmTook, err := l.UpgradeSpeakers(ctx, lab.SpeakerValues{Tag: upgradeTag, TunnelPrefix: tunnelPrefix}, rolloutBound)
	if err != nil {
		t.Fatal(err)
	}
	version, err := lab.ChartVersion(upgradeTag)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("helm upgrade to chart %s rolled out: the speakers in %s, the CCM %s later", version, speakers.Round(time.Second), ccmTook.Round(time.Second))
	// The released chart names its images in the lab's registry, tagged
	// with its version: the nodes pulled them from there.
	for _, p := range podsOf(t, l, lab.VipcastNamespace, "", "") {
		for _, c := range p.Spec.Containers {
			if !strings.HasPrefix(c.Image, lab.NodeRegistry()+"/vipcast/vipcast-") || !strings.HasSuffix(c.Image, ":"+version) {
				t.Fatalf("after helm upgrade, pod %s runs %s, want vipcast's image from the lab's registry %s, tagged %s", p.Name, c.Image, lab.NodeRegistry(), version)
			}
		}
	}
	if _, err := l.Kubectl(ctx, "-n", lab.VipcastNamespace, "rollout", "restart", "deployment/"+lab.Release+"-ccm"); err != nil {
		t.Fatal(err)
	}
	if err := l.WaitRollout(ctx, rolloutBound, "deployment/"+lab.Release+"-ccm"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	ok, failed := stream.Stop()
	held.Settle(ctx)
	alive, exchanges, broken := held.Status()
	samples := routes.stop()
	t.Logf("the ToR's next hops for %s during the upgrade: %s", vip, strings.Join(routes.changes, ", "))
	if alive != heldBefore {
		dumpNodes(t, l)
	}
	t.Logf("helm upgrade + CCM rollout restart: %d new-connection requests answered, %d failed; %d of %d held connections alive (%d exchanges, %s)",
		ok, len(failed), alive, heldBefore, exchanges, held.Stalls())
	if len(failed) > 0 {
		t.Errorf("%d requests failed during the upgrade, want none; first: %v", len(failed), failed[:min(5, len(failed))])
	}
	if alive != heldBefore {
		t.Errorf("%d of %d held connections survived the upgrade, want all; first failures: %v", alive, heldBefore, broken[:min(3, len(broken))])
	}
	held.Stop() // node3's join gets a set of its own: no load beyond it
	// Node by node: each node left the route and came back; never both.
	left := map[netip.Addr]bool{}
	for _, s := range samples {
		if len(s) == 0 {
			t.Fatalf("the ToR had no route to %s during the upgrade", vip)
		}
		for _, n := range l.Nodes {
			if !slices.Contains(s, n.Addr) {
				left[n.Addr] = true
			}
		}
	}
	if len(left) != len(l.Nodes) {
		t.Errorf("during the upgrade only %v left the ToR's route, want every node (withdraw before restart)", left)
	}
	checkVIP(t, l, vip, "after the upgrade and the CCM's restart")

	// 2. Drain: the node's route goes before its pods do.
	drainNode(t, l, vip, l.Nodes[1])

	// 3. A third node joins. Its connections are opened once every
	// node's tier 1 shows the Deployment spread again: a flow scheduled
	// by a table that has changed since (node2's pods coming back, each
	// speaker in its own time) goes elsewhere when ECMP moves it, which
	// is the limit docs/dev/design/two-tier.md gives, not this event's doing.
	waitTier1(t, l, vip)
	held2, err := l.Hold(ctx, addr, lifeFlows, lifeInterval)
	if err != nil {
		t.Fatal(err)
	}
	defer held2.Stop()
	time.Sleep(2 * time.Second)
	before2, _, _ := held2.Status()
	start := time.Now()
	n3, err := l.JoinSpare(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l.WaitKubelet(ctx, n3)
	ready := time.Now()
	// Bounded generously, a guard against a hang: the drain evicted the
	// lab's one CCM replica when it ran on node2, and it starts again on
	// an emulated node beside node3's start (three VMs on two cores); 5
	// minutes once did not suffice.
	if err := l.WaitInitialized(ctx, 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Logf("node3 initialized by vipcast-ccm %s after it was Ready", time.Since(ready).Round(time.Second))
	checkNodesInitialized(t, l)
	if err := l.WaitRollout(ctx, rolloutBound, "daemonset/"+lab.Release+"-speaker"); err != nil {
		t.Fatal(err)
	}
	took := waitRoute(t, l, vip, 2*time.Minute, l.Nodes...)
	time.Sleep(3 * time.Second)
	held2.Settle(ctx)
	alive2, _, broken2 := held2.Status()
	t.Logf("node3 joined: initialized, its speaker peered and the ToR's route has %d next hops %s after its kubelet started (route change seen %s after the rollout); %d of %d held connections alive (%s)",
		len(l.Nodes), time.Since(start).Round(time.Second), took.Round(time.Millisecond), alive2, before2, held2.Stalls())
	if alive2 != before2 {
		dumpNodes(t, l)
		t.Logf("held connections node3's join broke: %v", broken2[:min(3, len(broken2))])
	}
	// Every held connection survives the join (issue 14's target): the
	// two tiers send a flow ECMP moves to node3 where it went before.
	// Before connection sync existed, 1 of 40 was reset in 3 of 5 runs
	// under load; the test then allowed 2 (docs/dev/design/two-tier.md).
	if alive2 != before2 {
		t.Errorf("%d of %d held connections survived node3 joining, want all; first failures: %v", alive2, before2, broken2[:min(3, len(broken2))])
	}
	checkVIP(t, l, vip, "after node3 joined")
	held2.Stop()

	// Kubernetes' own specs that need three schedulable nodes, which the
	// upstream scenario did not have.
	upstreamThreeNodes(t, l)

	// 4. Uninstall. Each speaker's last words are kept on its node (the
	// kubelet removes a deleted pod's logs).
	for _, n := range l.Nodes {
		if _, err := n.Exec(ctx, "sh", "-c", "(tail -n 0 -F /var/log/pods/"+lab.VipcastNamespace+"_"+lab.Release+"-speaker-*/vipcast-speaker/*.log > /root/speaker-last.log 2>&1 &)"); err != nil {
			t.Fatal(err)
		}
	}
	svcBefore := getService(t, l)
	if _, err := l.Helm(ctx, "uninstall", lab.Release, "-n", lab.VipcastNamespace, "--wait", "--timeout", "3m"); err != nil {
		t.Fatal(err)
	}
	if _, err := l.WaitRoute(ctx, vip, time.Minute); err != nil {
		t.Fatalf("after helm uninstall: %v", err)
	}
	for _, n := range l.Nodes {
		waitNothingLeft(t, n, vip)
	}
	svc := getService(t, l)
	if !reflect.DeepEqual(svc.Status.LoadBalancer.Ingress, svcBefore.Status.LoadBalancer.Ingress) || !slices.Contains(svc.Finalizers, "service.kubernetes.io/load-balancer-cleanup") {
		t.Errorf("after helm uninstall the Service has status %v and finalizers %v, want its status %v and the load-balancer-cleanup finalizer kept (as docs/operations.md says)",
			svc.Status.LoadBalancer.Ingress, svc.Finalizers, svcBefore.Status.LoadBalancer.Ingress)
	}
	t.Logf("helm uninstall: nothing of vipcast left on %d nodes or at the ToR; the Service keeps %v and its finalizer", len(l.Nodes), svc.Status.LoadBalancer.Ingress)
}

// routeWatch samples the ToR's next hops for a VIP.
type routeWatch struct {
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	samples [][]netip.Addr
	changes []string // each change of the next hops, with its time
}

func watchRoutes(t *testing.T, l *lab.Lab, vip netip.Addr) *routeWatch {
	ctx, cancel := context.WithCancel(t.Context())
	w := &routeWatch{cancel: cancel}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		for ctx.Err() == nil {
			if hops, err := l.Routes(netip.PrefixFrom(vip, 32)); err == nil {
				if len(w.samples) == 0 || !slices.Equal(hops, w.samples[len(w.samples)-1]) {
					w.changes = append(w.changes, fmt.Sprintf("%s %v", time.Now().Format("15:04:05.000"), hops))
				}
				w.samples = append(w.samples, hops)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	return w
}

func (w *routeWatch) stop() [][]netip.Addr {
	w.cancel()
	w.wg.Wait()
	return w.samples
}

// drainNode drains n with kubectl and checks that the ToR's route loses
// n before any of n's backend pods stops, then uncordons it.
func drainNode(t *testing.T, l *lab.Lab, vip netip.Addr, n *lab.Node) {
	t.Helper()
	ctx := t.Context()
	var mine []string
	for _, p := range podsOf(t, l, lab.DemoNamespace, n.Name, "app="+lab.DemoService) {
		mine = append(mine, p.Name)
	}
	if len(mine) == 0 {
		t.Fatalf("no backend on %s to drain", n.Name)
	}
	type result struct {
		routeGone, podGone time.Duration
		pod                string
	}
	start := time.Now()
	res := make(chan result, 1)
	go func() {
		var r result
		for time.Since(start) < 2*time.Minute && (r.routeGone == 0 || r.podGone == 0) {
			if r.routeGone == 0 {
				if hops, err := l.Routes(netip.PrefixFrom(vip, 32)); err == nil && !slices.Contains(hops, n.Addr) {
					r.routeGone = time.Since(start)
				}
			}
			if r.podGone == 0 {
				for _, name := range mine {
					if _, err := l.CP.Client.CoreV1().Pods(lab.DemoNamespace).Get(ctx, name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
						r.podGone, r.pod = time.Since(start), name
						break
					}
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		res <- r
	}()
	if _, err := l.Kubectl(ctx, "drain", n.Name, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout", "2m"); err != nil {
		t.Fatal(err)
	}
	r := <-res
	t.Logf("kubectl drain %s: its route left the ToR after %s, its first backend (%s, 5 s of draining after SIGTERM) was gone after %s",
		n.Name, r.routeGone.Round(time.Millisecond), r.pod, r.podGone.Round(time.Millisecond))
	if r.routeGone == 0 || r.podGone == 0 || r.routeGone > r.podGone {
		t.Errorf("drain %s: route gone after %s, first pod gone after %s: want the route to go first", n.Name, r.routeGone, r.podGone)
	}
	if _, err := l.Kubectl(ctx, "uncordon", n.Name); err != nil {
		t.Fatal(err)
	}
	waitRoute(t, l, vip, time.Minute, l.Nodes...)
	if _, err := l.Kubectl(ctx, "-n", lab.DemoNamespace, "rollout", "status", "deployment/"+lab.DemoService, "--timeout", "3m"); err != nil {
		t.Fatal(err)
	}
}

// waitTier1 waits until every node's tier 1 for vip is every node's
// tunnel address weighted by lab.BackendsPerNode.
func waitTier1(t *testing.T, l *lab.Lab, vip netip.Addr) {
	t.Helper()
	var tier1 []string
	for _, n := range l.Nodes {
		a, err := speaker.TunnelAddress(netip.MustParsePrefix(tunnelPrefix), n.Addr)
		if err != nil {
			t.Fatal(err)
		}
		tier1 = append(tier1, ipvs.Backend{Addr: a, Port: 80, Weight: lab.BackendsPerNode, Tunnel: true}.String())
	}
	slices.Sort(tier1)
	for _, n := range l.Nodes {
		waitIPVS(t, n, vip, tier1)
	}
}

// podsOf lists the pods of a namespace, on node and matching the label
// selector when they are not empty.
func podsOf(t *testing.T, l *lab.Lab, namespace, node, selector string) []v1.Pod {
	t.Helper()
	opts := metav1.ListOptions{LabelSelector: selector}
	if node != "" {
		opts.FieldSelector = "spec.nodeName=" + node
	}
	pods, err := l.CP.Client.CoreV1().Pods(namespace).List(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	return pods.Items
}

func getService(t *testing.T, l *lab.Lab) *v1.Service {
	t.Helper()
	svc, err := l.CP.Client.CoreV1().Services(lab.DemoNamespace).Get(t.Context(), lab.DemoService, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// checkVIP: the demo Service still has exactly vip.
func checkVIP(t *testing.T, l *lab.Lab, vip netip.Addr, when string) {
	t.Helper()
	in := getService(t, l).Status.LoadBalancer.Ingress
	if len(in) != 1 || in[0].IP != vip.String() {
		t.Fatalf("%s the Service's status is %v, want only %s", when, in, vip)
	}
}

// waitNothingLeft waits until the node has no virtual server on vip, no
// VIP, no link or nftables table of vipcast and no IPVS sync daemon.
func waitNothingLeft(t *testing.T, n *lab.Node, vip netip.Addr) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(t.Context(), time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		st, err := n.State(ctx)
		if err != nil {
			last = err.Error()
			return false, nil //nolint:nilerr // retry until the timeout
		}
		var left []string
		for _, s := range st.Services {
			if strings.HasPrefix(s.Key, vip.String()+":") {
				left = append(left, "virtual server "+s.Key)
			}
		}
		left = append(left, st.VIPs...)
		for _, tb := range st.Tables {
			if strings.HasSuffix(tb, " vipcast") {
				left = append(left, "nftables table "+tb)
			}
		}
		for _, l := range st.Links {
			if l == "vipcast0" || strings.HasPrefix(l, "vcloop") {
				left = append(left, "link "+l)
			}
		}
		for _, d := range st.SyncDaemons {
			left = append(left, "IPVS sync daemon "+d)
		}
		last = strings.Join(left, ", ")
		return len(left) == 0, nil
	})
	if err != nil {
		out, _ := n.Exec(t.Context(), "cat", "/root/speaker-last.log")
		t.Fatalf("%s after helm uninstall still has: %s; its speaker's last log lines:\n%s", n.Name, last, out)
	}
}

// dumpNodes logs what each node's kernel holds for the client's flows.
func dumpNodes(t *testing.T, l *lab.Lab) {
	t.Helper()
	for _, n := range l.Nodes {
		for _, c := range []string{"ipvsadm -Ln", "ipvsadm -Ln --daemon", "ipvsadm -Lnc | head -30", "conntrack -L 2>/dev/null | grep 192.168.50.2 | head -30", "iptables-save -c | grep -i invalid", "nft list table ip vipcast | head -80", "sysctl -a 2>/dev/null | grep -E 'vs[.](sloppy|conntrack)|rp_filter'", "ip rule; ip route show table all | grep -E '100[.]127|5200'"} {
			out, err := n.Exec(t.Context(), "sh", "-c", c)
			t.Logf("%s: %s: %v\n%s", n.Name, c, err, out)
		}
		out, _ := n.Logs(t.Context(), lab.VipcastNamespace, lab.Release+"-speaker")
		t.Logf("%s: speaker logs:\n%s", n.Name, out)
	}
}
