//go:build lab

package lab_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/vipcast/vipcast/test/lab"
	"github.com/vipcast/vipcast/test/lab/nodeapi"
	"github.com/vipcast/vipcast/test/routers"
)

// The speakers' log lines TestAPIServerOutage looks for.
const (
	logLost     = "API server unreachable: keeping BGP sessions, routes and IPVS exactly as they are"
	logBack     = "API server reachable again"
	logStartsUp = "Waiting for the API server to read this Node"
	lastContact = "vipcast_speaker_apiserver_last_contact_timestamp_seconds"
	outageHeld  = "vipcast_speaker_outage_held_endpoints"
)

// nodeGrace is kube-controller-manager's --node-monitor-grace-period,
// its default, which test/controlplane leaves as it is.
const nodeGrace = 50 * time.Second

// outage is the fault tier of an API server outage, in the real cluster:
// speakers peered with the FRR ToR using TCP MD5 (password from a Secret),
// IPVS programmed, the client holding 20 connections through the demo
// Service's vip that exchange a request every 200 ms. The API server is
// stopped — frozen (SIGSTOP) in one run, for longer than the node monitor's
// grace period, and killed in the other, for longer than two resync
// periods, with etcd's history compacted meanwhile so every watch must
// list again. Throughout and after each run: the ToR's route, the BGP
// sessions (no flap), the IPVS tables, the held connections and the
// Service's VIP are unchanged, each speaker logs the outage once and its
// last-contact metric stops; once the API server is back, zero UPDATEs
// reach the ToR. Last, a speaker that the kubelet starts while the API
// server is down announces nothing and says why.
//
// The kubelets, kube-proxy, the controllers and the CCM lose the API
// server too, as in a real outage. In the frozen run the kubelets are
// stopped too from 15 s before it returns, as on starved nodes: every
// Lease is older than the grace period when kube-controller-manager looks,
// and it marks every node unreachable and every pod not ready (the
// control: the test fails unless it does) until the kubelets report
// again; the speakers hold the endpoints ready through it
// (--outage-settle) and the fabric sees nothing.
func outage(t *testing.T, l *lab.Lab, vip netip.Addr) {
	resync := l.Opts.Resync
	// Longer than two resync periods and than a probe's interval plus
	// its timeout (10s + 5s), so each speaker sees the outage.
	outage := 2*resync + 15*time.Second
	ctx := t.Context()
	for _, n := range l.Nodes {
		waitIPVS(t, n, vip, backendsOf(n.Pods...))
	}
	held, err := l.Hold(ctx, netip.AddrPortFrom(vip, 80), 20, 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Stop()

	runs := []struct {
		name        string
		stop, start func() error
		outage      time.Duration
		late        bool // the kubelets stopped as the API server returns
	}{
		// Past the grace period: the kubelets, stopped before the API
		// server returns, cannot renew their Leases in time.
		{"SIGSTOP past the node grace period", l.CP.PauseAPIServer, l.CP.ResumeAPIServer, nodeGrace + 15*time.Second, true},
		{"kill and compact etcd", func() error {
			if err := l.CP.KillAPIServer(); err != nil {
				return err
			}
			rev, err := l.CP.CompactEtcd(ctx)
			t.Logf("etcd compacted to revision %d: every watch lists again", rev)
			return err
		}, l.CP.RestartAPIServer, outage, false},
	}
	for _, run := range runs {
		lists := readLists(t, l)
		outageRun(t, l, vip, held, run.outage, resync, run.name, run.stop, run.start, run.late)
		relists := readLists(t, l)
		for node, n := range relists {
			relists[node] = n - lists[node]
		}
		t.Logf("%s: the API server answered the speakers' lists of Services and EndpointSlices %v times (vipcast_speaker_api_requests_total)", run.name, relists)
		if run.late {
			continue
		}
		// etcd compacted past every watch's revision: each informer must
		// list again, and the counter must see it.
		for node, n := range relists {
			if n < 2 {
				t.Errorf("%s: %s's speaker listed Services and EndpointSlices %v times after its watches expired, want each again", run.name, node, n)
			}
		}
	}
	held.Stop()
	startDuringOutage(t, l, vip, resync)
}

// fabricState is what must not change during an outage: the ToR's next
// hops for the VIP, its sessions with the nodes, and each node's IPVS table.
type fabricState struct {
	nextHops []netip.Addr
	// kernelOrder is the next hops in the order of the ToR's kernel
	// route: the same set in another order hashes flows differently.
	kernelOrder []netip.Addr
	sessions    map[string]routers.NeighborState
	ipvs        map[string]nodeapi.State
}

func readFabric(t *testing.T, l *lab.Lab, vip netip.Addr) fabricState {
	t.Helper()
	s := fabricState{sessions: map[string]routers.NeighborState{}, ipvs: map[string]nodeapi.State{}}
	var err error
	if s.nextHops, err = l.Routes(netip.PrefixFrom(vip, 32)); err != nil {
		t.Fatal(err)
	}
	routes, err := l.ToR.KernelRoutes(routers.IPv4)
	if err != nil {
		t.Fatal(err)
	}
	s.kernelOrder = routes[netip.PrefixFrom(vip, 32)]
	for _, n := range l.Nodes {
		if s.sessions[n.Name], err = l.ToR.Neighbor(n.Addr); err != nil {
			t.Fatal(err)
		}
		if s.ipvs[n.Name], err = n.State(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// sameFabric fails the test where now differs from before: a next hop, a
// session that flapped or received an UPDATE, or an IPVS table.
func sameFabric(t *testing.T, l *lab.Lab, when string, before, now fabricState) {
	t.Helper()
	if !slices.Equal(before.nextHops, now.nextHops) {
		t.Errorf("%s: the ToR's next hops changed from %v to %v", when, before.nextHops, now.nextHops)
	} else if !slices.Equal(before.kernelOrder, now.kernelOrder) {
		t.Errorf("%s: the ToR's kernel route lists the same next hops in another order, %v then %v: the ECMP hash moved flows between nodes", when, before.kernelOrder, now.kernelOrder)
	}
	for name, b := range before.sessions {
		n := now.sessions[name]
		if n.State != "Established" || n.EstablishedCount != b.EstablishedCount || n.DroppedCount != b.DroppedCount {
			t.Errorf("%s: the ToR's session with %s flapped: before %+v, now %+v; %s", when, name, b, n, speakerTail(t, l, name))
		}
		if n.UpdatesRecv != b.UpdatesRecv {
			t.Errorf("%s: the ToR received %d UPDATEs from %s, want none", when, n.UpdatesRecv-b.UpdatesRecv, name)
		}
		if !reflect.DeepEqual(before.ipvs[name], now.ipvs[name]) {
			t.Errorf("%s: %s's IPVS changed from %+v to %+v", when, name, before.ipvs[name], now.ipvs[name])
		}
	}
}

// speakerTail is the last lines of the named node's speaker logs, for a
// failure's message.
func speakerTail(t *testing.T, l *lab.Lab, node string) string {
	t.Helper()
	const n = 15
	for _, nd := range l.Nodes {
		if nd.Name != node {
			continue
		}
		lines, err := nd.SpeakerLogLines(t.Context(), "")
		if err != nil {
			return fmt.Sprintf("its speaker's logs: %v", err)
		}
		slices.Sort(lines) // each run's file; CRI lines start with their time
		return fmt.Sprintf("its speaker's last %d log lines:\n%s", min(n, len(lines)), strings.Join(lines[max(0, len(lines)-n):], "\n"))
	}
	return "no node " + node
}

// outageRun stops the API server with stop for the outage, checks that
// nothing changed, starts it again with start and checks again after two
// resync periods. With late, the kubelets are stopped before the API
// server starts again and continued once the node monitor has marked
// every node unreachable and every speaker holds endpoints (lateKubelets),
// and the checks after the return wait for the hold's end.
func outageRun(t *testing.T, l *lab.Lab, vip netip.Addr, held *lab.Held, outage, resync time.Duration, name string, stop, start func() error, late bool) {
	t.Helper()
	ctx := t.Context()
	svc, err := l.CP.Client.CoreV1().Services(lab.DemoNamespace).Get(ctx, lab.DemoService, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	before := readFabric(t, l, vip)
	lost, back := countLines(t, l, logLost), countLines(t, l, logBack)
	_, exchanges, _ := held.Status()

	if err := stop(); err != nil {
		t.Fatalf("%s: stopping the API server: %v", name, err)
	}
	started := false
	defer func() {
		if !started { // a failure during the outage: the scenarios after it need the API server
			if err := start(); err != nil {
				t.Errorf("%s: starting the API server after a failure: %v", name, err)
			}
		}
	}()
	// After a probe's interval and timeout the last contact is final.
	time.Sleep(15 * time.Second)
	contact := readMetric(t, l, lastContact)
	if late {
		// The kubelets stop 15 s before the return, so that their last
		// Lease renewals, hung in the frozen server, have timed out (10 s)
		// and do not land as it resumes: their Leases are as old as the
		// outage when the node monitor looks.
		time.Sleep(outage - 30*time.Second)
		if err := signalKubelets(ctx, l, "STOP"); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = signalKubelets(context.WithoutCancel(ctx), l, "CONT") }()
		time.Sleep(15 * time.Second)
	} else {
		time.Sleep(outage - 15*time.Second)
	}
	sameFabric(t, l, fmt.Sprintf("%s, %v into the outage", name, outage), before, readFabric(t, l, vip))
	if now := readMetric(t, l, lastContact); !reflect.DeepEqual(now, contact) {
		t.Errorf("%s: %s went from %v to %v during the outage, want no contact", name, lastContact, contact, now)
	}
	exchanges = checkHeld(t, held, name+" during the outage", exchanges)
	started = true
	if err := start(); err != nil {
		t.Fatalf("%s: starting the API server again: %v", name, err)
	}
	returned := time.Now()
	if late {
		lateKubelets(t, l, vip, name, before)
		exchanges = checkHeld(t, held, name+" while the nodes were unreachable", exchanges)
		// The hold ends OutageSettle after each speaker's probe saw the
		// return (within 10 s), then one resync applies the slices.
		time.Sleep(time.Until(returned.Add(lab.OutageSettle + 10*time.Second + resync)))
		waitMetric(t, l, outageHeld, "every speaker's hold over", func(v float64) bool { return v == 0 }, 2*resync+10*time.Second)
	} else {
		time.Sleep(2*resync + 12*time.Second) // two resyncs and a probe after the return
	}
	sameFabric(t, l, name+", after the API server returned", before, readFabric(t, l, vip))
	checkHeld(t, held, name+" after the outage", exchanges)
	for node, v := range readMetric(t, l, lastContact) {
		if v <= contact[node] {
			t.Errorf("%s: %s's %s stayed %v after the API server returned", name, node, lastContact, v)
		}
	}
	if got := countLines(t, l, logLost); !reflect.DeepEqual(got, plus(lost, 1)) {
		t.Errorf("%s: %q logged %v times per node (before: %v), want once per outage", name, logLost, got, lost)
	}
	if got := countLines(t, l, logBack); !reflect.DeepEqual(got, plus(back, 1)) {
		t.Errorf("%s: %q logged %v times per node (before: %v), want once", name, logBack, got, back)
	}
	now, err := l.CP.Client.CoreV1().Services(lab.DemoNamespace).Get(ctx, lab.DemoService, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if now.ResourceVersion != svc.ResourceVersion || !reflect.DeepEqual(now.Status, svc.Status) {
		t.Errorf("%s: the Service was rewritten (resourceVersion %s → %s, status %+v → %+v)", name, svc.ResourceVersion, now.ResourceVersion, svc.Status, now.Status)
	}
	if !t.Failed() {
		t.Logf("%s for %v: route, sessions, IPVS, Service and held connections unchanged; 0 UPDATEs at the ToR after the return", name, outage)
	}
}

// signalKubelets sends signal sig (STOP, CONT) to the kubelet of every
// node.
func signalKubelets(ctx context.Context, l *lab.Lab, sig string) error {
	for _, n := range l.Nodes {
		script := `for p in /proc/[0-9]*; do [ "$(cat $p/comm 2>/dev/null)" = kubelet ] && kill -` + sig + ` "${p#/proc/}"; done; true`
		if out, err := n.Exec(ctx, "sh", "-c", script); err != nil {
			return fmt.Errorf("%s: SIG%s to the kubelet: %w: %s", n.Name, sig, err, out)
		}
	}
	return nil
}

// lateKubelets runs, the kubelets stopped, from the API server's return:
// it waits until kube-controller-manager marks every node unreachable
// (the control) and every speaker holds endpoints the slices call not
// ready, checks that the fabric has not changed, continues the kubelets
// and waits until every node and every demo pod is ready again.
func lateKubelets(t *testing.T, l *lab.Lab, vip netip.Addr, name string, before fabricState) {
	t.Helper()
	ctx := t.Context()
	start := time.Now()
	unknown := func(n *corev1.Node) bool {
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionUnknown
			}
		}
		return false
	}
	var last string
	err := wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		var ready []string
		for _, n := range l.Nodes {
			node, err := l.CP.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil || !unknown(node) {
				ready = append(ready, fmt.Sprintf("%s (%v)", n.Name, err))
			}
		}
		last = fmt.Sprintf("not marked unreachable: %v", ready)
		return len(ready) == 0, nil
	})
	if err != nil {
		t.Fatalf("%s: control: kube-controller-manager marked no node unreachable within a minute of the return, the kubelets stopped (%s): the test cannot tell", name, last)
	}
	marked := time.Since(start)
	waitMetric(t, l, outageHeld, "every speaker holding endpoints", func(v float64) bool { return v > 0 }, time.Minute)
	heldN := readMetric(t, l, outageHeld)
	sameFabric(t, l, name+", the nodes unreachable and their pods not ready", before, readFabric(t, l, vip))
	if err := signalKubelets(ctx, l, "CONT"); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := l.CP.Client.CoreV1().Pods(lab.DemoNamespace).List(ctx, metav1.ListOptions{})
		notReady := []string{fmt.Sprint(err)}
		if err == nil {
			notReady = nil
		} else {
			pods = &corev1.PodList{}
		}
		for _, p := range pods.Items {
			if !slices.ContainsFunc(p.Status.Conditions, func(c corev1.PodCondition) bool {
				return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
			}) {
				notReady = append(notReady, p.Name)
			}
		}
		last = fmt.Sprintf("pods not ready: %v", notReady)
		return len(notReady) == 0, nil
	})
	if err != nil {
		t.Fatalf("%s: the demo's pods not ready again within 2 minutes of the kubelets' return: %s", name, last)
	}
	t.Logf("%s: every node marked unreachable %s after the return, the speakers held %v endpoints ready; the kubelets continued, every demo pod ready again %s after the return",
		name, marked.Round(time.Second), heldN, time.Since(start).Round(time.Second))
}

