//go:build lab

package lab_test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/vipcast/vipcast/test/lab"
	"github.com/vipcast/vipcast/test/netns"
)

// TestCluster runs every cluster-level scenario of the suite in one real
// cluster, booted once: real kubelets started with
// --cloud-provider=external, containerd, kube-proxy with the settings
// docs/install.md prescribes, and vipcast installed by `helm install` of
// charts/vipcast (the CCM as the chart's Deployment with leader election
// and in-cluster configuration, one replica on the emulated nodes
// (Lab.HelmValuesFile), the speakers as its DaemonSet), peered with the
// ToR over TCP MD5, the ToR running BFD, the speakers resyncing every
// clusterResync. The scenarios run in this order, each leaving the
// cluster as the next expects it (the demo Service keeps its VIP
// throughout):
//
//  1. nftables, ipvs, iptables: kube-proxy in each of its modes, moved
//     from one to the next the way its documentation says (stop, kube-proxy
//     --cleanup, start in the new mode) — clusterWithKubeProxy and, in
//     nftables mode, kubeProxyFlush;
//  2. sourceranges: spec.loadBalancerSourceRanges for the client, a pod
//     and the nodes, one tier (sourceRanges);
//  3. fabric: the fabric's view of a Service's life, its endpoints, a
//     speaker's SIGTERM and BFD under frozen nodes (fabric);
//  4. outage: the API server frozen and killed (outage);
//  5. held: held connections across ECMP changes in each dataplane of
//     heldSetups, the chart upgraded from one to the next
//     (heldAcrossECMP); the last turns on the chart's default two tiers,
//     which the cluster keeps;
//  6. contract: Service fields kube-proxy leaves to vipcast under ipMode
//     Proxy (serviceContract);
//  7. sourceranges-twotier: sourceRanges again, in two tiers, but for
//     the nodes' own connections;
//  8. tier1ready and attacks (two tiers): tier1Ready, attacks;
//  9. upstream: Kubernetes' own LoadBalancer e2e specs from the client
//     (upstreamLoadBalancer), with kube-proxy in iptables mode and the
//     chart's default two tiers;
//  10. lifecycle: an upgrade and a CCM restart under traffic, a drain, a
//     node joining, helm uninstall (clusterLifecycle);
//  11. getting-started: what vipcast left removed as docs/operations.md
//     says, then docs/getting-started.md followed from the install to a
//     VIP answering, and timed (gettingStarted).
//
// A scenario that fails stops the ones after it: each needs the cluster
// the previous one left.
func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("real cluster: skipped with -short")
	}
	netns.Require(t)
	bfd := lab.DefaultBFD
	l := lab.Up(t, lab.Options{
		Nodes:    3,
		Cluster:  lab.ClusterOptions{ProxyMode: "nftables", Boot: 2, ExtraTags: []string{upgradeTag}, Upstream: true},
		Password: "lab-md5-password",
		Resync:   clusterResync,
		BFD:      &bfd,
	})
	var vip netip.Addr
	for i, mode := range []string{"nftables", "ipvs", "iptables"} {
		ok := t.Run(mode, func(t *testing.T) {
			if i > 0 {
				switchKubeProxy(t, l, mode)
			}
			vip = clusterWithKubeProxy(t, l, mode, vip)
			if mode == "nftables" {
				kubeProxyFlush(t, l, vip)
			}
		})
		logSessions(t, l, mode)
		if !ok {
			return
		}
	}
	ok := t.Run("sourceranges", func(t *testing.T) { sourceRanges(t, l, vip) })
	logSessions(t, l, "sourceranges")
	if !ok {
		return
	}
	scenarios := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"fabric", func(t *testing.T) { fabric(t, l) }},
		{"outage", func(t *testing.T) { outage(t, l, vip) }},
		{"held", func(t *testing.T) {
			for _, setup := range heldSetups {
				if !t.Run(setup.name, func(t *testing.T) { heldAcrossECMP(t, l, setup.values) }) {
					return
				}
			}
		}},
		{"contract", func(t *testing.T) { serviceContract(t, l) }},
		{"sourceranges-twotier", func(t *testing.T) {
			sourceRanges(t, l, vip)
			// The lifecycle's drain would refuse a pod that no
			// controller owns.
			deleteClientPod(t, l)
		}},
		{"tier1ready", func(t *testing.T) { tier1Ready(t, l, vip) }},
		{"attacks", func(t *testing.T) { attacks(t, l) }},
		{"upstream", func(t *testing.T) { upstreamLoadBalancer(t, l) }},
		{"lifecycle", func(t *testing.T) { clusterLifecycle(t, l, vip) }},
		{"getting-started", func(t *testing.T) { gettingStarted(t, l) }},
	}
	for _, sc := range scenarios {
		ok := t.Run(sc.name, sc.run)
		logSessions(t, l, sc.name)
		if !ok {
			return
		}
	}
}

