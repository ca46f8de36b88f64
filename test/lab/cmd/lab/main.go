// Command lab runs vipcast end to end on this machine (`make lab`): a real
// cluster — etcd, kube-apiserver, kube-controller-manager and
// kube-scheduler on the host, two node VMs with containerd, a kubelet
// (--cloud-provider=external) and kube-proxy — with vipcast installed by
// `helm install`, an FRR ToR and a client (see package
// github.com/vipcast/vipcast/test/lab, Options.Cluster). It creates an
// IPPool, a BGPPeer and a Deployment behind a LoadBalancer Service, prints
// what a user wants to see, and keeps everything up until Ctrl-C or `lab
// down` (`make lab-down`), which tear it all down.
//
//	lab [-dir _output/lab] [-proxy-mode iptables|nftables|ipvs] [-upstream]   start, show, wait
//	lab down [-dir _output/lab]     stop a running lab, remove its leftovers
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vipcast/vipcast/test/controlplane"
	"github.com/vipcast/vipcast/test/harness"
	"github.com/vipcast/vipcast/test/lab"
	"github.com/vipcast/vipcast/test/lab/nodeapi"
	"github.com/vipcast/vipcast/test/netns"
)

func main() {
	args := os.Args[1:]
	cmd := "up"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	fs := flag.NewFlagSet("lab "+cmd, flag.ContinueOnError)
	dir := fs.String("dir", "_output/lab", "directory for binaries, logs, the kubeconfig and the pid file")
	proxyMode := fs.String("proxy-mode", "iptables", "kube-proxy's mode on the real cluster's nodes: iptables, nftables or ipvs")
	upstream := fs.Bool("upstream", false, "import the images of Kubernetes' own e2e suite (agnhost, pause) into the nodes, so that e2e.test (make e2e-tools) runs from the client")
	if err := fs.Parse(args); err != nil {
		os.Exit(2)
	}
	var err error
	switch cmd {
	case "up":
		err = up(*dir, lab.Options{Cluster: lab.ClusterOptions{ProxyMode: *proxyMode, Upstream: *upstream}})
	case "down":
		err = down(*dir)
	default:
		err = fmt.Errorf("unknown command %q: want up or down", cmd)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "lab:", err)
		os.Exit(1)
	}
}

func say(format string, args ...any) {
	fmt.Printf("%s %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func up(dir string, opts lab.Options) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	pidFile := filepath.Join(dir, "lab.pid")
	if pid, err := readPid(pidFile); err == nil && netns.Alive(pid) {
		return fmt.Errorf("a lab is already running (pid %d): `make lab-down` first", pid)
	}
	_ = os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return err
	}
	defer func() { _ = os.Remove(pidFile) }()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	r := harness.NewRunner(func(format string, args ...any) { say(format, args...) })
	defer func() {
		say("==> tearing down: VMs, FRR, vipcast-ccm, control plane, namespaces")
		r.Close()
		say("==> done")
	}()

	var l *lab.Lab
	ready := make(chan error, 1)
	go func() {
		ready <- r.Run(func(t harness.T) {
			bfd := lab.DefaultBFD
			opts.Dir, opts.BFD, opts.PeerBFD, opts.Logf = dir, &bfd, true, func(format string, args ...any) { say(format, args...) }
			l = lab.Up(t, opts)
			show(ctx, t, l, dir)
		})
	}()
	select {
	case err := <-ready:
		if err != nil {
			return err
		}
	case <-ctx.Done():
		say("==> interrupted while starting")
		return nil
	}
	say("==> the lab is up. Ctrl-C here or `make lab-down` elsewhere tears it down.")
	<-ctx.Done()
	return nil
}