// waitMetric waits until series, on every node's speaker, satisfies ok.
func waitMetric(t *testing.T, l *lab.Lab, series, what string, ok func(float64) bool, bound time.Duration) {
	t.Helper()
	var got map[string]float64
	err := wait.PollUntilContextTimeout(t.Context(), time.Second, bound, true, func(ctx context.Context) (bool, error) {
		got = map[string]float64{}
		all := true
		for _, n := range l.Nodes {
			v, err := n.Metric(ctx, series)
			got[n.Name] = v
			all = all && err == nil && ok(v)
		}
		return all, nil
	})
	if err != nil {
		t.Fatalf("%s: %s not so within %v (last %v)", what, series, bound, got)
	}
}

// checkHeld fails the test unless every held connection is alive and has
// exchanged since the count before; it returns the count now.
func checkHeld(t *testing.T, held *lab.Held, when string, before int) int {
	t.Helper()
	held.Settle(t.Context())
	alive, exchanges, broken := held.Status()
	if len(broken) > 0 || exchanges <= before {
		t.Errorf("%s: %d held connections alive, %d exchanges (before: %d); broken: %v", when, alive, exchanges, before, broken)
	}
	return exchanges
}

// readMetric reads one speaker metric on every node.
func readMetric(t *testing.T, l *lab.Lab, series string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, n := range l.Nodes {
		v, err := n.Metric(t.Context(), series)
		if err != nil {
			st, nerr := l.ToR.Neighbor(n.Addr)
			t.Fatalf("%s: %v; the ToR's session: %+v (err %v); %s", n.Name, err, st, nerr, speakerTail(t, l, n.Name))
		}
		out[n.Name] = v
	}
	return out
}