// logSessions logs the ToR's count of each node's session drops after a
// scenario, so that a later scenario's failure on a flapped session can
// be told from the flaps the ones before it caused on purpose. (FRR's
// lastResetDueTo is no help: a BFD down leaves it at its last
// configuration reset.)
func logSessions(t *testing.T, l *lab.Lab, after string) {
	t.Helper()
	var b strings.Builder
	for _, n := range l.Nodes {
		st, err := l.ToR.Neighbor(n.Addr)
		if err != nil {
			fmt.Fprintf(&b, "; %s: %v", n.Name, err)
			continue
		}
		fmt.Fprintf(&b, "; %s %s, dropped %d times", n.Name, st.State, st.DroppedCount)
	}
	t.Logf("after %s, the ToR's sessions%s", after, b.String())
}

// clusterResync is the speakers' --resync-period and
// --dataplane-resync-period in TestCluster: outage needs an outage longer
// than two of them.
const clusterResync = 5 * time.Second

// switchKubeProxy moves kube-proxy on every node to mode, on all nodes at
// once, as a rollout of its DaemonSet with every node unavailable at once
// would.
func switchKubeProxy(t *testing.T, l *lab.Lab, mode string) {
	t.Helper()
	errs := make(chan error, len(l.Nodes))
	for _, n := range l.Nodes {
		go func() {
			start := time.Now()
			err := n.RestartKubeProxy(t.Context(), mode)
			if err == nil {
				t.Logf("%s: kube-proxy stopped, cleaned up (kube-proxy --cleanup) and started in %s mode in %s", n.Name, mode, time.Since(start).Round(time.Millisecond))
			}
			errs <- err
		}()
	}
	for range l.Nodes {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// kubeProxyMode tells from the node's kernel which mode kube-proxy runs
// in: its nftables table, its kube-ipvs0 link or its iptables chains.
// (Debian bookworm's nft aborts listing kube-proxy's tables: the node
// agent reads them through netlink.)
func kubeProxyMode(ctx context.Context, n *lab.Node) (string, error) {
	st, err := n.State(ctx)
	if err != nil {
		return "", err
	}
	out, err := n.Exec(ctx, "sh", "-c", "iptables-save -t nat 2>/dev/null | grep -c '^:KUBE-SERVICES' || true")
	if err != nil {
		return "", err
	}
	nftables := slices.Contains(st.Tables, "ip kube-proxy")
	ipvs := slices.Contains(st.Links, "kube-ipvs0")
	iptables := strings.TrimSpace(out) != "0"
	switch {
	case nftables && !ipvs && !iptables:
		return "nftables", nil
	case ipvs && !nftables:
		return "ipvs", nil // the IPVS mode uses iptables chains too
	case iptables && !nftables && !ipvs:
		return "iptables", nil
	}
	return "", fmt.Errorf("%s: no single kube-proxy mode in the kernel: nftables tables %v, links %v, KUBE-SERVICES chains %q", n.Name, st.Tables, st.Links, strings.TrimSpace(out))
}

// kubeProxyFlush restarts kube-proxy (nftables mode) on node1, as a
// rollout of its DaemonSet does: at its start it flushes every IPVS
// virtual server of the node (its clean-up of the other modes). The
// speaker must find that and restore its virtual servers, with a
// DataplaneDrift Event on the Node and a log line saying which sync found
// them: mostly the resync its probe asks for within 2 s, sometimes the
// periodic one (a minute) when it comes first. The test logs that line,
// and what the client saw meanwhile: new connections refused until the
// repair, and held connections through node1 reset by the kernel.
//
// What the speaker found is told by its
// vipcast_ipvs_drift_detected_total and the Node's DataplaneDrift Events
// counted before and after, never by comparing the Events' times with the
// host's clock: those come from the VM's clock, which an emulated CPU lets
// lag. kube-proxy flushes some time into its start, which on a starved
// emulated CPU can take long: the wait is bounded by driftWait, and
// waitIPVS must then find the virtual server back within its 30 s, which
// is what bounds the repair (the 30 s once counted from the restart held
// kube-proxy's start too).
func kubeProxyFlush(t *testing.T, l *lab.Lab, vip netip.Addr) {
	t.Helper()
	ctx := t.Context()
	n := l.Nodes[0]
	addr := netip.AddrPortFrom(vip, 80)
	const driftWait = 2 * time.Minute
	driftsBefore, err := n.Metric(ctx, "vipcast_ipvs_drift_detected_total")
	if err != nil {
		t.Fatal(err)
	}
	eventsBefore, err := driftEvents(ctx, l, n.Name)
	if err != nil {
		t.Fatal(err)
	}
	speakerLog := "/var/log/pods/" + lab.VipcastNamespace + "_" + lab.Release + "-speaker-*/*/*.log"
	driftLines := func(ctx context.Context) ([]string, error) {
		out, err := n.Exec(ctx, "sh", "-c", "grep -h 'Dataplane drift' "+speakerLog+" || true")
		return strings.FieldsFunc(out, func(r rune) bool { return r == '\n' }), err
	}
	linesBefore, err := driftLines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	held, err := l.Hold(ctx, addr, 20, 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Stop()
	stream := l.Stream(ctx, addr, 100*time.Millisecond, 1000)
	time.Sleep(time.Second)
	heldBefore, _, _ := held.Status()
	start := time.Now()
	if err := n.RestartKubeProxy(ctx, ""); err != nil {
		t.Fatal(err)
	}
	restarted := time.Since(start)
	var drifts float64
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, driftWait, true, func(ctx context.Context) (bool, error) {
		v, err := n.Metric(ctx, "vipcast_ipvs_drift_detected_total")
		drifts = v
		return err == nil && drifts > driftsBefore, nil
	})
	if err != nil {
		out, _ := n.Exec(ctx, "sh", "-c", "ipvsadm -Ln; grep -hiE 'drift|resync' "+speakerLog+" | tail -n 20")
		t.Fatalf("%s: vipcast_ipvs_drift_detected_total still %v (was %v) %s after kube-proxy's restart in nftables mode (which flushes IPVS): the speaker did not notice; IPVS and the speaker's resyncs:\n%s", n.Name, drifts, driftsBefore, driftWait, out)
	}
	found := time.Since(start)
	var driftLine string
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		lines, _ := driftLines(ctx) // an error: retried
		if len(lines) <= len(linesBefore) {
			return false, nil
		}
		driftLine = lines[len(lines)-1]
		return strings.Contains(driftLine, "foundBy=") && strings.Contains(driftLine, "lost="), nil
	})
	if err != nil {
		t.Fatalf("%s: the drift counter rose, but the speaker's log has no new drift line naming the sync that found it and how many virtual servers were lost (%d such lines before); last: %q", n.Name, len(linesBefore), driftLine)
	}
	waitIPVS(t, n, vip, backendsOf(n.Pods...))
	restored := time.Since(start)
	var event string
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		now, _ := driftEvents(ctx, l, n.Name) // nil on an error: retried
		for name, ev := range now {
			if ev.Count > eventsBefore[name].Count {
				event = ev.Message
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("%s: the speaker found the flush (vipcast_ipvs_drift_detected_total %v, was %v), but no new DataplaneDrift Event reached the Node within 30s", n.Name, drifts, driftsBefore)
	}
	time.Sleep(time.Second)
	ok, failed := stream.Stop()
	held.Settle(ctx)
	alive, _, broken := held.Status()
	t.Logf("kube-proxy restarted on %s in nftables mode (%s): the speaker found the flush %s and the virtual server was back %s after the restart began; Event %q; the speaker's log: %s; new connections every 100 ms meanwhile: %d answered, %d failed %v; %d of %d held connections alive",
		n.Name, restarted.Round(time.Millisecond), found.Round(time.Millisecond), restored.Round(time.Millisecond), event, driftLine, ok, len(failed), failed[:min(3, len(failed))], alive, heldBefore)
	if alive != heldBefore {
		// The kernel resets the established connections through the
		// flushed node (TestKernel/FlushHeld): docs/install.md says so.
		t.Logf("held connections the flush reset: %v", broken[:min(3, len(broken))])
	}
}

// driftEvents returns the DataplaneDrift Events on the Node, by name: the
// recorder counts a repeated Event up in one object.
func driftEvents(ctx context.Context, l *lab.Lab, node string) (map[string]v1.Event, error) {
	evs, err := l.CP.Client.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Node,involvedObject.name=" + node + ",reason=DataplaneDrift"})
	if err != nil {
		return nil, err
	}
	out := make(map[string]v1.Event, len(evs.Items))
	for _, e := range evs.Items {
		out[e.Namespace+"/"+e.Name] = e
	}
	return out, nil
}

// clusterWithKubeProxy checks the cluster with kube-proxy in mode; vip is
// the demo Service's VIP, or none the first time (the demo is applied).
// kube-proxy's mode shows in the kernel once its first sync is done: on a
// starved emulated CPU that took over a minute once (CI, node2, ipvs
// mode), so the wait is bounded at 3 minutes, a guard against a hang and
// not a figure.
func clusterWithKubeProxy(t *testing.T, l *lab.Lab, mode string, vip netip.Addr) netip.Addr {
	ctx := t.Context()
	for _, n := range l.Nodes {
		start := time.Now()
		err := wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
			got, err := kubeProxyMode(ctx, n)
			return err == nil && got == mode, nil
		})
		if err != nil {
			got, merr := kubeProxyMode(ctx, n)
			logs, _ := n.Exec(ctx, "tail", "-n", "30", "/var/log/kube-proxy.log")
			t.Fatalf("%s: kube-proxy runs in mode %q (%v) after %s, want %s; the end of its log:\n%s", n.Name, got, merr, time.Since(start).Round(time.Second), mode, logs)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Logf("%s: kube-proxy's %s mode took %s more to show in the kernel", n.Name, mode, d.Round(time.Second))
		}
	}
	checkNodesInitialized(t, l)
	for _, n := range l.Nodes {
		node, err := l.CP.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(node.Status.NodeInfo.KubeletVersion, "v1.37") {
			t.Fatalf("%s: kubelet version %q: not a real kubelet", n.Name, node.Status.NodeInfo.KubeletVersion)
		}
	}
	if !vip.IsValid() {
		vip = demoVIP(t, l)
	} else {
		checkVIP(t, l, vip, "after kube-proxy moved to "+mode+" mode")
	}
	addr := netip.AddrPortFrom(vip, 80)
	// Cluster policy (the previous mode ended with Local): every node
	// programs every pod.
	patchService(t, l, lab.DemoService, `{"spec":{"externalTrafficPolicy":"Cluster"}}`)
	for _, n := range l.Nodes {
		waitIPVS(t, n, vip, backendsOf(l.Pods()...))
	}
	reach(t, l, addr, l.Pods(), nil)
	throughBoth(t, l, addr)

	svc, err := l.CP.Client.CoreV1().Services(lab.DemoNamespace).Get(ctx, lab.DemoService, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// From a pod: the VIP (vipcast's dataplane on the pod's node) and the
	// ClusterIP (kube-proxy's).
	targets := []string{vip.String(), svc.Spec.ClusterIP}
	var urls []string
	for _, target := range targets {
		urls = append(urls, "http://"+netip.AddrPortFrom(netip.MustParseAddr(target), 80).String()+"/")
	}
	for i, body := range podGet(t, l, urls...) {
		t.Logf("from a pod, %s answered %q", targets[i], body)
	}
	// From the client: the NodePort on each node (kube-proxy's).
	// kube-proxy programs the NodePort within a sync of its start.
	nodePort := svc.Spec.Ports[0].NodePort
	for _, n := range l.Nodes {
		var body string
		err := wait.PollUntilContextTimeout(ctx, time.Second, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			var err error
			body, err = l.Get(ctx, netip.AddrPortFrom(n.Addr, uint16(nodePort))) //nolint:gosec // a port
			return err == nil, nil
		})
		if err != nil {
			t.Fatalf("NodePort %d on %s did not answer within 30s", nodePort, n.Name)
		}
		t.Logf("NodePort %d on %s answered %q", nodePort, n.Name, body)
	}

	// Local: the pods see the client itself, with kube-proxy present.
	patchService(t, l, lab.DemoService, `{"spec":{"externalTrafficPolicy":"Local"}}`)
	// Every node programs its own pods only (and no SNAT) before the
	// client's requests count.
	for _, n := range l.Nodes {
		waitIPVS(t, n, vip, backendsOf(n.Pods...))
	}
	time.Sleep(time.Second) // the same sync's SNAT change
	for i := range 20 {
		body, err := l.Get(ctx, addr)
		if err != nil {
			t.Fatalf("Local, request %d: %v", i, err)
		}
		if !strings.HasSuffix(body, "client 192.168.50.2") {
			t.Fatalf("Local, request %d: the backend saw %q, want the client's own address 192.168.50.2", i, body)
		}
	}
	return vip
}

