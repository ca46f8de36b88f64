//go:build lab

package lab_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vipcast/vipcast/test/lab"
)

// upstreamSkips are the specs of lab.UpstreamLoadBalancerFocus that skip
// themselves when a LoadBalancer's status says ipMode Proxy (vipcast's),
// each with the part of its text that names it and vipcast's own test of
// what it checks. Any other skip fails the scenario.
var upstreamSkips = map[string]string{
	"ExternalTrafficPolicy: Local [Feature:LoadBalancer] should work for type=LoadBalancer": "the client's address kept under Local: TestCluster/{nftables,ipvs,iptables} (clusterWithKubeProxy) and TestCluster/fabric",
	"ExternalTrafficPolicy: Local [Feature:LoadBalancer] should work from pods":             "a pod's own address kept on its way to a Local VIP, whichever node serves it: TestCluster/contract/Hairpin, TestECMPMove/Hairpin (kernel)",
}

// upstreamLabSkips are the specs of lab.UpstreamLoadBalancerFocus that
// skip themselves for the lab's size, with the reason the spec gives: the
// upstream scenario runs on two nodes (the third joins in lifecycle, after
// it). What they check is kube-proxy's, not vipcast's; lifecycle runs them
// again once the third node has joined, where they must pass
// (upstreamThreeNodes).
var upstreamLabSkips = map[string]string{
	"should implement NodePort and HealthCheckNodePort correctly when ExternalTrafficPolicy changes": "needs 3 schedulable nodes; kube-proxy's health check node port, which vipcast does not use (it announces by BGP)",
}

// upstreamFull, set in the environment (make test-upstream), has the
// upstream scenario run the whole of lab.UpstreamLoadBalancerFocus instead
// of lab.UpstreamCIFocus.
const upstreamFull = "VIPCAST_UPSTREAM_FULL"

// upstreamLoadBalancer runs Kubernetes' own LoadBalancer e2e specs
// (e2e.test at the cluster's version) from the client behind the ToR, on
// the cluster as the scenarios before it left it (two tiers, kube-proxy in
// iptables mode): lab.UpstreamCIFocus, or with upstreamFull set the whole
// lab.UpstreamLoadBalancerFocus. Every spec must pass, but for those
// upstreamSkips and upstreamLabSkips list, which must skip; the table of
// results is logged.
func upstreamLoadBalancer(t *testing.T, l *lab.Lab) {
	// The CI part takes ~2 min. The whole focus took 45 min for its
	// first 17 specs (rolling update, Cluster and Local, and source
	// ranges alone 37 min of it), so it gets 90.
	focus, want, budget := lab.UpstreamCIFocus, 5, 45*time.Minute
	if os.Getenv(upstreamFull) != "" {
		focus, want, budget = lab.UpstreamLoadBalancerFocus, 23, 90*time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), budget+5*time.Minute)
	defer cancel()
	dir := filepath.Join(l.Opts.Dir, "upstream")
	start := time.Now()
	results, err := l.RunUpstream(ctx, lab.UpstreamRun{Focus: focus, Dir: dir, Timeout: budget.String()})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("e2e.test: %d specs in %v (log %s)", len(results), time.Since(start).Round(time.Second), filepath.Join(dir, "e2e.log"))
	var b strings.Builder
	for _, r := range results {
		fmt.Fprintf(&b, "\n  %-8s %6.1fs  %s", r.State, r.Seconds, r.Name)
	}
	t.Logf("results:%s", b.String())
	if len(results) != want {
		t.Errorf("%d specs ran, want the %d the focus selects at v1.37.1: did the focus or the suite change?", len(results), want)
	}
	for _, r := range results {
		why, skip := expectedSkip(r.Name)
		switch {
		case r.State == "passed" && !skip:
		case r.State == "skipped" && skip:
			t.Logf("skipped as expected: %s (%s)", r.Name, why)
		case r.State == "passed" && skip:
			t.Errorf("%s passed, but it is listed as skipping itself (%s): update upstreamSkips or upstreamLabSkips", r.Name, why)
		default:
			t.Errorf("%s %s: %s", r.Name, r.State, firstLines(r.Message, 6))
		}
	}
}

// expectedSkip says whether name is one of upstreamSkips or
// upstreamLabSkips, and why.
func expectedSkip(name string) (string, bool) {
	for _, skips := range []map[string]string{upstreamSkips, upstreamLabSkips} {
		for part, why := range skips {
			if strings.Contains(name, part) {
				return why, true
			}
		}
	}
	return "", false
}

// firstLines is s's first n lines.
func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	if len(lines) > n {
		lines = append(lines[:n], "…")
	}
	return strings.Join(lines, "\n")
}

// upstreamThreeNodes runs the specs of upstreamLabSkips, which skip on the
// upstream scenario's two nodes, once lifecycle's third node has joined
// (and the drained node is back): each must pass.
func upstreamThreeNodes(t *testing.T, l *lab.Lab) {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Minute)
	defer cancel()
	var names []string
	for name := range upstreamLabSkips {
		names = append(names, regexp.QuoteMeta(name))
	}
	slices.Sort(names)
	dir := filepath.Join(l.Opts.Dir, "upstream-three-nodes")
	start := time.Now()
	results, err := l.RunUpstream(ctx, lab.UpstreamRun{Focus: strings.Join(names, "|"), Dir: dir, Timeout: "15m"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("e2e.test on three nodes: %d specs in %v (log %s)", len(results), time.Since(start).Round(time.Second), filepath.Join(dir, "e2e.log"))
	if len(results) != len(upstreamLabSkips) {
		t.Errorf("%d specs ran, want the %d of upstreamLabSkips: %v", len(results), len(upstreamLabSkips), results)
	}
	for _, r := range results {
		if r.State != "passed" {
			t.Errorf("on three nodes, %s %s: %s", r.Name, r.State, firstLines(r.Message, 6))
			continue
		}
		t.Logf("on three nodes, passed in %.1fs: %s", r.Seconds, r.Name)
	}
}
