// Command node is what a lab node's VM runs (see package
// github.com/vipcast/vipcast/test/lab): it plays the parts a kubelet and a
// CNI plugin play on a real node, then runs the real vipcast-speaker.
//
//   - eth0 gets the node's address on the rack network and a default route
//     to the ToR; routes to the other nodes' pod ranges go via those nodes
//     (a flat "host-gw" pod network);
//   - every pod is a network namespace on the bridge cbr0 running an HTTP
//     server on :8080 that answers with its name, its node and the client
//     address it saw;
//   - vipcast-speaker runs as a child with the arguments after "--";
//   - a control server on the node's address (:9000) lets the host read the
//     IPVS table (GET /state) and signal or restart the speaker
//     (POST /speaker?signal=TERM|STOP|CONT|KILL, POST /speaker?start=1).
//
// It is built static (CGO_ENABLED=0) and runs as root in the guest.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vipcast/vipcast/test/lab/nodeapi"
	tnetns "github.com/vipcast/vipcast/test/netns"
)

// Pod is one backend on this node.
type Pod struct {
	Name string
	Addr netip.Addr
}

type config struct {
	nodeapi.NetFlags
	name        string
	pods        []Pod
	control     string
	speaker     string
	speakerArgs []string
}

func main() {
	cfg, err := parse(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "lab-node:", err)
		os.Exit(2)
	}
	if err := run(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "lab-node:", err)
		os.Exit(1)
	}
}

func parse(args []string) (*config, error) {
	fs := flag.NewFlagSet("lab-node", flag.ContinueOnError)
	var pods string
	cfg := &config{}
	fs.StringVar(&cfg.name, "name", "", "node name")
	cfg.Register(fs, "this node's pod range; the bridge takes its first address")
	fs.StringVar(&pods, "pods", "", "name=address,... of the pods to run")
	fs.StringVar(&cfg.control, "control-port", nodeapi.Port, "port of the control server on the node address")
	fs.StringVar(&cfg.speaker, "speaker", "/vm/bin/vipcast-speaker", "the speaker binary")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	cfg.speakerArgs = fs.Args()
	if err := cfg.Parse(); err != nil {
		return nil, err
	}
	for _, kv := range strings.Split(pods, ",") {
		if kv == "" {
			continue
		}
		name, a, ok := strings.Cut(kv, "=")
		ip, err := netip.ParseAddr(a)
		if !ok || err != nil || !cfg.PodCIDR.Contains(ip) {
			return nil, fmt.Errorf("-pods: %q is not name=address inside %s", kv, cfg.PodCIDR)
		}
		cfg.pods = append(cfg.pods, Pod{Name: name, Addr: ip})
	}
	return cfg, nil
}

func run(cfg *config) error {
	for _, s := range []string{"net/ipv4/ip_forward", "net/ipv4/conf/all/rp_filter", "net/ipv4/conf/default/rp_filter"} {
		v := "1"
		if strings.HasSuffix(s, "rp_filter") {
			v = "0"
		}
		if err := os.WriteFile("/proc/sys/"+s, []byte(v), 0o644); err != nil {
			return fmt.Errorf("sysctl %s: %w", s, err)
		}
	}
	nl, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("rtnetlink: %w", err)
	}
	if err := nodeapi.Uplink(nl, cfg.NetFlags); err != nil {
		return err
	}
	br, err := bridge(nl, cfg)
	if err != nil {
		return err
	}
	for i, p := range cfg.pods {
		if err := startPod(nl, br, cfg, i, p); err != nil {
			return fmt.Errorf("pod %s: %w", p.Name, err)
		}
	}
	fmt.Printf("lab-node: %s up: %s, pods %v\n", cfg.name, cfg.Addr, cfg.pods)

	sp := &speaker{path: cfg.speaker, args: cfg.speakerArgs}
	if err := sp.start(); err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /state", nodeapi.StateHandler)
	mux.HandleFunc("POST /speaker", sp.handle)
	srv := &http.Server{Addr: net.JoinHostPort(cfg.Addr.Addr().String(), cfg.control), Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	fmt.Printf("lab-node: control server on %s\n", srv.Addr)
	return srv.ListenAndServe()
}

// bridge creates cbr0 with the pod range's first address.
func bridge(nl *netlink.Handle, cfg *config) (netlink.Link, error) {
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "cbr0"}}
	if err := nl.LinkAdd(br); err != nil {
		return nil, fmt.Errorf("bridge cbr0: %w", err)
	}
	gw := netip.PrefixFrom(cfg.PodCIDR.Addr().Next(), cfg.PodCIDR.Bits())
	if err := nl.AddrAdd(br, &netlink.Addr{IPNet: nodeapi.IPNet(gw)}); err != nil {
		return nil, fmt.Errorf("cbr0 address: %w", err)
	}
	return br, nl.LinkSetUp(br)
}

// startPod makes the pod's namespace, wires it to the bridge and serves
// HTTP on :8080 inside it.
func startPod(nl *netlink.Handle, br netlink.Link, cfg *config, i int, p Pod) error {
	peer := fmt.Sprintf("vp%d", i)
	ns, err := podVeth(nl, br, fmt.Sprintf("veth%d", i), peer)
	if err != nil {
		return err
	}
	addr := netip.PrefixFrom(p.Addr, cfg.PodCIDR.Bits())
	if err := podNetwork(ns, peer, addr, cfg.PodCIDR.Addr().Next()); err != nil {
		return err
	}
	return servePod(ns, cfg.name, p)
}