// clientPod is the lab's in-cluster client: a pod of the demo namespace
// running the backend image, outside the demo Service's selector.
const clientPod = "client"

// podGet GETs each of urls once from inside the cluster and returns the
// answers, in order; it fails the test if any GET failed. The GETs leave
// from the client pod's network namespace (the pod is started on first
// use and deleted by deleteClientPod): the backend binary's -get mode,
// run on the pod's node inside the namespace of the pod's container, as
// kubectl exec would reach it (the API server cannot reach the kubelets
// here, and the image has no shell).
func podGet(t *testing.T, l *lab.Lab, urls ...string) []string {
	t.Helper()
	ctx := t.Context()
	get, p := inClientPod(t, l)
	// kube-proxy's mode shows in the kernel before its first sync has
	// programmed every Service: the GETs are tried again, as the
	// NodePort's are, for up to 30 s (a pod started for them used to
	// hide that wait in its own start), and a GET that fails throughout
	// fails the test.
	var answers []string
	var last, firstFailure string
	start := time.Now()
	err := wait.PollUntilContextTimeout(ctx, 2*time.Second, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		out, err := get(ctx, urls...)
		if err != nil {
			return false, err
		}
		last = out
		answers = strings.Split(strings.TrimSpace(out), "\n")
		ok := len(answers) == len(urls)
		for _, a := range answers {
			ok = ok && strings.HasPrefix(a, "web-")
		}
		if !ok && firstFailure == "" {
			firstFailure = out
		}
		return ok, nil
	})
	if err != nil {
		t.Fatalf("from pod %s on %s, GET %v did not answer within 30s (%v); last: %q", p.Name, p.Spec.NodeName, urls, err, last)
	}
	if firstFailure != "" {
		t.Logf("from pod %s on %s, the GETs answered %s after the first try, which failed: %q", p.Name, p.Spec.NodeName, time.Since(start).Round(time.Second), firstFailure)
	}
	return answers
}

