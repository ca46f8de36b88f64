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

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/vipcast/vipcast/test/lab"
	"github.com/vipcast/vipcast/test/routers"
)

// gettingStartedVIP is the address docs/getting-started.md says the
// Service gets: the lowest of its pool 192.0.2.0/24 once avoidBuggyIPs
// skips .0.
const gettingStartedVIP = "192.0.2.1"

// gettingStarted follows docs/getting-started.md from step 2 on, the
// lab's cluster standing in for the reader's, and times it: the page's
// shell commands run as the page writes them (with the few edits of
// lab.GettingStartedEdits, each saying why), its YAML saved under the names
// its commands apply, its FRR configuration loaded into the ToR, and what
// the page says each check shows is asserted on what the commands print.
//
// First the cluster is made one without vipcast, the way
// docs/operations.md's Uninstall says (removeVipcast), and the ToR's BGP
// configuration is removed, so that only the page's configures it.
func gettingStarted(t *testing.T, l *lab.Lab) {
	ctx := t.Context()
	removeVipcast(t, l)
	if out, err := l.ToR.Vtysh("configure terminal", fmt.Sprintf("no router bgp %d", lab.ToRASN)); err != nil {
		t.Fatalf("removing the lab's BGP configuration from the ToR: %v: %s", err, out)
	}

	root := repoRootT(t)
	page, err := lab.ReadPage(filepath.Join(root, lab.GettingStartedPage))
	if err != nil {
		t.Fatal(err)
	}
	version, err := lab.ChartVersion(upgradeTag)
	if err != nil {
		t.Fatal(err)
	}
	edits := lab.GettingStartedEdits(l.Registry(), version)
	for _, e := range edits {
		t.Logf("the lab runs %q where the page says %q: %s", e.To, e.From, e.Why)
	}
	if err := page.Apply(edits); err != nil {
		t.Fatal(err)
	}
	s := &pageShell{t: t, l: l, page: page, dir: t.TempDir()}
	start := time.Now()
	var took []string
	mark := func(what string) {
		took = append(took, fmt.Sprintf("%s %s", what, time.Since(start).Round(time.Second)))
		t.Logf("getting started: %s, %s after the install began", what, time.Since(start).Round(time.Second))
	}

	// 2. Install the chart.
	step := s.step("2. ")
	s.env = s.block(step, "sh", 0).Text // REGISTRY=… VERSION=…, before every command
	s.save(step, s.block(step, "yaml", 0), s.block(step, "sh", 1))
	s.run(ctx, s.block(step, "sh", 1), 3*time.Minute)
	checks := s.commands(s.block(step, "sh", 2))
	s.eventually(ctx, "both parts run and every node is initialized", 5*time.Minute, func(ctx context.Context) (string, error) {
		outs, err := s.runAll(ctx, checks)
		if err != nil {
			return strings.Join(outs, "\n"), err
		}
		pods, lease, nodes := outs[0], outs[1], outs[2]
		if n := linesWithAll(pods, "vipcast-speaker-", "Running", "1/1"); n != len(l.Nodes) {
			return pods, fmt.Errorf("%d vipcast-speaker pods Running and Ready, want one per node (%d)", n, len(l.Nodes))
		}
		if linesWithAll(pods, "vipcast-ccm-", "Running", "1/1") == 0 {
			return pods, fmt.Errorf("no vipcast-ccm pod Running and Ready")
		}
		// The holder is "POD_UUID"; a holder left by an earlier
		// installation's pod does not count.
		if h, ok := lab.TableCell(lease, "vipcast-ccm", "HOLDER"); !ok || !strings.HasPrefix(h, "vipcast-ccm-") || lineOf(pods, strings.Split(h, "_")[0]) == "" {
			return lease + pods, fmt.Errorf("the Lease vipcast-ccm has holder %q, want one of the vipcast-ccm pods running", h)
		}
		for _, n := range l.Nodes {
			line := lineOf(nodes, n.Name)
			if !strings.Contains(line, "vipcast://"+n.Name) || strings.Contains(line, "uninitialized") {
				return nodes, fmt.Errorf("node %s: %q, want provider ID vipcast://%s and no uninitialized taint", n.Name, line, n.Name)
			}
		}
		return "", nil
	})
	mark("installed, every node initialized and every speaker Ready")

	// 3. One IPPool.
	step = s.step("3. ")
	pool := s.block(step, "sh", 0)
	s.save(step, s.block(step, "yaml", 0), pool)
	cmds := s.commands(pool)
	s.runCommand(ctx, cmds[0], time.Minute)
	s.eventually(ctx, "the IPPool is READY", time.Minute, func(ctx context.Context) (string, error) {
		out, err := s.runCommand1(ctx, cmds[1])
		if err != nil {
			return out, err
		}
		if r, _ := lab.TableCell(out, "public", "READY"); r != "True" {
			return out, fmt.Errorf("IPPool public READY %q, want True", r)
		}
		return "", nil
	})
	mark("the pool READY")

	// 4. One BGPPeer: its Secret in the namespace step 2's values made
	// the chart create.
	step = s.step("4. ")
	peer := s.block(step, "sh", 0)
	s.save(step, s.block(step, "yaml", 0), peer)
	s.run(ctx, peer, time.Minute)

	// 5. The router's side.
	step = s.step("5. ")
	frr := filepath.Join(s.dir, "frr.conf")
	if err := os.WriteFile(frr, []byte(s.block(step, "", 0).Text), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := l.ToR.Vtysh("configure terminal"); err != nil { // the ToR answers
		t.Fatalf("vtysh: %v: %s", err, out)
	}
	if out, err := l.Shell(ctx, s.dir, s.vtyshFunc()+"vtysh -f frr.conf"); err != nil {
		t.Fatalf("loading the page's FRR configuration into the ToR: %v: %s", err, out)
	}
	checks = s.commands(s.block(step, "sh", 0))
	s.eventually(ctx, "every node's session is Established, as the page's four commands show", 3*time.Minute, func(ctx context.Context) (string, error) {
		outs, err := s.runAll(ctx, checks)
		if err != nil {
			return strings.Join(outs, "\n"), err
		}
		peers, describe, metrics, summary := outs[0], outs[1], outs[2], outs[3]
		want := fmt.Sprint(len(l.Nodes))
		if e, _ := lab.TableCell(peers, "tor-a", "ESTABLISHED"); e != want {
			return peers, fmt.Errorf("BGPPeer tor-a ESTABLISHED %q, want %s", e, want)
		}
		if n, _ := lab.TableCell(peers, "tor-a", "NODES"); n != want {
			return peers, fmt.Errorf("BGPPeer tor-a NODES %q, want %s", n, want)
		}
		if c := strings.Count(describe, "SessionEstablished"); c == 0 {
			return describe, fmt.Errorf("no SessionEstablished Event on BGPPeer tor-a")
		}
		if !regexp.MustCompile(`(?m)^vipcast_bgp_session_up\{[^}]*\} 1$`).MatchString(metrics) {
			return metrics, fmt.Errorf("vipcast_bgp_session_up is not 1 on every node")
		}
		for _, n := range l.Nodes {
			if !strings.Contains(summary, n.Addr.String()) {
				return summary, fmt.Errorf("the router's summary has no line for %s", n.Addr)
			}
		}
		return "", nil
	})
	mark("every node's session Established")

	// 6. See it work.
	step = s.step("6. ")
	s.run(ctx, s.block(step, "sh", 0), time.Minute)
	checks = s.commands(s.block(step, "sh", 1))
	s.eventually(ctx, "the VIP answers from behind the router, as the page's four commands show", 4*time.Minute, func(ctx context.Context) (string, error) {
		outs, err := s.runAll(ctx, checks)
		if err != nil {
			return strings.Join(outs, "\n"), err
		}
		svc, statuses, route, answer := outs[0], outs[1], outs[2], outs[3]
		if ip, _ := lab.TableCell(svc, "web", "EXTERNAL-IP"); ip != gettingStartedVIP {
			return svc, fmt.Errorf("Service web EXTERNAL-IP %q, want %s", ip, gettingStartedVIP)
		}
		for _, n := range l.Nodes {
			if a, _ := lab.TableCell(statuses, n.Name, "ANNOUNCED"); a == "" || a == "0" {
				return statuses, fmt.Errorf("SpeakerStatus %s ANNOUNCED %q, want the VIP among its prefixes", n.Name, a)
			}
			if !strings.Contains(route, n.Addr.String()) {
				return route, fmt.Errorf("the router has no path through %s", n.Addr)
			}
		}
		// curl's progress meter goes to stderr, joined here; the answer
		// is its own line, naming the pod.
		if !slices.ContainsFunc(strings.Split(answer, "\n"), func(l string) bool { return strings.HasPrefix(l, "web-") }) {
			return answer, fmt.Errorf("the client's request was not answered by a pod of web")
		}
		return "", nil
	})
	mark("the VIP answering the client")

	describe, err := l.Kubectl(ctx, "describe", "service", "web")
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range []string{"EnsuringLoadBalancer", "EnsuredLoadBalancer"} {
		if !strings.Contains(describe, ev) {
			t.Errorf("kubectl describe service web has no %s Event:\n%s", ev, describe)
		}
	}
	why, err := l.Kubectl(ctx, "vipcast", "why", "web")
	if err != nil {
		t.Fatal(err)
	}
	peers, err := l.Kubectl(ctx, "vipcast", "peers")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range l.Nodes {
		if !strings.Contains(why, n.Name) || !strings.Contains(peers, n.Name) {
			t.Errorf("kubectl vipcast why web and peers should name %s:\n%s\n%s", n.Name, why, peers)
		}
	}
	t.Logf("getting started, from helm install to the VIP answering, following only %s: %s", lab.GettingStartedPage, strings.Join(took, "; "))
}

// removeVipcast removes vipcast and what it leaves from the cluster, the
// way docs/operations.md's Uninstall says: with vipcast-ccm running, the
// LoadBalancer Services and then the IPPools deleted (it removes their
// finalizers), helm uninstall; without it (the lifecycle scenario
// uninstalled it with a Service left), their finalizers removed by hand.
// Then the password namespace and the CRDs.
func removeVipcast(t *testing.T, l *lab.Lab) {
	ctx := t.Context()
	client := l.CP.Client
	_, err := l.Helm(ctx, "status", lab.Release, "-n", lab.VipcastNamespace)
	installed := err == nil
	unfinalize := []byte(`{"metadata":{"finalizers":null}}`)
	svcs, err := client.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, svc := range svcs.Items {
		if svc.Spec.Type != v1.ServiceTypeLoadBalancer {
			continue
		}
		if !installed {
			if _, err := client.CoreV1().Services(svc.Namespace).Patch(ctx, svc.Name, types.MergePatchType, unfinalize, metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		if err := client.CoreV1().Services(svc.Namespace).Delete(ctx, svc.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		if _, err := l.Kubectl(ctx, "-n", svc.Namespace, "wait", "--for=delete", "service/"+svc.Name, "--timeout=2m"); err != nil {
			t.Fatal(err)
		}
	}
	pools, err := l.Kubectl(ctx, "get", "ippools.vipcast.io", "-o", "name")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range strings.Fields(pools) {
		if !installed {
			if _, err := l.Kubectl(ctx, "patch", p, "--type=merge", "-p", string(unfinalize)); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := l.Kubectl(ctx, "delete", p, "--timeout=2m"); err != nil {
			t.Fatal(err)
		}
	}
	if installed {
		if _, err := l.Helm(ctx, "uninstall", lab.Release, "-n", lab.VipcastNamespace, "--wait", "--timeout", "3m"); err != nil {
			t.Fatal(err)
		}
	}
	for _, args := range [][]string{
		{"delete", "namespace", lab.PasswordNamespace, "--ignore-not-found", "--timeout=2m"},
		{"delete", "crd", "ippools.vipcast.io", "bgppeers.vipcast.io", "speakerstatuses.vipcast.io", "nodetunnels.vipcast.io", "--timeout=2m"},
	} {
		if out, err := l.Kubectl(ctx, args...); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
	}
	t.Logf("vipcast removed as docs/operations.md says (it was %s): no LoadBalancer Service, IPPool, CRD or password namespace left", map[bool]string{true: "installed", false: "uninstalled already"}[installed])
}

// pageShell runs a doc page's commands in the lab.
type pageShell struct {
	t    *testing.T
	l    *lab.Lab
	page *lab.Page
	dir  string // where the page's files are saved and its commands run
	env  string // shell lines run before each command (the page's variables)
}

func (s *pageShell) step(prefix string) []lab.PageBlock {
	s.t.Helper()
	b, err := s.page.Step(prefix)
	if err != nil {
		s.t.Fatal(err)
	}
	return b
}

func (s *pageShell) block(blocks []lab.PageBlock, lang string, i int) lab.PageBlock {
	s.t.Helper()
	b, err := lab.Block(blocks, lang, i)
	if err != nil {
		s.t.Fatal(err)
	}
	return b
}

func (s *pageShell) commands(b lab.PageBlock) []string { return lab.Commands(b.Text) }

// save writes b under the name the page gives it (lab.FileNamed), from its
// first line or the commands of next.
func (s *pageShell) save(blocks []lab.PageBlock, b, next lab.PageBlock) {
	s.t.Helper()
	name := lab.FileNamed(b, s.commands(next))
	if name == "" {
		s.t.Fatalf("%s:%d: the page names no file for this block (section %q)", s.page.Path, b.Line, blocks[0].Section)
	}
	if err := os.WriteFile(filepath.Join(s.dir, name), []byte(b.Text), 0o600); err != nil {
		s.t.Fatal(err)
	}
}

// run runs every command of b, failing the test on the first error.
func (s *pageShell) run(ctx context.Context, b lab.PageBlock, timeout time.Duration) {
	s.t.Helper()
	for _, c := range s.commands(b) {
		s.runCommand(ctx, c, timeout)
	}
}

func (s *pageShell) runCommand(ctx context.Context, c string, timeout time.Duration) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out, err := s.runCommand1(ctx, c)
	if err != nil {
		s.t.Fatalf("the page's command %q: %v\n%s", c, err, out)
	}
	s.t.Logf("$ %s\n%s", c, strings.TrimRight(out, "\n"))
}

// runAll runs each command, each bounded, and returns their outputs.
func (s *pageShell) runAll(ctx context.Context, cmds []string) ([]string, error) {
	outs := make([]string, len(cmds))
	for i, c := range cmds {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		out, err := s.runCommand1(cctx, c)
		cancel()
		outs[i] = "$ " + c + "\n" + out
		if err != nil {
			return outs, fmt.Errorf("%q: %w", c, err)
		}
		outs[i] = out
	}
	return outs, nil
}

// runCommand1 runs one of the page's commands where its comment says: "on
// a node" on each node's own shell with <node-ip> its address (the
// outputs joined), "at the router" on the host with vtysh bound to the
// ToR's FRR, "from a client" in the client's namespace, otherwise on the
// host as the cluster's admin.
func (s *pageShell) runCommand1(ctx context.Context, c string) (string, error) {
	switch {
	case strings.Contains(c, "# on a node"):
		var all strings.Builder
		for _, n := range s.l.Nodes {
			out, err := n.Exec(ctx, "sh", "-c", strings.ReplaceAll(c, "<node-ip>", n.Addr.String()))
			all.WriteString(out)
			if err != nil {
				return all.String(), fmt.Errorf("on %s: %w", n.Name, err)
			}
		}
		return all.String(), nil
	case strings.Contains(c, "# at the router"):
		return s.l.Shell(ctx, s.dir, s.env+s.vtyshFunc()+c)
	case strings.Contains(c, "# from a client"):
		return s.l.Shell(ctx, s.dir, fmt.Sprintf("ip netns exec %s bash -c %s", s.l.ClientNS.Name, shellQuote("curl() { command curl --max-time 5 \"$@\"; }\n"+c)))
	}
	return s.l.Shell(ctx, s.dir, s.env+c)
}

// vtyshFunc makes the page's vtysh reach the ToR's FRR, whose sockets are
// in its own directory.
func (s *pageShell) vtyshFunc() string {
	return fmt.Sprintf("vtysh() { command %s --vty_socket %s --config_dir %s \"$@\"; }\n", routers.Vtysh, s.l.ToR.Dir, s.l.ToR.Dir)
}

// eventually polls check every 2 s until it returns no error, failing the
// test with its last error and output once timeout passes.
func (s *pageShell) eventually(ctx context.Context, what string, timeout time.Duration, check func(context.Context) (string, error)) {
	s.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		out, err := check(ctx)
		if err == nil {
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			s.t.Fatalf("%s: not within %v: %v\n%s", what, timeout, err, out)
		}
		time.Sleep(2 * time.Second)
	}
}

// linesWithAll counts the lines of out holding every one of subs.
func linesWithAll(out string, subs ...string) int {
	n := 0
	for _, l := range strings.Split(out, "\n") {
		if !slices.ContainsFunc(subs, func(s string) bool { return !strings.Contains(l, s) }) {
			n++
		}
	}
	return n
}

// lineOf is the first line of out whose first field is name.
func lineOf(out, name string) string {
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == name {
			return l
		}
	}
	return ""
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func repoRootT(t *testing.T) string {
	t.Helper()
	out, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(out, "../..")
}