// podVeth creates a new network namespace and a veth pair, host on the
// bridge br and up, peer moved into the namespace.
func podVeth(nl *netlink.Handle, br netlink.Link, host, peer string) (netns.NsHandle, error) {
	if err := nl.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: host, MasterIndex: br.Attrs().Index}, PeerName: peer}); err != nil {
		return 0, fmt.Errorf("veth: %w", err)
	}
	h, err := nl.LinkByName(host)
	if err != nil {
		return 0, err
	}
	if err := nl.LinkSetUp(h); err != nil {
		return 0, err
	}
	ns, err := newNS()
	if err != nil {
		return 0, err
	}
	pl, err := nl.LinkByName(peer)
	if err != nil {
		return 0, err
	}
	if err := nl.LinkSetNsFd(pl, int(ns)); err != nil {
		return 0, fmt.Errorf("moving %s: %w", peer, err)
	}
	return ns, nil
}

// podNetwork configures the pod's namespace ns: the veth end peer becomes
// eth0 with addr, lo and eth0 go up, and the default route goes via gw
// (the bridge).
func podNetwork(ns netns.NsHandle, peer string, addr netip.Prefix, gw netip.Addr) error {
	pn, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return err
	}
	defer pn.Close()
	pl, err := pn.LinkByName(peer)
	if err != nil {
		return err
	}
	if err := pn.LinkSetName(pl, "eth0"); err != nil {
		return err
	}
	if err := pn.AddrAdd(pl, &netlink.Addr{IPNet: nodeapi.IPNet(addr)}); err != nil {
		return err
	}
	for _, name := range []string{"lo", "eth0"} {
		l, err := pn.LinkByName(name)
		if err != nil {
			return err
		}
		if err := pn.LinkSetUp(l); err != nil {
			return err
		}
	}
	if err := pn.RouteAdd(&netlink.Route{LinkIndex: pl.Attrs().Index, Gw: gw.AsSlice()}); err != nil {
		return fmt.Errorf("pod default route: %w", err)
	}
	return nil
}

// servePod serves HTTP on the backend port inside the pod's namespace ns,
// answering with the pod's name, the node's name and the client's address.
func servePod(ns netns.NsHandle, node string, p Pod) error {
	var ln net.Listener
	err := tnetns.Do(int(ns), func() (err error) {
		ln, err = net.Listen("tcp", fmt.Sprintf(":%d", nodeapi.BackendPort))
		return err
	})
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			client, _, _ := net.SplitHostPort(r.RemoteAddr)
			// Plain text naming the peer's address, not request content.
			_, _ = fmt.Fprintf(w, "%s on %s, client %s\n", p.Name, node, client) //nolint:gosec // G705: see above
		}),
		ReadHeaderTimeout: 5 * time.Second,
	}
	go func() { _ = srv.Serve(ln) }()
	return serveUDP(ns, node, p)
}

// serveUDP answers every datagram to the backend port inside the pod's
// namespace ns with the same line as HTTP: pod, node and the client's
// address.
func serveUDP(ns netns.NsHandle, node string, p Pod) error {
	var pc net.PacketConn
	err := tnetns.Do(int(ns), func() (err error) {
		pc, err = net.ListenPacket("udp", fmt.Sprintf(":%d", nodeapi.BackendPort))
		return err
	})
	if err != nil {
		return err
	}
	go func() {
		buf := make([]byte, 1500)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			client, _, _ := net.SplitHostPort(from.String())
			_, _ = pc.WriteTo([]byte(fmt.Sprintf("%s on %s, client %s\n", p.Name, node, client)), from)
		}
	}()
	return nil
}

// newNS creates a network namespace without leaving this one; the pod's
// handle stays open for the life of the process.
func newNS() (netns.NsHandle, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return 0, err
	}
	defer func() { _ = orig.Close() }()
	ns, err := netns.New() // this thread is now in it
	if err != nil {
		return 0, fmt.Errorf("new netns: %w", err)
	}
	if err := netns.Set(orig); err != nil {
		return 0, fmt.Errorf("back to the node's namespace: %w", err)
	}
	return ns, nil
}

// speaker runs vipcast-speaker as a child, its output on the console.
type speaker struct {
	path string
	args []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

func (s *speaker) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done != nil {
		select {
		case <-s.done:
		default:
			return errors.New("the speaker is running")
		}
	}
	cmd := exec.Command(s.path, s.args...)
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", s.path, err)
	}
	done := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			fmt.Printf("speaker| %s\n", sc.Text())
		}
	}()
	go func() {
		err := cmd.Wait()
		_ = pw.Close()
		fmt.Printf("lab-node: speaker exited: %v\n", err)
		close(done)
	}()
	s.cmd, s.done = cmd, done
	fmt.Printf("lab-node: speaker started (pid %d)\n", cmd.Process.Pid)
	return nil
}

func (s *speaker) handle(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Get("start") != "" {
		if err := s.start(); err != nil {
			http.Error(w, err.Error(), http.StatusConflict)
			return
		}
		_, _ = fmt.Fprintln(w, "started")
		return
	}
	sig, ok := map[string]syscall.Signal{"TERM": syscall.SIGTERM, "STOP": syscall.SIGSTOP, "CONT": syscall.SIGCONT, "KILL": syscall.SIGKILL}[r.URL.Query().Get("signal")]
	if !ok {
		http.Error(w, "want ?signal=TERM|STOP|CONT|KILL or ?start=1", http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil {
		http.Error(w, "no speaker", http.StatusConflict)
		return
	}
	if err := cmd.Process.Signal(sig); err != nil {
		http.Error(w, err.Error(), http.StatusConflict)
		return
	}
	if r.URL.Query().Get("wait") != "" {
		ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
		defer cancel()
		select {
		case <-done:
		case <-ctx.Done():
			http.Error(w, "the speaker did not exit within 30s", http.StatusGatewayTimeout)
			return
		}
	}
	_, _ = fmt.Fprintln(w, "ok")
}