// show creates the demo objects and prints what a user wants to see.
func show(ctx context.Context, t harness.T, l *lab.Lab, dir string) {
	kubeconfig := filepath.Join(dir, "kubeconfig")
	data, err := os.ReadFile(l.CP.Kubeconfig)
	if err == nil {
		err = os.WriteFile(kubeconfig, data, 0o600)
	}
	if err != nil {
		t.Fatal(err)
	}
	vip := publish(ctx, t, l)
	kubectl := filepath.Join(controlplane.BinDir(), "kubectl")
	showCluster(ctx, l, kubeconfig, kubectl, vip)
	showNodes(ctx, l)
	addr := netip.AddrPortFrom(vip, 80)
	showRequests(ctx, l, addr)
	fmt.Printf(`
Try it yourself:
  KUBECONFIG=%s %s get svc -A
  ip netns exec %s curl -s http://%s/              # the client, behind the ToR
  vtysh --vty_socket %s -c 'show bgp summary'      # the ToR
  Logs: %s (vipcast-ccm, node consoles with the speakers' logs)
  Backends answer on port %d: %s
`, kubeconfig, kubectl, l.ClientNS.Name, addr, l.ToR.Dir, dir, nodeapi.BackendPort, podList(l))
	if l.Opts.Cluster.Upstream {
		fmt.Printf(`Kubernetes' LoadBalancer e2e specs, from the client (-upstream):
  ip netns exec %s %s --kubeconfig %s --kubectl-path %s --provider skeleton \
    --ginkgo.focus '%s'
`, l.ClientNS.Name, lab.E2EBin("e2e.test"), l.NodesKubeconfig(), kubectl, lab.UpstreamLoadBalancerFocus)
	}
}

// publish creates the demo objects and waits until the Service has its
// VIP and the ToR routes it over every node; it returns the VIP.
func publish(ctx context.Context, t harness.T, l *lab.Lab) netip.Addr {
	say("==> creating IPPool %q (%s), BGPPeer %q (the ToR) and LoadBalancer Service %s/%s with 4 endpoints on 2 nodes",
		lab.PoolName, lab.PoolPrefix, lab.PeerName, lab.DemoNamespace, lab.DemoService)
	if err := l.ApplyDemo(ctx); err != nil {
		t.Fatal(err)
	}
	vip, err := l.WaitVIP(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	took, err := l.WaitRoute(ctx, vip, 2*time.Minute, l.Addrs(l.Nodes...)...)
	if err != nil {
		t.Fatal(err)
	}
	say("==> VIP %s published; the ToR has an ECMP route over both nodes (%v after the VIP appeared)", vip, took.Round(time.Millisecond))
	return vip
}

// showCluster shows the cluster through kubectl and the ToR's route and
// BGP entry for vip.
func showCluster(ctx context.Context, l *lab.Lab, kubeconfig, kubectl string, vip netip.Addr) {
	// kubectl finds the plugin kubectl-vipcast next to this program
	// (`make lab` builds both into _output).
	path := os.Getenv("PATH")
	if self, err := os.Executable(); err == nil {
		path = filepath.Dir(self) + string(os.PathListSeparator) + path
	}
	run := func(title string, argv ...string) {
		fmt.Printf("\n$ %s\n", title)
		c := exec.CommandContext(ctx, argv[0], argv[1:]...)
		c.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig, "PATH="+path)
		c.Stdout, c.Stderr = os.Stdout, os.Stdout
		if err := c.Run(); err != nil {
			fmt.Printf("(%s: %v)\n", argv[0], err)
		}
	}
	run("kubectl get nodes -o wide", kubectl, "get", "nodes", "-o", "wide")
	run("kubectl get nodes -o custom-columns=...   (vipcast-ccm initialized them: provider ID set, uninitialized taint gone)",
		kubectl, "get", "nodes", "-o", "custom-columns=NAME:.metadata.name,PROVIDER-ID:.spec.providerID,TAINTS:.spec.taints[*].key")
	run("kubectl get pods -n "+lab.VipcastNamespace+" -o wide   (installed by helm install: the CCM Deployment, the speaker DaemonSet)",
		kubectl, "get", "pods", "-n", lab.VipcastNamespace, "-o", "wide")
	run("kubectl get pods -n "+lab.DemoNamespace+" -o wide", kubectl, "get", "pods", "-n", lab.DemoNamespace, "-o", "wide")
	run("kubectl get ippools.vipcast.io,bgppeers.vipcast.io -o wide", kubectl, "get", "ippools.vipcast.io,bgppeers.vipcast.io", "-o", "wide")
	run("kubectl get svc -n demo -o wide", kubectl, "get", "svc", "-n", lab.DemoNamespace, "-o", "wide")
	run("kubectl get events -n demo", kubectl, "get", "events", "-n", lab.DemoNamespace)
	run("kubectl get speakerstatuses.vipcast.io   (each node's speaker: sessions, prefixes announced, Services not)",
		kubectl, "get", "speakerstatuses.vipcast.io")
	run("kubectl vipcast why "+lab.DemoNamespace+"/"+lab.DemoService, kubectl, "vipcast", "why", lab.DemoNamespace+"/"+lab.DemoService)
	run("kubectl vipcast peers", kubectl, "vipcast", "peers")
	run("(ToR) ip route show "+vip.String(), "ip", "-n", l.TorNS.Name, "route", "show", vip.String())
	run("(ToR) vtysh -c 'show bgp ipv4 unicast "+vip.String()+"'", "vtysh", "--vty_socket", l.ToR.Dir, "-c", "show bgp ipv4 unicast "+vip.String())
	run("(ToR) vtysh -c 'show bfd peers brief'   (a frozen node leaves the ECMP route within 300ms x 3)", "vtysh", "--vty_socket", l.ToR.Dir, "-c", "show bfd peers brief")
}

