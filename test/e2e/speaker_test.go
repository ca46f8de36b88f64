//go:build routing

package e2e

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/test/ccmtest"
	"github.com/vipcast/vipcast/test/proc"
	"github.com/vipcast/vipcast/test/routers"
)

// speakerProc is a running vipcast-speaker.
type speakerProc struct {
	*proc.Process
	log string
}

// startSpeaker runs vipcast-speaker for node against the control plane,
// with a short convergence delay and status interval; extra flags follow.
func (e *env) startSpeaker(node string, extra ...string) *speakerProc {
	e.T.Helper()
	log := filepath.Join(e.CP.Dir, fmt.Sprintf("speaker-%s-%d.log", node, time.Now().UnixNano()))
	args := append([]string{
		"--kubeconfig", e.CP.Kubeconfig,
		"--node-name", node,
		"--metrics-bind-address", "0",
		"--convergence-delay", "500ms",
		// Counts in the SpeakerStatus within the tests' waits (a session's
		// change is written at once whatever the interval).
		"--status-interval", "2s",
		// Routing only: the speaker runs in the test's own network
		// namespace, whose kernel may lack IPVS (the dataplane has its
		// own tier, in a VM).
		"--ipvs=false",
		"-v", "2",
	}, extra...)
	p, err := proc.Start(log, speakerBinary, args...)
	if err != nil {
		e.T.Fatal(err)
	}
	s := &speakerProc{Process: p, log: log}
	e.T.Cleanup(func() {
		s.Stop(5 * time.Second)
		if e.T.Failed() {
			ccmtest.DumpTail(e.T, log, 60)
		}
	})
	return s
}

// node registers a Node with the given InternalIPs and labels.
func (e *env) node(name string, labels map[string]string, addrs ...string) {
	e.T.Helper()
	ctx := context.Background()
	n, err := e.CP.Client.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
	if err != nil {
		e.T.Fatalf("node %s: %v", name, err)
	}
	for _, a := range addrs {
		n.Status.Addresses = append(n.Status.Addresses, v1.NodeAddress{Type: v1.NodeInternalIP, Address: a})
	}
	n.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}}
	if _, err := e.CP.Client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		e.T.Fatalf("node %s status: %v", name, err)
	}
}

// patchNode applies a JSON merge patch to a Node.
func (e *env) patchNode(name, patch string) {
	e.T.Helper()
	if _, err := e.CP.Client.CoreV1().Nodes().Patch(context.Background(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		e.T.Fatalf("patching node %s: %v", name, err)
	}
}

// publish creates a LoadBalancer Service and writes VIPs into its status,
// as vipcast-ccm does.
func (e *env) publish(s *v1.Service, ips ...string) {
	e.T.Helper()
	ctx := context.Background()
	created := e.createService(s)
	for _, ip := range ips {
		created.Status.LoadBalancer.Ingress = append(created.Status.LoadBalancer.Ingress,
			v1.LoadBalancerIngress{IP: ip, IPMode: ptr.To(v1.LoadBalancerIPModeProxy)})
	}
	if _, err := e.CP.Client.CoreV1().Services(s.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		e.T.Fatalf("status of %s/%s: %v", s.Namespace, s.Name, err)
	}
}

// endpoint is one endpoint of a test EndpointSlice.
type endpoint struct {
	node  string
	ip    string
	ready bool
}

// endpoints creates or replaces the EndpointSlices of a Service: one per
// address family of the endpoints given (a family with none gets an empty
// slice).
func (e *env) endpoints(ns, svc string, eps ...endpoint) {
	e.T.Helper()
	ctx := context.Background()
	for _, fam := range []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6} {
		slice := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: ns, Name: svc + "-" + strings.ToLower(string(fam)),
				Labels: map[string]string{discoveryv1.LabelServiceName: svc},
			},
			AddressType: fam,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)}},
		}
		for _, ep := range eps {
			if (netip.MustParseAddr(ep.ip).Is4()) != (fam == discoveryv1.AddressTypeIPv4) {
				continue
			}
			slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
				Addresses:  []string{ep.ip},
				NodeName:   ptr.To(ep.node),
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ep.ready)},
			})
		}
		c := e.CP.Client.DiscoveryV1().EndpointSlices(ns)
		cur, err := c.Get(ctx, slice.Name, metav1.GetOptions{})
		if err == nil {
			slice.ResourceVersion = cur.ResourceVersion
			_, err = c.Update(ctx, slice, metav1.UpdateOptions{})
		} else {
			_, err = c.Create(ctx, slice, metav1.CreateOptions{})
		}
		if err != nil {
			e.T.Fatalf("endpointslice %s/%s: %v", ns, slice.Name, err)
		}
	}
}