// inClientPod starts the client pod unless it runs and returns a function
// that GETs urls from inside it (the backend binary's -get mode, run on the
// pod's node in the namespace of the pod's container: see podGet), and the
// pod. The function's output has a line per URL, the answer or the error;
// its error is the node agent's, not a failed GET's.
func inClientPod(t *testing.T, l *lab.Lab) (func(ctx context.Context, urls ...string) (string, error), *v1.Pod) {
	t.Helper()
	ctx := t.Context()
	p := runClientPod(t, l)
	var node *lab.Node
	for _, n := range l.Nodes {
		if n.Name == p.Spec.NodeName {
			node = n
		}
	}
	if node == nil || len(p.Status.ContainerStatuses) == 0 {
		t.Fatalf("client pod on node %q with containers %+v: not one of the lab's nodes, or no container", p.Spec.NodeName, p.Status.ContainerStatuses)
	}
	id := strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://")
	tasks, err := node.Exec(ctx, "/opt/vipcast/bin/ctr", "--address", "/run/containerd/containerd.sock", "-n", "k8s.io", "tasks", "ls")
	if err != nil {
		t.Fatal(err)
	}
	pid := ""
	for _, line := range strings.Split(tasks, "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[0] == id && f[2] == "RUNNING" {
			pid = f[1]
		}
	}
	if pid == "" {
		t.Fatalf("client pod's container %s is not among the running tasks on %s:\n%s", id, node.Name, tasks)
	}
	return func(ctx context.Context, urls ...string) (string, error) {
		return node.Exec(ctx, append([]string{"nsenter", "--target", pid, "--net", "/opt/vipcast/bin/lab-backend", "-get"}, urls...)...)
	}, p
}