// showNodes prints every node's IPVS table and the VIPs on its dummy link.
func showNodes(ctx context.Context, l *lab.Lab) {
	for _, n := range l.Nodes {
		st, err := n.State(ctx)
		fmt.Printf("\n$ (%s) IPVS table and VIPs on vipcast0\n", n.Name)
		if err != nil {
			fmt.Printf("(%v)\n", err)
			continue
		}
		for _, s := range st.Services {
			fmt.Printf("%s %s\n", s.Key, s.Scheduler)
			for _, b := range s.Backends {
				fmt.Printf("  -> %s\n", b)
			}
		}
		fmt.Printf("vipcast0: %s\n", strings.Join(st.VIPs, " "))
	}
}

// showRequests sends 8 requests to addr from the client, each on a new
// connection, and prints the answers.
func showRequests(ctx context.Context, l *lab.Lab, addr netip.AddrPort) {
	fmt.Printf("\n$ (client %s) 8 requests to http://%s/, each on a new connection\n", "192.168.50.2", addr)
	for range 8 {
		body, err := l.Get(ctx, addr)
		if err != nil {
			body = "error: " + err.Error()
		}
		fmt.Println(body)
	}
	fmt.Println("(externalTrafficPolicy Cluster: a backend sees the node that forwarded the connection — 10.0.0.1x\n" +
		" when that node is another, 10.244.x.1 when it is its own — so replies go back through it. With\n" +
		" externalTrafficPolicy: Local it would see the client's own 192.168.50.2.)")
}

func podList(l *lab.Lab) string {
	var s []string
	for _, p := range l.Pods() {
		s = append(s, p.Name+"@"+p.Node+"="+p.Addr.String())
	}
	return strings.Join(s, " ")
}

// down stops a running lab and removes anything a killed lab left behind.
func down(dir string) error {
	pid, err := readPid(filepath.Join(dir, "lab.pid"))
	if err == nil && netns.Alive(pid) {
		say("==> stopping the lab (pid %d)", pid)
		_ = syscall.Kill(pid, syscall.SIGTERM)
		deadline := time.Now().Add(60 * time.Second)
		for netns.Alive(pid) && time.Now().Before(deadline) {
			time.Sleep(200 * time.Millisecond)
		}
		if netns.Alive(pid) {
			say("==> the lab did not stop within 60s: killing it")
			_ = syscall.Kill(pid, syscall.SIGKILL)
			for end := time.Now().Add(5 * time.Second); netns.Alive(pid) && time.Now().Before(end); {
				time.Sleep(100 * time.Millisecond)
			}
		}
	} else if !errors.Is(err, os.ErrNotExist) && err != nil {
		return err
	}
	// The lab's namespaces are named after its pid (test/netns); their
	// processes died with it (Pdeathsig).
	netns.SweepDead(func(format string, args ...any) { say("==> "+format, args...) })
	_ = os.Remove(filepath.Join(dir, "lab.pid"))
	say("==> no lab running")
	return nil
}

func readPid(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}