// patchPeer applies a JSON merge patch to a BGPPeer.
func (e *env) patchPeer(name, patch string) {
	e.T.Helper()
	if _, err := e.CP.Dynamic.Resource(vipcastv1alpha1.BGPPeersResource).Patch(context.Background(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		e.T.Fatalf("patching BGPPeer %s: %v", name, err)
	}
}

// secret creates a Secret with one key.
func (e *env) secret(ns, name, key, value string) {
	e.T.Helper()
	e.Namespace(ns, nil)
	_, err := e.CP.Client.CoreV1().Secrets(ns).Create(context.Background(), &v1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Data:       map[string][]byte{key: []byte(value)},
	}, metav1.CreateOptions{})
	if err != nil {
		e.T.Fatalf("secret %s/%s: %v", ns, name, err)
	}
}

// table reads a router's routes, both families.
type table func() (map[netip.Prefix][]routers.Path, error)

func frrTable(f *routers.FRR) table {
	return func() (map[netip.Prefix][]routers.Path, error) {
		out, err := f.Routes(routers.IPv4)
		if err != nil {
			return nil, err
		}
		v6, err := f.Routes(routers.IPv6)
		if err != nil {
			return nil, err
		}
		maps.Copy(out, v6)
		return out, nil
	}
}

// testVIPs are the test pools' ranges: other routes (BIRD's static ones)
// are ignored.
var testVIPs = []netip.Prefix{netip.MustParsePrefix("10.100.0.0/16"), netip.MustParsePrefix("fd00:100::/32")}

// route is what a router should hold for one prefix.
type route struct {
	nextHop     string
	communities []string // each must be present
	large       []string
}

// waitTable polls a router until its routes inside testVIPs are exactly
// want (prefix → expected path), with the expected attributes.
func (e *env) waitTable(name string, get table, want map[string]route) {
	e.T.Helper()
	e.Eventually(30*time.Second, fmt.Sprintf("%s holding %v", name, slices.Sorted(maps.Keys(want))), func() (bool, error) {
		err := tableIs(get, want)
		return err == nil, err
	})
}

// keepsTable checks for d that a router's routes inside testVIPs stay
// exactly want.
func (e *env) keepsTable(d time.Duration, name string, get table, want map[string]route) {
	e.T.Helper()
	e.consistently(d, fmt.Sprintf("%s keeping %v", name, slices.Sorted(maps.Keys(want))), func() error { return tableIs(get, want) })
}

// tableIs reports how a router's routes inside testVIPs differ from want
// (prefix → expected path, with the expected attributes); nil when they
// do not.
func tableIs(get table, want map[string]route) error {
	got, err := get()
	if err != nil {
		return err
	}
	seen := 0
	for p, paths := range got {
		if !slices.ContainsFunc(testVIPs, func(v netip.Prefix) bool { return v.Overlaps(p) }) {
			continue
		}
		w, ok := want[p.String()]
		if !ok {
			return fmt.Errorf("unexpected route %s", p)
		}
		seen++
		if len(paths) != 1 {
			return fmt.Errorf("%s: %d paths, want 1", p, len(paths))
		}
		path := paths[0]
		if path.NextHop.String() != w.nextHop {
			return fmt.Errorf("%s: next hop %s, want %s", p, path.NextHop, w.nextHop)
		}
		for _, c := range w.communities {
			if !slices.ContainsFunc(path.Communities, func(got string) bool { return canonCommunity(got) == canonCommunity(c) }) {
				return fmt.Errorf("%s: communities %v lack %s", p, path.Communities, c)
			}
		}
		for _, c := range w.large {
			if !slices.Contains(path.LargeCommunities, c) {
				return fmt.Errorf("%s: large communities %v lack %s", p, path.LargeCommunities, c)
			}
		}
	}
	if seen != len(want) {
		return fmt.Errorf("%d of %d routes present", seen, len(want))
	}
	return nil
}