// readLists returns, per node, how many times the API server answered its
// speaker's lists of Services and EndpointSlices
// (vipcast_speaker_api_requests_total, code 200), by LIST or by a watch
// that starts with every object.
func readLists(t *testing.T, l *lab.Lab) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, n := range l.Nodes {
		for _, resource := range []string{"services", "endpointslices"} {
			for _, verb := range []string{"list", "watchlist"} {
				v, err := n.Metric(t.Context(), `vipcast_speaker_api_requests_total{code="200",resource="`+resource+`",verb="`+verb+`"}`)
				if err != nil && !errors.Is(err, lab.ErrNoSample) { // no sample: never so
					t.Fatalf("%s: %v", n.Name, err)
				}
				out[n.Name] += v
			}
		}
	}
	for node, v := range out {
		if v == 0 {
			t.Fatalf("%s's speaker never listed Services or EndpointSlices, by its metrics: is vipcast_speaker_api_requests_total counting?", node)
		}
	}
	return out
}

// countLines counts, per node, the lines of its speaker's logs containing
// substr.
func countLines(t *testing.T, l *lab.Lab, substr string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, n := range l.Nodes {
		lines, err := n.SpeakerLogLines(t.Context(), substr)
		if err != nil {
			t.Fatal(err)
		}
		out[n.Name] = len(lines)
	}
	return out
}

