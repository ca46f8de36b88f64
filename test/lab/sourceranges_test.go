//go:build lab

package lab_test

import (
	"context"
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vipcast/vipcast/test/lab"
)

// sourceRanges: spec.loadBalancerSourceRanges on the demo Service, judged
// by every node for the client behind the ToR, a pod and the nodes
// themselves, in the dataplane the cluster has (one tier after the
// kube-proxy modes, two tiers after held). Each change is timed from the
// patch until every new connection from the client, spread by ECMP over
// the nodes, gets the new answer; the ranges are cleared at the end. With
// two tiers too, a node's own connection reaches a pod (the in-cluster
// map) when the ranges admit it, and is dropped when they do not.
func sourceRanges(t *testing.T, l *lab.Lab, vip netip.Addr) {
	ctx := t.Context()
	addr := netip.AddrPortFrom(vip, 80)
	url := "http://" + addr.String() + "/"
	const client = "192.168.50.2/32"
	podGetOnce, pod := inClientPod(t, l)
	defer setSourceRanges(t, l, nil)

	// The client alone: the client gets through; the pod and the nodes do
	// not (neither's address is in the range). Every node first blocks
	// the client (a range without it), so that the client's admission is
	// timed as a change.
	took := setSourceRangesAndWait(t, l, addr, false, "10.244.0.0/16")
	t.Logf("ranges [10.244.0.0/16]: the client blocked on every node %s after the patch", took.Round(time.Millisecond))
	took = setSourceRangesAndWait(t, l, addr, true, client)
	t.Logf("ranges [%s]: the client admitted on every node %s after the patch", client, took.Round(time.Millisecond))
	if out := getOnce(ctx, t, podGetOnce, url); strings.HasPrefix(out, "web-") {
		t.Errorf("pod %s (%s), outside the ranges, got an answer through %s: %q", pod.Name, pod.Status.PodIP, addr, out)
	}
	for _, n := range l.Nodes {
		if out := nodeGet(ctx, t, n, url); strings.HasPrefix(out, "web-") {
			t.Errorf("node %s, outside the ranges, got an answer through %s: %q", n.Name, addr, out)
		}
	}

	// The pods' and the nodes' ranges too: both get through.
	took = setSourceRangesAndWait(t, l, addr, true, client, "10.244.0.0/16", "10.0.0.0/24")
	t.Logf("ranges widened to pods and nodes: in force %s after the patch", took.Round(time.Millisecond))
	// One GET: with two tiers, one whose tier 1 picked the other node
	// used to get no answer (the client's node dropped the VIP's answer
	// as a martian; TestECMPMove/InCluster).
	if out := getOnce(ctx, t, podGetOnce, url); !strings.HasPrefix(out, "web-") {
		t.Errorf("pod %s (%s), inside the ranges, got no answer through %s: %q", pod.Name, pod.Status.PodIP, addr, out)
	}
	for _, n := range l.Nodes {
		if out := nodeGet(ctx, t, n, url); !strings.HasPrefix(out, "web-") {
			t.Errorf("node %s, whose address is in the ranges, got no answer through %s: %q", n.Name, addr, out)
		}
	}

	// The client taken out: blocked on every node.
	took = setSourceRangesAndWait(t, l, addr, false, "10.244.0.0/16", "10.0.0.0/24")
	t.Logf("client taken out of the ranges: blocked on every node %s after the patch", took.Round(time.Millisecond))

	// The annotation, with the field empty: the same rules. (The API
	// server refuses a malformed one; vipcast's own parsing fails closed,
	// TestServiceDataplane.)
	setSourceRanges(t, l, nil)
	waitAdmitted(t, l, addr, true, time.Now())
	start := time.Now()
	patchService(t, l, lab.DemoService, `{"metadata":{"annotations":{"service.beta.kubernetes.io/load-balancer-source-ranges":"10.244.0.0/16,10.0.0.0/24"}}}`)
	took = waitAdmitted(t, l, addr, false, start)
	t.Logf("source-ranges annotation without the client: blocked on every node %s after the patch", took.Round(time.Millisecond))
	start = time.Now()
	patchService(t, l, lab.DemoService, `{"metadata":{"annotations":{"service.beta.kubernetes.io/load-balancer-source-ranges":null}}}`)
	took = waitAdmitted(t, l, addr, true, start)
	t.Logf("annotation removed: the client admitted on every node %s after the patch", took.Round(time.Millisecond))
}

// setSourceRanges sets the demo Service's spec.loadBalancerSourceRanges
// (nil: clears them).
func setSourceRanges(t *testing.T, l *lab.Lab, ranges []string) {
	t.Helper()
	b, err := json.Marshal(map[string]any{"spec": map[string]any{"loadBalancerSourceRanges": ranges}})
	if err != nil {
		t.Fatal(err)
	}
	patchService(t, l, lab.DemoService, string(b))
}

// setSourceRangesAndWait sets the ranges and waits until the client is
// admitted (or not) on every node; it returns how long that took from the
// patch.
func setSourceRangesAndWait(t *testing.T, l *lab.Lab, addr netip.AddrPort, admitted bool, ranges ...string) time.Duration {
	t.Helper()
	start := time.Now()
	setSourceRanges(t, l, ranges)
	return waitAdmitted(t, l, addr, admitted, start)
}

// waitAdmitted opens new connections from the client to addr, one every
// 50 ms, until 20 in a row (ECMP spreads them over the nodes) are admitted
// or, with admitted false, dropped; it returns the time from start to the
// first of those 20. The 20 s bound is a guard against a hang, not a
// figure.
func waitAdmitted(t *testing.T, l *lab.Lab, addr netip.AddrPort, admitted bool, start time.Time) time.Duration {
	t.Helper()
	const streak = 20
	var first time.Time
	n := 0
	for deadline := start.Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		at := time.Now()
		if dialed(t.Context(), l, addr) != admitted {
			n = 0
			continue
		}
		if n == 0 {
			first = at
		}
		if n++; n == streak {
			return first.Sub(start)
		}
	}
	t.Fatalf("client to %s: not %d connections in a row %s within 20s", addr, streak, map[bool]string{true: "admitted", false: "dropped"}[admitted])
	return 0
}

// dialed reports whether a TCP connection from the client to addr opens
// within 300 ms (a dropped SYN does not).
func dialed(ctx context.Context, l *lab.Lab, addr netip.AddrPort) bool {
	ctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	c, err := l.ClientNS.DialContext(ctx, "tcp", addr.String())
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// getOnce GETs url once through get and returns the first line of the
// output: the answer or the error.
func getOnce(ctx context.Context, t *testing.T, get func(context.Context, ...string) (string, error), url string) string {
	t.Helper()
	out, err := get(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(strings.TrimSpace(out), "\n")
	return first
}

// nodeGet GETs url once from node n's own network namespace.
func nodeGet(ctx context.Context, t *testing.T, n *lab.Node, url string) string {
	t.Helper()
	return getOnce(ctx, t, func(ctx context.Context, urls ...string) (string, error) {
		return n.Exec(ctx, append([]string{"/opt/vipcast/bin/lab-backend", "-get"}, urls...)...)
	}, url)
}