// TestSpeakerRouting is the loopback tier: vipcast-speaker against the real
// API server and real FRR and BIRD routers. It checks the announced
// prefixes, next hops and attributes, and every withdrawal rule.
func TestSpeakerRouting(t *testing.T) {
	e := newEnv(t)
	speakerAddr := netip.MustParseAddr("127.0.0.2")
	frr := routers.StartFRR(t, routers.FRRConfig{ASN: 64500, ListenAddress: netip.MustParseAddr("127.0.0.1"),
		Neighbors: []routers.FRRNeighbor{{Address: speakerAddr, ASN: 64501}}})
	bird := routers.StartBIRD(t, routers.BIRDConfig{ASN: 64500, ListenAddress: netip.MustParseAddr("127.0.0.4"),
		Neighbors: []routers.BIRDNeighbor{{Name: "speaker", Address: speakerAddr, ASN: 64501}}})

	e.node("node-a", nil, "10.0.0.2", "fd00::2")
	e.mustApplyPools(`apiVersion: vipcast.io/v1alpha1
kind: IPPool
metadata:
  name: vips
spec:
  addresses: ["10.100.0.0/24", "fd00:100::/120"]
  bgp:
    communities: ["64512:100", "no-export"]
    largeCommunities: ["64512:1:2"]`)
	e.applyPeer(peerDoc("frr", frr.Address, frr.Port, 64500, 64501, ""))
	e.applyPeer(peerDoc("bird", bird.Address, bird.Port, 64500, 64501, ""))
	ports, err := proc.FreePorts("127.0.0.1", 1)
	if err != nil {
		t.Fatal(err)
	}
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	e.startSpeaker("node-a", "--metrics-bind-address", fmt.Sprintf("127.0.0.1:%d", ports[0]))
	if err := frr.WaitEstablished(speakerAddr, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := bird.WaitEstablished("speaker", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	tables := map[string]table{"FRR": frrTable(frr), "BIRD": bird.Routes}
	expect := func(want map[string]route) {
		t.Helper()
		for name, get := range tables {
			e.waitTable(name, get, want)
		}
	}
	attrs := func(nh string) route {
		return route{nextHop: nh, communities: []string{"64512:100", "no-export"}, large: []string{"64512:1:2"}}
	}

	// Cluster, dual-stack, its only endpoint on another node: /32 and
	// /128 (over the IPv4 session) with this node's next hops.
	e.Namespace("web", nil)
	e.publish(ccmtest.LBService("web", "cluster", withFamilies(v1.IPFamilyPolicyRequireDualStack, v1.IPv4Protocol, v1.IPv6Protocol)),
		"10.100.0.10", "fd00:100::10")
	e.endpoints("web", "cluster", endpoint{node: "node-b", ip: "10.244.2.5", ready: true},
		endpoint{node: "node-b", ip: "fd00:244::5", ready: true})
	// Local with a ready endpoint here.
	local := ccmtest.LBService("web", "local")
	local.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	e.publish(local, "10.100.0.11")
	e.endpoints("web", "local", endpoint{node: "node-a", ip: "10.244.1.7", ready: true})
	// Local with its only endpoint elsewhere: never announced here.
	remote := ccmtest.LBService("web", "remote")
	remote.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	e.publish(remote, "10.100.0.12")
	e.endpoints("web", "remote", endpoint{node: "node-b", ip: "10.244.2.8", ready: true})
	// Another loadBalancerClass: not ours.
	foreign := ccmtest.LBService("web", "foreign")
	foreign.Spec.LoadBalancerClass = ptr.To("example.com/other")
	e.publish(foreign, "10.100.0.13")
	e.endpoints("web", "foreign", endpoint{node: "node-a", ip: "10.244.1.9", ready: true})

	all := map[string]route{
		"10.100.0.10/32":   attrs("10.0.0.2"),
		"fd00:100::10/128": attrs("fd00::2"),
		"10.100.0.11/32":   attrs("10.0.0.2"),
	}
	expect(all)

	// What an operator sees: readiness, metrics, and Events on the BGPPeers.
	if code, _ := httpGet(t, metricsURL+"/readyz"); code != http.StatusOK {
		t.Errorf("/readyz answered %d, want 200", code)
	}
	_, metrics := httpGet(t, metricsURL+"/metrics")
	for _, want := range []string{
		`vipcast_bgp_session_up{peer="frr"} 1`,
		`vipcast_bgp_session_up{peer="bird"} 1`,
		`vipcast_bgp_announced_prefixes{peer="frr"} 3`,
		`vipcast_speaker_announced_prefixes 3`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	e.waitEventReason("default", "frr", v1.EventTypeNormal, "SessionEstablished", "node-a", "127.0.0.1")

	// Local loses its last local endpoint (not ready): withdrawn; back when
	// ready again.
	e.endpoints("web", "local", endpoint{node: "node-a", ip: "10.244.1.7", ready: false})
	expect(without(all, "10.100.0.11/32"))
	e.endpoints("web", "local", endpoint{node: "node-a", ip: "10.244.1.7", ready: true})
	expect(all)

	// The exclude label withdraws everything; removing it announces again.
	e.patchNode("node-a", `{"metadata":{"labels":{"node.kubernetes.io/exclude-from-external-load-balancers":"true"}}}`)
	expect(map[string]route{})
	e.patchNode("node-a", `{"metadata":{"labels":{"node.kubernetes.io/exclude-from-external-load-balancers":null}}}`)
	expect(all)

	// So does cordoning.
	e.patchNode("node-a", `{"spec":{"unschedulable":true}}`)
	expect(map[string]route{})
	e.patchNode("node-a", `{"spec":{"unschedulable":false}}`)
	expect(all)

	// Deleting the Service withdraws both its prefixes.
	if err := e.CP.Client.CoreV1().Services("web").Delete(context.Background(), "cluster", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	expect(without(all, "10.100.0.10/32", "fd00:100::10/128"))
}

// httpGet returns the status code and body of a GET.
func httpGet(t testing.TB, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url) //nolint:gosec // G107: the test's own endpoints
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(body)
}

// canonCommunity writes well-known communities as numbers: FRR prints
// names (no-export), BIRD numbers (65535:65281).
func canonCommunity(c string) string {
	if v, ok := vipcastv1alpha1.WellKnownCommunities[c]; ok {
		return fmt.Sprintf("%d:%d", v>>16, v&0xffff)
	}
	return c
}

// without returns a copy of m without keys.
func without(m map[string]route, keys ...string) map[string]route {
	out := maps.Clone(m)
	for _, k := range keys {
		delete(out, k)
	}
	return out
}

// TestSpeakerPeers checks sessions as configured by BGPPeers: a TCP MD5
// password read from a Secret establishes, a wrong one never does, a
// missing Secret or one not named in --bgp-password-secrets (even in the
// namespace of named ones) is reported on the BGPPeer, a corrected Secret
// is picked up from the watch of that Secret, and changing one BGPPeer
// leaves the other sessions up.
func TestSpeakerPeers(t *testing.T) {
	e := newEnv(t)
	speakerAddr := netip.MustParseAddr("127.0.0.2")
	good := routers.StartFRR(t, routers.FRRConfig{ASN: 64500, ListenAddress: netip.MustParseAddr("127.0.0.1"),
		Neighbors: []routers.FRRNeighbor{{Address: speakerAddr, ASN: 64501, Password: "right-password"}}})
	bad := routers.StartFRR(t, routers.FRRConfig{ASN: 64500, ListenAddress: netip.MustParseAddr("127.0.0.5"),
		Neighbors: []routers.FRRNeighbor{{Address: speakerAddr, ASN: 64501, Password: "other-password"}}})
	e.node("node-a", nil, "10.0.0.2")
	e.secret("vipcast-system", "bgp-good", "password", "right-password")
	e.secret("vipcast-system", "bgp-bad", "password", "wrong-password")
	secretRef := func(name string) string {
		return fmt.Sprintf("  passwordSecretRef: {namespace: vipcast-system, name: %s}\n", name)
	}
	e.applyPeer(peerDoc("good", good.Address, good.Port, 64500, 64501, secretRef("bgp-good")))
	e.applyPeer(peerDoc("bad", bad.Address, bad.Port, 64500, 64501, secretRef("bgp-bad")))
	e.applyPeer(peerDoc("nosecret", netip.MustParseAddr("127.0.0.6"), 179, 64500, 64501, secretRef("missing")))
	// A Secret the flag does not name is never read, even beside the
	// named ones.
	e.secret("vipcast-system", "bgp-unnamed", "password", "right-password")
	e.applyPeer(peerDoc("unnamed", netip.MustParseAddr("127.0.0.7"), 179, 64500, 64501, secretRef("bgp-unnamed")))
	e.startSpeaker("node-a", "--bgp-password-secrets", "vipcast-system/bgp-good,vipcast-system/bgp-bad,vipcast-system/missing")

	if err := good.WaitEstablished(speakerAddr, 30*time.Second); err != nil {
		t.Fatalf("the right MD5 password: %v", err)
	}
	// The missing Secret is named in a Warning Event on its BGPPeer.
	e.waitEventReason("default", "nosecret", v1.EventTypeWarning, "SecretNotFound", "node-a", "vipcast-system/missing")
	e.waitEventReason("default", "unnamed", v1.EventTypeWarning, "SecretNotFound", "node-a", "vipcast-system/bgp-unnamed",
		"add vipcast-system/bgp-unnamed to the speaker's --bgp-password-secrets (chart value speaker.bgpPasswordSecrets.secrets)")
	// The wrong password never gets past TCP: FRR drops the segments.
	time.Sleep(5 * time.Second)
	if st, err := bad.Neighbor(speakerAddr); err != nil || st.State == "Established" {
		t.Fatalf("session with the wrong MD5 password: state %q (err %v), want not Established", st.State, err)
	}

	// Changing one BGPPeer resets that session only.
	before, err := good.Neighbor(speakerAddr)
	if err != nil {
		t.Fatal(err)
	}
	e.patchPeer("bad", `{"spec":{"holdTime":"12s","keepaliveTime":"4s"}}`)
	e.patchPeer("nosecret", `{"spec":{"port":1790}}`)
	time.Sleep(3 * time.Second)
	after, err := good.Neighbor(speakerAddr)
	if err != nil {
		t.Fatal(err)
	}
	if after.State != "Established" || after.EstablishedCount != before.EstablishedCount || after.DroppedCount != before.DroppedCount {
		t.Errorf("session with good changed when other BGPPeers did: before %+v, after %+v", before, after)
	}
	// Fixing the password brings the other session up as soon as the
	// watch delivers the Secret (the resync period is 5 minutes), without
	// touching the first.
	e.patchSecret("vipcast-system", "bgp-bad", "other-password")
	if err := bad.WaitEstablished(speakerAddr, 30*time.Second); err != nil {
		t.Fatalf("after fixing the password: %v", err)
	}
	if final, err := good.Neighbor(speakerAddr); err != nil || final.EstablishedCount != before.EstablishedCount {
		t.Errorf("session with good reset while bad was fixed: %+v (err %v)", final, err)
	}
}

// TestPeerAddressConflict: two BGPPeers with the same address selecting
// one node. The node opens the older one's session and every other
// session; the newer peer gets a Warning Event from the speaker and
// Ready=False from the CCM, both naming the older peer, until the older
// one is deleted or their nodeSelectors stop sharing a node.
func TestPeerAddressConflict(t *testing.T) {
	e := newEnv(t)
	speakerAddr := netip.MustParseAddr("127.0.0.2")
	other := routers.StartFRR(t, routers.FRRConfig{ASN: 64500, ListenAddress: netip.MustParseAddr("127.0.0.1"),
		Neighbors: []routers.FRRNeighbor{{Address: speakerAddr, ASN: 64501}}})
	dup := routers.StartFRR(t, routers.FRRConfig{ASN: 64500, ListenAddress: netip.MustParseAddr("127.0.0.5"),
		Neighbors: []routers.FRRNeighbor{{Address: speakerAddr, ASN: 64501}}})
	e.node("node-a", map[string]string{"rack": "a"}, "10.0.0.2")
	// The older peer is right; the newer one's peer ASN is wrong, so a
	// session with dup can only come up if the older peer won.
	e.applyPeer(peerDoc("dup-old", dup.Address, dup.Port, 64500, 64501, ""))
	time.Sleep(1100 * time.Millisecond) // creation timestamps have one-second resolution
	e.applyPeer(peerDoc("dup-new", dup.Address, dup.Port, 64999, 64501, ""))
	e.applyPeer(peerDoc("other", other.Address, other.Port, 64500, 64501, ""))
	// Same address as well, but selecting no existing node (yet).
	e.applyPeer(peerDoc("spine", dup.Address, dup.Port, 64500, 64501, "  nodeSelector: {matchLabels: {spine: \"true\"}}\n"))
	e.StartCCM("a")
	e.startSpeaker("node-a")

	for _, r := range []*routers.FRR{other, dup} {
		if err := r.WaitEstablished(speakerAddr, 30*time.Second); err != nil {
			t.Fatalf("session with %s: %v", r.Address, err)
		}
	}
	e.waitEventReason("default", "dup-new", v1.EventTypeWarning, vipcastv1alpha1.ReasonAddressConflict, "node node-a", "older BGPPeer dup-old")
	e.waitPeerReady("dup-new", "False", vipcastv1alpha1.ReasonAddressConflict, "older BGPPeer dup-old", "node node-a", "delete one of them")
	e.waitPeerReady("dup-old", "True", vipcastv1alpha1.ReasonValid)
	e.waitPeerReady("other", "True", vipcastv1alpha1.ReasonValid)
	e.waitPeerReady("spine", "True", vipcastv1alpha1.ReasonValid)

	// A node label that makes spine select node-a too: spine conflicts,
	// the sessions stay.
	before, err := other.Neighbor(speakerAddr)
	if err != nil {
		t.Fatal(err)
	}
	e.patchNode("node-a", `{"metadata":{"labels":{"spine":"true"}}}`)
	e.waitPeerReady("spine", "False", vipcastv1alpha1.ReasonAddressConflict, "older BGPPeer dup-old", "node node-a")
	e.waitEventReason("default", "spine", v1.EventTypeWarning, vipcastv1alpha1.ReasonAddressConflict, "node node-a", "older BGPPeer dup-old")
	e.patchNode("node-a", `{"metadata":{"labels":{"spine":null}}}`)
	e.waitPeerReady("spine", "True", vipcastv1alpha1.ReasonValid)
	// A new node selected by both, a peer moving away from the address
	// and back, the node going away: each is re-checked.
	e.node("node-b", map[string]string{"spine": "true"})
	e.waitPeerReady("spine", "False", vipcastv1alpha1.ReasonAddressConflict, "older BGPPeer dup-old", "node node-b")
	e.patchPeer("spine", `{"spec":{"peerAddress":"127.0.0.9"}}`)
	e.waitPeerReady("spine", "True", vipcastv1alpha1.ReasonValid)
	e.patchPeer("spine", fmt.Sprintf(`{"spec":{"peerAddress":"%s"}}`, dup.Address))
	e.waitPeerReady("spine", "False", vipcastv1alpha1.ReasonAddressConflict, "older BGPPeer dup-old", "node node-b")
	if err := e.CP.Client.CoreV1().Nodes().Delete(context.Background(), "node-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitPeerReady("spine", "True", vipcastv1alpha1.ReasonValid)
	if after, err := other.Neighbor(speakerAddr); err != nil || after.State != "Established" || after.EstablishedCount != before.EstablishedCount {
		t.Errorf("session with other changed with the conflicts: before %+v, after %+v (err %v)", before, after, err)
	}

	// Deleting the older peer hands the address to the newer one.
	if err := e.CP.Dynamic.Resource(vipcastv1alpha1.BGPPeersResource).Delete(context.Background(), "dup-old", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitPeerReady("dup-new", "True", vipcastv1alpha1.ReasonValid)
}

// patchSecret replaces the password key of a Secret.
func (e *env) patchSecret(ns, name, value string) {
	e.T.Helper()
	s, err := e.CP.Client.CoreV1().Secrets(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		e.T.Fatal(err)
	}
	s.Data["password"] = []byte(value)
	if _, err := e.CP.Client.CoreV1().Secrets(ns).Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		e.T.Fatal(err)
	}
}

// TestSpeakerRestart checks that a speaker restart does not make routers
// withdraw anything: with graceful restart, a SIGKILLed speaker's routes
// stay while it is away, and the new process hands its routers the full
// set before End-of-RIB, so FRR never holds fewer routes at any point.
func TestSpeakerRestart(t *testing.T) {
	e := newEnv(t)
	speakerAddr := netip.MustParseAddr("127.0.0.2")
	frr := routers.StartFRR(t, routers.FRRConfig{ASN: 64500, ListenAddress: netip.MustParseAddr("127.0.0.1"),
		Neighbors: []routers.FRRNeighbor{{Address: speakerAddr, ASN: 64501}}})
	e.node("node-a", nil, "10.0.0.2")
	e.mustApplyPools("apiVersion: vipcast.io/v1alpha1\nkind: IPPool\nmetadata: {name: vips}\nspec: {addresses: [10.100.0.0/24]}\n")
	e.applyPeer(peerDoc("frr", frr.Address, frr.Port, 64500, 64501, "  gracefulRestart: {enabled: true, restartTime: 60s}\n"))
	e.Namespace("web", nil)
	const n = 50
	for i := range n {
		name := fmt.Sprintf("s%02d", i)
		e.publish(ccmtest.LBService("web", name), fmt.Sprintf("10.100.0.%d", 10+i))
		e.endpoints("web", name, endpoint{node: "node-b", ip: fmt.Sprintf("10.244.2.%d", 10+i), ready: true})
	}
	first := e.startSpeaker("node-a")
	e.Eventually(30*time.Second, "FRR holding all routes", func() (bool, error) {
		c, err := frr.PrefixCount(speakerAddr)
		return c == n, err
	})
	before, err := frr.Neighbor(speakerAddr)
	if err != nil {
		t.Fatal(err)
	}

	// Watch FRR's count from now on, every 20 ms.
	minSeen := make(chan int)
	stop := make(chan struct{})
	go func() {
		lowest := n
		for {
			select {
			case <-stop:
				minSeen <- lowest
				return
			case <-time.After(20 * time.Millisecond):
			}
			if c, err := frr.PrefixCount(speakerAddr); err == nil && c < lowest {
				lowest = c
			}
		}
	}()
	first.Kill()
	e.startSpeaker("node-a")
	e.Eventually(30*time.Second, "the new session to come up", func() (bool, error) {
		st, err := frr.Neighbor(speakerAddr)
		return st.State == "Established" && st.EstablishedCount > before.EstablishedCount, err
	})
	time.Sleep(2 * time.Second) // End-of-RIB and any late withdrawal
	close(stop)
	if lowest := <-minSeen; lowest != n {
		t.Errorf("FRR held %d routes at some point during the restart, want all %d throughout", lowest, n)
	}
	if c, err := frr.PrefixCount(speakerAddr); err != nil || c != n {
		t.Errorf("after the restart FRR holds %d routes (err %v), want %d", c, err, n)
	}
}
