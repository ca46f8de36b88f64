//go:build lab

package lab_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/vipcast/vipcast/test/lab"
)

// serviceContract checks, in the real cluster with two tiers (the chart's
// default after held), Service fields that kube-proxy leaves to vipcast
// under ipMode Proxy, on lab.HeldService (its EndpointSlice the test's,
// over the demo's pods, two on each node):
//
//   - sessionAffinity ClientIP: 50 new connections from the client, which
//     the ToR's ECMP spreads over both nodes, reach one pod (the control:
//     without it they reach several);
//   - a UDP flow with a fixed 5-tuple whose pod's endpoint goes away (the
//     pod itself lives on and would answer) is answered by another pod
//     soon after: the figure is logged, the bound is generous (before,
//     the flow stayed on its pod for as long as the client kept sending);
//   - pods whose endpoints turn not ready (a readiness probe failing; the
//     pods live on): a held TCP connection to one goes on, a UDP flow to
//     one is answered by another pod, and new connections reach neither
//     (kube-proxy's behaviour: conntrack keeps TCP, clears UDP);
//   - a one-endpoint Service under Local policy rolled to a pod on the
//     other node (the old endpoint terminating and serving while the new
//     one is not ready yet, then both, then the old one gone) refuses no
//     new connection from a stream every 100 ms;
//   - Local policy with every endpoint on the other node: a pod on the
//     node without one reaches the VIP, answered by the other node's pods;
//   - hairpin: a pod that is its own Service's only endpoint reaches
//     itself through the VIP.
func serviceContract(t *testing.T, l *lab.Lab) {
	ctx := t.Context()
	node1, node2 := l.Nodes[0], l.Nodes[1]
	vip, pods := heldOnBoth(t, l)
	addr := netip.AddrPortFrom(vip, 80)

	t.Run("ClientIP", func(t *testing.T) { clientIPAffinity(t, l, addr) })
	t.Run("StaleUDP", func(t *testing.T) { staleUDP(t, l, netip.AddrPortFrom(vip, 53), pods) })
	if err := l.SetEndpoints(ctx, pods, nil); err != nil {
		t.Fatal(err)
	}
	t.Run("NotReady", func(t *testing.T) { notReady(t, l, vip, pods) })
	if err := l.SetEndpoints(ctx, pods, nil); err != nil {
		t.Fatal(err)
	}
	t.Run("LocalRollout", func(t *testing.T) { localRollout(t, l, vip, node1.Pods[0], node2.Pods[0]) })
	t.Run("LocalInCluster", func(t *testing.T) { localInCluster(t, l, vip) })
	t.Run("Hairpin", func(t *testing.T) { hairpin(t, l, vip) })
}

// inClusterGets is how many GETs the Local in-cluster check makes.
const inClusterGets = 20

// localInCluster: under Local policy with every endpoint on the other
// node, the client pod, on a node without one, reaches the VIP: its node's
// tier 1 sends each new connection to the other node's tier 2, and every
// GET is answered by one of that node's pods, as kube-proxy sends an
// in-cluster client to any endpoint whatever the policy. The client pod's
// node does not announce the VIP (the ToR's route is the other node's
// alone), so no connection of this check comes back in from the ToR.
func localInCluster(t *testing.T, l *lab.Lab, vip netip.Addr) {
	ctx := t.Context()
	get, p := inClientPod(t, l)
	var there *lab.Node
	for _, n := range l.Nodes {
		if n.Name != p.Spec.NodeName {
			there = n
			break
		}
	}
	if there == nil || len(there.Pods) == 0 {
		t.Fatalf("no node other than the client pod's %s with pods of its own", p.Spec.NodeName)
	}
	patchService(t, l, lab.HeldService, `{"spec":{"externalTrafficPolicy":"Local"}}`)
	defer patchService(t, l, lab.HeldService, `{"spec":{"externalTrafficPolicy":"Cluster"}}`)
	if err := l.SetEndpoints(ctx, there.Pods, nil); err != nil {
		t.Fatal(err)
	}
	waitRoute(t, l, vip, time.Minute, there)
	last, took, err := getsAnsweredBy(ctx, get, vip, inClusterGets, there.Pods)
	if err != nil {
		t.Fatalf("from pod %s on %s, which has no endpoint of the Local Service, %d GETs of %s were not all answered by %s's pods within 30s (%v); last:\n%s",
			p.Name, p.Spec.NodeName, inClusterGets, vip, there.Name, err, last)
	}
	t.Logf("Local policy, in-cluster: pod %s on %s (no endpoint there) had all %d of its GETs through the VIP answered by %s's pods (%s after the change)",
		p.Name, p.Spec.NodeName, inClusterGets, there.Name, took.Round(100*time.Millisecond))
}