// runClientPod starts the client pod unless it runs, and returns it once
// it is Running.
func runClientPod(t *testing.T, l *lab.Lab) *v1.Pod {
	t.Helper()
	ctx := t.Context()
	pods := l.CP.Client.CoreV1().Pods(lab.DemoNamespace)
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: clientPod, Namespace: lab.DemoNamespace, Labels: map[string]string{"app": clientPod}},
		Spec: v1.PodSpec{
			Containers: []v1.Container{{
				Name: "client", Image: lab.BackendImage, ImagePullPolicy: v1.PullNever,
				Env: []v1.EnvVar{{Name: "POD_NAME", Value: clientPod}},
			}},
		},
	}
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	var got *v1.Pod
	// The bound covers the pod's start, which took 97 s on a node
	// starved by CI's other tests (sandbox 70 s, container 27 s): a guard
	// against a hang, not a figure.
	err := wait.PollUntilContextTimeout(ctx, time.Second, 4*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := pods.Get(ctx, clientPod, metav1.GetOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // retry
		}
		got = p
		return p.Status.Phase == v1.PodRunning && len(p.Status.ContainerStatuses) > 0 && p.Status.ContainerStatuses[0].State.Running != nil, nil
	})
	if err != nil {
		var status v1.PodStatus
		if got != nil {
			status = got.Status
		}
		t.Fatalf("client pod did not run: %v (status %+v)", err, status)
	}
	return got
}

// deleteClientPod deletes the client pod and waits until it is gone.
func deleteClientPod(t *testing.T, l *lab.Lab) {
	t.Helper()
	ctx := t.Context()
	pods := l.CP.Client.CoreV1().Pods(lab.DemoNamespace)
	if err := pods.Delete(ctx, clientPod, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := pods.Get(ctx, clientPod, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("client pod not gone: %v", err)
	}
}
