//go:build routing

package e2e

import (
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vipcast/vipcast/test/ccmtest"
	"github.com/vipcast/vipcast/test/netns"
	"github.com/vipcast/vipcast/test/proc"
	"github.com/vipcast/vipcast/test/routers"
)

// waitNexthops polls the ToR's kernel every 10 ms until its route to vip
// has exactly the gateways want (none: no route), and returns how long
// that took.
func waitNexthops(t testing.TB, tor *routers.FRR, vip netip.Prefix, timeout time.Duration, want ...netip.Addr) time.Duration {
	t.Helper()
	slices.SortFunc(want, netip.Addr.Compare)
	start := time.Now()
	var got []netip.Addr
	for time.Since(start) < timeout {
		routes, err := tor.KernelRoutes(routers.IPv4)
		if err != nil {
			t.Fatal(err)
		}
		got = slices.SortedFunc(slices.Values(routes[vip]), netip.Addr.Compare)
		if slices.Equal(got, want) {
			return time.Since(start)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("ToR kernel route to %s: next hops %v after %v, want %v", vip, got, timeout, want)
	return 0
}

// kubeconfigVia writes a copy of the admin kubeconfig whose server is
// reached at addr (a forwarder the test runs) instead of loopback.
func (e *env) kubeconfigVia(addr string) string {
	e.T.Helper()
	data, err := os.ReadFile(e.CP.Kubeconfig)
	if err != nil {
		e.T.Fatal(err)
	}
	u, err := url.Parse(e.CP.Config.Host)
	if err != nil {
		e.T.Fatal(err)
	}
	path := filepath.Join(e.CP.Dir, "kubeconfig-"+strings.ReplaceAll(addr, ":", "_"))
	rewritten := strings.ReplaceAll(string(data), u.Host, addr)
	if rewritten == string(data) {
		e.T.Fatalf("kubeconfig does not mention %s", u.Host)
	}
	if err := os.WriteFile(path, []byte(rewritten), 0o600); err != nil {
		e.T.Fatal(err)
	}
	return path
}

// fabric is the namespace tier's topology: two nodes, each a network
// namespace running vipcast-speaker, on a bridge in a ToR namespace
// running FRR zebra + bgpd (+ bfdd with BFD), and one published Service
// with an endpoint on node1, whose VIP both nodes announce.
type fabric struct {
	e        *env
	tor      *routers.FRR
	vip      netip.Prefix
	node1    netip.Addr
	node2    netip.Addr
	speakers map[string]*speakerProc

	kubeconfigs [3]string
	nodeNS      [3]*netns.NS
}

// fabricOptions configure a fabric.
type fabricOptions struct {
	// HoldTime and KeepaliveTime of the sessions, on both sides.
	HoldTime, KeepaliveTime time.Duration
	// BFD, when set, runs BFD with these timers on the ToR and in the
	// BGPPeer.
	BFD *routers.BFD
}

// newFabric builds the fabric, starts both speakers and waits for the
// ECMP route over both nodes at the ToR.
func newFabric(t *testing.T, e *env, o fabricOptions) *fabric {
	t.Helper()
	netns.Require(t)
	apiHost := mustHost(t, e.CP.Config.Host)
	torNS := netns.New(t, "tor")
	netns.Bridge(t, torNS, "fabric", "10.0.1.1/24")
	f := &fabric{e: e, node1: netip.MustParseAddr("10.0.1.11"), node2: netip.MustParseAddr("10.0.1.12"),
		vip: netip.MustParsePrefix("10.100.0.10/32"), speakers: map[string]*speakerProc{}}
	var neighbors []routers.FRRNeighbor
	for _, a := range []netip.Addr{f.node1, f.node2} {
		neighbors = append(neighbors, routers.FRRNeighbor{Address: a, ASN: 64501, KeepaliveTime: o.KeepaliveTime, HoldTime: o.HoldTime, BFD: o.BFD})
	}
	f.tor = routers.StartFRR(t, routers.FRRConfig{ASN: 64500, ListenAddress: netip.MustParseAddr("10.0.1.1"),
		Netns: torNS.Name, Zebra: true, Neighbors: neighbors})
	e.mustApplyPools(`apiVersion: vipcast.io/v1alpha1
kind: IPPool
metadata:
  name: fabric
spec:
  addresses: ["10.100.0.0/24"]`)
	peer := fmt.Sprintf(`apiVersion: vipcast.io/v1alpha1
kind: BGPPeer
metadata:
  name: tor
spec:
  peerAddress: 10.0.1.1
  peerASN: 64500
  localASN: 64501
  holdTime: %s
  keepaliveTime: %s
`, o.HoldTime, o.KeepaliveTime)
	if b := o.BFD; b != nil {
		peer += fmt.Sprintf("  bfd:\n    minTx: %s\n    minRx: %s\n    multiplier: %d\n", b.MinTx, b.MinRx, b.Multiplier)
	}
	e.applyPeer(peer)

	for i := 1; i <= 2; i++ {
		name, addr := fmt.Sprintf("node%d", i), fmt.Sprintf("10.0.1.1%d", i)
		ns := netns.New(t, name)
		f.nodeNS[i] = ns
		netns.Veth(t, ns, "eth0", addr+"/24", torNS, name, "")
		netns.Enslave(t, torNS, name, "fabric")
		// A point-to-point management link to the test's namespace, where
		// a forwarder relays to the API server on loopback.
		hostEnd := fmt.Sprintf("169.254.77.%d", 4*i+1)
		netns.Veth(t, nil, fmt.Sprintf("vcm%d-%d", os.Getpid()%10000, i), hostEnd+"/30", ns, "mgmt", fmt.Sprintf("169.254.77.%d/30", 4*i+2))
		fwd := hostEnd + ":" + apiPort(t, apiHost)
		netns.Forward(t, nil, fwd, apiHost)
		f.kubeconfigs[i] = e.kubeconfigVia(fwd)
		e.node(name, nil, addr)
	}
	f.run(t, 1)
	f.run(t, 2)

	e.Namespace("fabric", nil)
	e.publish(ccmtest.LBService("fabric", "web"), "10.100.0.10")
	e.endpoints("fabric", "web", endpoint{node: "node1", ip: "10.244.1.5", ready: true})
	took := waitNexthops(t, f.tor, f.vip, 30*time.Second, f.node1, f.node2)
	t.Logf("ECMP route with both nodes at the ToR %v after the Service was published", took.Round(time.Millisecond))
	return f
}

// run starts node i's speaker in its namespace.
func (f *fabric) run(t *testing.T, i int) *speakerProc {
	t.Helper()
	name := fmt.Sprintf("node%d", i)
	args := f.nodeNS[i].Command(speakerBinary, "--kubeconfig", f.kubeconfigs[i], "--node-name", name,
		"--metrics-bind-address", "0", "--convergence-delay", "2s", "-v", "2",
		"--ipvs=false") // the host kernel may lack IPVS; the dataplane has its own tier
	log := filepath.Join(f.e.CP.Dir, fmt.Sprintf("speaker-%s-%d.log", name, time.Now().UnixNano()))
	p, err := proc.Start(log, args[0], args[1:]...)
	if err != nil {
		t.Fatal(err)
	}
	s := &speakerProc{Process: p, log: log}
	t.Cleanup(func() {
		s.Signal(syscall.SIGCONT)
		s.Stop(5 * time.Second)
		if t.Failed() {
			ccmtest.DumpTail(t, log, 40)
		}
	})
	f.speakers[name] = s
	return s
}

// TestSpeakerFabric is the namespace tier: the ToR kernel gets an ECMP
// route over both nodes; a SIGTERMed speaker's next hop goes at once, a
// frozen node's within the hold time.
func TestSpeakerFabric(t *testing.T) {
	e := newEnv(t)
	const holdTime = 3 * time.Second
	f := newFabric(t, e, fabricOptions{HoldTime: holdTime, KeepaliveTime: time.Second})
	tor, vip, node1, node2, speakers := f.tor, f.vip, f.node1, f.node2, f.speakers

	// SIGTERM: the speaker withdraws before anything else.
	speakers["node1"].Signal(syscall.SIGTERM)
	took := waitNexthops(t, tor, vip, 5*time.Second, node2)
	t.Logf("SIGTERM on node1's speaker: its next hop left the ToR kernel in %v", took.Round(time.Millisecond))
	if took >= time.Second {
		t.Errorf("next hop removed %v after SIGTERM, want under 1s", took)
	}
	select {
	case <-speakers["node1"].Done():
	case <-time.After(10 * time.Second):
		t.Errorf("speaker did not exit within 10s of SIGTERM")
	}

	// Back: both next hops again.
	f.run(t, 1)
	waitNexthops(t, tor, vip, 30*time.Second, node1, node2)

	// A frozen node: no withdraw, no FIN; the ToR drops it on hold timer.
	speakers["node2"].Signal(syscall.SIGSTOP)
	took = waitNexthops(t, tor, vip, holdTime+5*time.Second, node1)
	t.Logf("SIGSTOP on node2's speaker: next hop gone %v later (hold time %v)", took.Round(time.Millisecond), holdTime)
	if took > holdTime+time.Second {
		t.Errorf("frozen node's next hop removed after %v, want within the hold time %v (+1s for zebra)", took, holdTime)
	}
	speakers["node2"].Signal(syscall.SIGCONT)

	// The Service goes: the route goes.
	if err := e.CP.Client.CoreV1().Services("fabric").Delete(t.Context(), "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitNexthops(t, tor, vip, 10*time.Second)
}

func mustHost(t testing.TB, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

func apiPort(t testing.TB, hostport string) string {
	t.Helper()
	i := strings.LastIndex(hostport, ":")
	if i < 0 {
		t.Fatalf("no port in %s", hostport)
	}
	return hostport[i+1:]
}