// getsAnsweredBy GETs port 80 of vip n times from the client pod (get,
// inClientPod's), every second for up to 30 s, until every answer comes
// from one of pods; it returns the last answers and how long that took.
func getsAnsweredBy(ctx context.Context, get func(context.Context, ...string) (string, error), vip netip.Addr, n int, pods []lab.Pod) (last string, took time.Duration, err error) {
	urls := slices.Repeat([]string{"http://" + netip.AddrPortFrom(vip, 80).String() + "/"}, n)
	start := time.Now()
	err = wait.PollUntilContextTimeout(ctx, time.Second, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		out, err := get(ctx, urls...)
		if err != nil {
			return false, err
		}
		last = out
		answers := strings.Split(strings.TrimSpace(out), "\n")
		if len(answers) != len(urls) {
			return false, nil
		}
		for _, a := range answers {
			if !slices.ContainsFunc(pods, func(q lab.Pod) bool { return strings.HasPrefix(a, q.Name+" ") }) {
				return false, nil
			}
		}
		return true, nil
	})
	return last, time.Since(start), err
}

// hairpinGets is how many GETs the hairpin check makes.
const hairpinGets = 10

// hairpin makes the client pod the Service's only endpoint and GETs the
// VIP from inside it: every GET comes back to the pod itself, and each is
// answered, the pod seeing a node's address rather than its own (before
// the hairpin rule the pod answered itself inside its own namespace and
// every such connection failed).
func hairpin(t *testing.T, l *lab.Lab, vip netip.Addr) {
	ctx := t.Context()
	get, p := inClientPod(t, l)
	addr, err := netip.ParseAddr(p.Status.PodIP)
	if err != nil {
		t.Fatalf("client pod's IP %q: %v", p.Status.PodIP, err)
	}
	self := lab.Pod{Name: p.Name, Node: p.Spec.NodeName, Addr: addr}
	if err := l.SetEndpoints(ctx, []lab.Pod{self}, nil); err != nil {
		t.Fatal(err)
	}
	last, took, err := getsAnsweredBy(ctx, get, vip, hairpinGets, []lab.Pod{self})
	if err != nil {
		t.Fatalf("from pod %s, its own Service's only endpoint, %d GETs of %s were not all answered by itself within 30s (%v); last:\n%s", self.Name, hairpinGets, vip, err, last)
	}
	for _, a := range strings.Split(strings.TrimSpace(last), "\n") {
		if _, src, _ := strings.Cut(a, ", client "); src == self.Addr.String() {
			t.Errorf("pod %s saw its own connection from its own address %s: not masqueraded (%q)", self.Name, src, a)
		}
	}
	t.Logf("hairpin: pod %s on %s, its Service's only endpoint, answered all %d of its own GETs through the VIP (%s after the endpoint change); it saw %q",
		self.Name, self.Node, hairpinGets, took.Round(100*time.Millisecond), strings.SplitN(strings.TrimSpace(last), "\n", 2)[0])
}

// affinityConns is how many new connections the ClientIP check opens.
const affinityConns = 50

// podsOfConns opens n new connections to addr from the client and counts
// the pods that answer.
func podsOfConns(ctx context.Context, l *lab.Lab, addr netip.AddrPort, n int) (map[string]int, error) {
	seen := map[string]int{}
	for range n {
		body, err := l.Get(ctx, addr)
		if err != nil {
			return seen, err
		}
		pod, _, _ := strings.Cut(body, " ")
		seen[pod]++
	}
	return seen, nil
}