func plus(m map[string]int, d int) map[string]int {
	out := map[string]int{}
	for k, v := range m {
		out[k] = v + d
	}
	return out
}

// startDuringOutage kills node1's speaker while the API server is frozen,
// and the kubelet starts it again: it opens no session and announces
// nothing, says why, and comes up once the API server returns.
func startDuringOutage(t *testing.T, l *lab.Lab, vip netip.Addr, resync time.Duration) {
	t.Helper()
	ctx := t.Context()
	node1, node2 := l.Nodes[0], l.Nodes[1]
	waiting := countLines(t, l, logStartsUp)[node1.Name]
	if err := l.CP.PauseAPIServer(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			if err := l.CP.ResumeAPIServer(); err != nil {
				t.Errorf("resuming the API server after a failure: %v", err)
			}
		}
	}()
	if err := node1.Speaker(ctx, "KILL", true); err != nil {
		t.Fatal(err)
	}
	if err := node1.Speaker(ctx, "start", false); err != nil {
		t.Fatal(err)
	}
	// The killed speaker's session ends at the ToR within the hold time.
	waitRoute(t, l, vip, l.Opts.HoldTime+10*time.Second, node2)
	// Longer than two resync periods and the speaker's 10s request
	// timeout, so its first read of the Node has failed.
	time.Sleep(max(2*resync, 20*time.Second))
	if st, err := l.ToR.Neighbor(node1.Addr); err != nil || st.State == "Established" {
		t.Errorf("a speaker started during the outage: ToR session %+v (err %v), want none", st, err)
	}
	if got := countLines(t, l, logStartsUp)[node1.Name]; got != waiting+1 {
		t.Errorf("a speaker started during the outage logged %q %d times, want once", logStartsUp, got-waiting)
	}
	resumed = true
	if err := l.CP.ResumeAPIServer(); err != nil {
		t.Fatal(err)
	}
	took := waitRoute(t, l, vip, time.Minute, node1, node2)
	t.Logf("a speaker started during the outage announced nothing; %v after the API server returned, node1 is back at the ToR", took.Round(time.Millisecond))
}