func clientIPAffinity(t *testing.T, l *lab.Lab, addr netip.AddrPort) {
	ctx := t.Context()
	before, err := podsOfConns(ctx, l, addr, affinityConns)
	if err != nil {
		t.Fatal(err)
	}
	if len(before) < 2 {
		t.Fatalf("without affinity %d new connections reached %v: the check below proves nothing", affinityConns, before)
	}
	patchService(t, l, lab.HeldService, `{"spec":{"sessionAffinity":"ClientIP"}}`)
	defer patchService(t, l, lab.HeldService, `{"spec":{"sessionAffinity":"None"}}`)
	// The speakers program it within their resync: until then some
	// connections may still spread.
	start := time.Now()
	var last map[string]int
	err = wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		last, err = podsOfConns(ctx, l, addr, affinityConns)
		return err == nil && len(last) == 1, nil
	})
	if err != nil {
		t.Fatalf("with sessionAffinity ClientIP, %d new connections from one client still reach %v after %s, want one pod (without: %v)",
			affinityConns, last, time.Since(start).Round(time.Second), before)
	}
	t.Logf("sessionAffinity ClientIP: %d new connections through both nodes reached %v (without: %v), %s after the patch",
		affinityConns, last, before, time.Since(start).Round(100*time.Millisecond))
}

// staleBound is how long a UDP flow whose pod's endpoint went away may
// take to reach another pod here: generous for the emulated nodes; the
// figure is logged.
const staleBound = 10 * time.Second

// udpAsker returns a function that sends one datagram on the flow c and
// returns the pod that answers within wait.
func udpAsker(c net.Conn) func(wait time.Duration) (string, error) {
	buf := make([]byte, 1500)
	return func(wait time.Duration) (string, error) {
		if err := c.SetDeadline(time.Now().Add(wait)); err != nil {
			return "", err
		}
		if _, err := c.Write([]byte("ping\n")); err != nil {
			return "", err
		}
		k, err := c.Read(buf)
		if err != nil {
			return "", err
		}
		pod, _, _ := strings.Cut(strings.TrimSpace(string(buf[:k])), " ")
		return pod, nil
	}
}

func staleUDP(t *testing.T, l *lab.Lab, addr netip.AddrPort, pods []lab.Pod) {
	ctx := t.Context()
	c, err := l.ClientNS.DialContext(ctx, "udp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	ask := udpAsker(c)
	var first string
	for try := 0; try < 5 && first == ""; try++ {
		first, _ = ask(time.Second)
	}
	if first == "" {
		t.Fatalf("the UDP flow to %s got no answer", addr)
	}
	// The flow is on its pod: it stays there.
	for i := range 5 {
		if pod, err := ask(time.Second); err != nil || pod != first {
			t.Fatalf("exchange %d of the UDP flow: %q, %v, want %s again", i, pod, err, first)
		}
	}
	rest := slices.DeleteFunc(slices.Clone(pods), func(p lab.Pod) bool { return p.Name == first })
	if len(rest) != len(pods)-1 {
		t.Fatalf("the flow's pod %s is not one of %v", first, names(pods))
	}
	if err := l.SetEndpoints(ctx, rest, nil); err != nil {
		t.Fatal(err)
	}
	removed := time.Now()
	var pod string
	for time.Since(removed) < staleBound {
		if pod, err = ask(100 * time.Millisecond); err == nil && pod != first {
			break
		}
	}
	took := time.Since(removed)
	if pod == first || pod == "" {
		t.Fatalf("the UDP flow still reaches %q (%v) %s after its endpoint went away, want another pod", pod, err, took.Round(time.Millisecond))
	}
	t.Logf("a UDP flow with a fixed 5-tuple: its endpoint %s removed, %s answered %s later", first, pod, took.Round(time.Millisecond))
}

// notReady: the endpoints of a held TCP connection's pod and of a UDP
// flow's pod turn not ready. Once no new connection reaches them (every
// node has the change), the UDP flow is answered by another pod and the
// TCP connection still by its own: deleting its real server would have
// reset it (expire_nodest_conn), as a readiness probe failing for a
// moment must not.
func notReady(t *testing.T, l *lab.Lab, vip netip.Addr, pods []lab.Pod) {
	ctx := t.Context()
	tcp, err := l.ClientNS.DialContext(ctx, "tcp", netip.AddrPortFrom(vip, 80).String())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tcp.Close() }()
	br := bufio.NewReader(tcp)
	get := func() (string, error) { // one request on the held connection
		if err := tcp.SetDeadline(time.Now().Add(2 * time.Second)); err != nil {
			return "", err
		}
		if _, err := io.WriteString(tcp, "GET / HTTP/1.1\r\nHost: lab\r\n\r\n"); err != nil {
			return "", err
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return "", err
		}
		body, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		pod, _, _ := strings.Cut(strings.TrimSpace(string(body)), " ")
		return pod, err
	}
	udp, err := l.ClientNS.DialContext(ctx, "udp", netip.AddrPortFrom(vip, 53).String())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = udp.Close() }()
	askUDP := udpAsker(udp)
	ask := func() (string, error) { return askUDP(500 * time.Millisecond) }
	held, err := get()
	if err != nil {
		t.Fatal(err)
	}
	var flow string
	for try := 0; try < 5 && flow == ""; try++ {
		flow, _ = ask()
	}
	if flow == "" {
		t.Fatal("the UDP flow got no answer")
	}
	var ready, unready []lab.Pod
	for _, p := range pods {
		if p.Name == held || p.Name == flow {
			unready = append(unready, p)
		} else {
			ready = append(ready, p)
		}
	}
	if len(unready) == 0 || len(ready) == 0 {
		t.Fatalf("the connection's pod %s and the flow's %s among %v: nothing to check", held, flow, names(pods))
	}
	if err := l.SetEndpointsNotReady(ctx, ready, nil, unready); err != nil {
		t.Fatal(err)
	}
	changed := time.Now()
	var last map[string]int
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		last, err = podsOfConns(ctx, l, netip.AddrPortFrom(vip, 80), affinityConns)
		return err == nil && last[held] == 0 && last[flow] == 0, nil
	})
	if err != nil {
		t.Fatalf("new connections still reach the not-ready pods %v %s after the change: %v", names(unready), time.Since(changed).Round(time.Second), last)
	}
	moved := ""
	for start := time.Now(); time.Since(start) < staleBound && (moved == "" || moved == flow); {
		var err error
		if moved, err = ask(); err != nil {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if moved == "" || moved == flow {
		t.Errorf("the UDP flow still reaches %q %s after every node had the change, want another pod than its not-ready %s", moved, staleBound, flow)
	}
	for i := range 5 {
		if pod, err := get(); err != nil || pod != held {
			t.Fatalf("exchange %d on the held TCP connection after its pod %s turned not ready: %q, %v; want it to go on", i, held, pod, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("pods %v not ready: new connections reach %v after %s, the UDP flow moved off %s, the held TCP connection to %s goes on",
		names(unready), last, time.Since(changed).Round(100*time.Millisecond), flow, held)
}

func localRollout(t *testing.T, l *lab.Lab, vip netip.Addr, old, next lab.Pod) {
	ctx := t.Context()
	node1, node2 := l.Nodes[0], l.Nodes[1]
	patchService(t, l, lab.HeldService, `{"spec":{"externalTrafficPolicy":"Local"}}`)
	defer patchService(t, l, lab.HeldService, `{"spec":{"externalTrafficPolicy":"Cluster"}}`)
	if err := l.SetEndpoints(ctx, []lab.Pod{old}, nil); err != nil {
		t.Fatal(err)
	}
	waitRoute(t, l, vip, time.Minute, node1)
	addr := netip.AddrPortFrom(vip, 80)
	stream := l.Stream(ctx, addr, 100*time.Millisecond, 1000)
	steps := []struct {
		what        string
		ready, term []lab.Pod
		route       []*lab.Node
	}{
		{"the old endpoint terminating and serving, none ready", nil, []lab.Pod{old}, []*lab.Node{node1}},
		{"the new endpoint ready on the other node, the old one terminating", []lab.Pod{next}, []lab.Pod{old}, []*lab.Node{node2}},
		{"the old endpoint gone", []lab.Pod{next}, nil, []*lab.Node{node2}},
	}
	var log []string
	for _, s := range steps {
		time.Sleep(2 * time.Second)
		if err := l.SetEndpoints(ctx, s.ready, s.term); err != nil {
			t.Fatal(err)
		}
		took := waitRoute(t, l, vip, time.Minute, s.route...)
		var via []string
		for _, n := range s.route {
			via = append(via, n.Name)
		}
		log = append(log, fmt.Sprintf("%s (endpoints %s): the ToR's route via %s in %s", s.what, names(podsOn(s.ready, s.term)), via, took.Round(time.Millisecond)))
	}
	time.Sleep(2 * time.Second)
	ok, failed := stream.Stop()
	t.Logf("one-endpoint Local rollout from %s to %s: %d new connections answered, %d failed (%s)", old.Name, next.Name, ok, len(failed), strings.Join(log, "; "))
	if len(failed) > 0 {
		t.Errorf("%d new connections failed during the rollout, want none; first: %v", len(failed), failed[:min(3, len(failed))])
	}
}

// podsOn lists ready and terminating together.
func podsOn(ready, term []lab.Pod) []lab.Pod { return append(slices.Clone(ready), term...) }
