package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/vipcast/vipcast/ccm"
	"github.com/vipcast/vipcast/test/routers"
)

const classPool = `apiVersion: vipcast.io/v1alpha1
kind: IPPool
metadata: {name: vips}
spec:
  addresses: ["10.100.0.0/24"]`

// foreignIP is an address another load-balancer implementation publishes:
// in no vipcast pool.
const foreignIP = "198.51.100.7"

// writeStatus writes ips into the Service's status, as another controller
// would.
func (e *env) writeStatus(ns, name string, ips ...string) {
	e.t.Helper()
	ctx := context.Background()
	svc, err := e.cp.Client.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	svc.Status.LoadBalancer.Ingress = nil
	for _, ip := range ips {
		svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, v1.LoadBalancerIngress{IP: ip})
	}
	if _, err := e.cp.Client.CoreV1().Services(ns).UpdateStatus(ctx, svc, metav1.UpdateOptions{}); err != nil {
		e.t.Fatalf("status of %s/%s: %v", ns, name, err)
	}
}

// patchService applies a JSON merge patch to a Service.
func (e *env) patchService(ns, name, patch string) {
	e.t.Helper()
	if _, err := e.cp.Client.CoreV1().Services(ns).Patch(context.Background(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		e.t.Fatalf("patching Service %s/%s with %s: %v", ns, name, patch, err)
	}
}

// statusOf returns the status addresses of a Service.
func (e *env) statusOf(ns, name string) []string {
	e.t.Helper()
	svc, err := e.cp.Client.CoreV1().Services(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		out = append(out, ing.IP)
	}
	return out
}

// waitStatus waits until the Service's status satisfies ok.
func (e *env) waitStatus(ns, name, what string, ok func([]string) bool) []string {
	e.t.Helper()
	var got []string
	e.eventually(30*time.Second, fmt.Sprintf("%s/%s status %s", ns, name, what), func() (bool, error) {
		got = e.statusOf(ns, name)
		return ok(got), fmt.Errorf("status %v", got)
	})
	return got
}

func inVIPs(ips []string) bool {
	if len(ips) != 1 {
		return false
	}
	ip, err := netip.ParseAddr(ips[0])
	return err == nil && netip.MustParsePrefix("10.100.0.0/24").Contains(ip)
}

// TestClassMove: a Service of another loadBalancerClass, whose status that
// implementation wrote, moves to ClusterIP and then to a class-less
// LoadBalancer. vipcast reserved its address while it was the other
// implementation's, releases it on the move, and gives it a VIP of its own
// pool that the speaker announces; an in-pool address the other
// implementation had published is free again for a new Service.
func TestClassMove(t *testing.T) {
	e := newEnv(t)
	speakerAddr := netip.MustParseAddr("127.0.0.2")
	frr := routers.StartFRR(t, routers.FRRConfig{ASN: 64500, ListenAddress: netip.MustParseAddr("127.0.0.1"),
		Neighbors: []routers.FRRNeighbor{{Address: speakerAddr, ASN: 64501}}})
	e.node("node-a", nil, "10.0.0.2")
	e.mustApplyPools(classPool)
	e.applyPeer(peerDoc("frr", frr.Address, frr.Port, 64500, 64501, ""))
	e.namespace("web", nil)
	e.startCCM("a")
	e.startSpeaker("node-a")
	if err := frr.WaitEstablished(speakerAddr, 30*time.Second); err != nil {
		t.Fatal(err)
	}

	// Two Services of another implementation: one publishes an address
	// outside vipcast's pools, one an address inside them.
	other := func(name string) *v1.Service {
		s := lbService("web", name)
		s.Spec.LoadBalancerClass = ptr.To("example.com/other")
		return s
	}
	e.createService(other("moving"))
	e.writeStatus("web", "moving", foreignIP)
	e.createService(other("inpool"))
	e.writeStatus("web", "inpool", "10.100.0.50")
	// vipcast reserves 10.100.0.50: a Service asking for it is refused.
	e.createService(lbService("web", "asks", withAnnotation(ccm.AnnotationIPs, "10.100.0.50")))
	e.waitEvent("web", "asks", "10.100.0.50")

	// Both leave their class through ClusterIP.
	for _, name := range []string{"moving", "inpool"} {
		e.patchService("web", name, `{"spec":{"type":"ClusterIP"}}`)
		e.waitStatus("web", name, "cleared", func(ips []string) bool { return len(ips) == 0 })
	}
	// The in-pool address is free again.
	e.waitStatus("web", "asks", "10.100.0.50", func(ips []string) bool { return len(ips) == 1 && ips[0] == "10.100.0.50" })

	// "moving" becomes a class-less LoadBalancer: a VIP of vipcast's pool,
	// announced by the speaker.
	e.patchService("web", "moving", `{"spec":{"type":"LoadBalancer"}}`)
	e.endpoints("web", "moving", endpoint{node: "node-a", ip: "10.244.1.7", ready: true})
	e.endpoints("web", "asks", endpoint{node: "node-a", ip: "10.244.1.8", ready: true})
	got := e.waitStatus("web", "moving", "a VIP of pool vips", inVIPs)
	e.waitTable("FRR", frrTable(frr), map[string]route{
		got[0] + "/32":   {nextHop: "10.0.0.2"},
		"10.100.0.50/32": {nextHop: "10.0.0.2"},
	})
}

// TestTwoClasses: two vipcast-ccm processes given different classes each
// lead their own Lease and serve only their class's Services; a third given
// the same class as the first waits for the first's Lease.
func TestTwoClasses(t *testing.T) {
	e := newEnv(t)
	e.mustApplyPools(classPool)
	e.namespace("web", nil)
	a := e.startCCM("a", "--load-balancer-class=vipcast.io/a")
	b := e.startCCM("b", "--load-balancer-class=vipcast.io/b")
	e.eventually(30*time.Second, "both leaders", func() (bool, error) {
		return a.isLeader() && b.isLeader(), fmt.Errorf("a leader %v, b leader %v", a.isLeader(), b.isLeader())
	})
	a2 := e.startCCM("a2", "--load-balancer-class=vipcast.io/a")
	for _, lease := range []string{"vipcast-ccm-vipcast.io-a", "vipcast-ccm-vipcast.io-b"} {
		leases, err := e.cp.Client.CoordinationV1().Leases("").List(context.Background(), metav1.ListOptions{FieldSelector: "metadata.name=" + lease})
		if err != nil || len(leases.Items) != 1 {
			t.Fatalf("Lease %s: %v, %d found", lease, err, len(leases.Items))
		}
	}

	classed := func(name, class string) *v1.Service {
		s := lbService("web", name)
		if class != "" {
			s.Spec.LoadBalancerClass = ptr.To(class)
		}
		return s
	}
	e.createService(classed("svc-a", "vipcast.io/a"))
	va := e.waitStatus("web", "svc-a", "a VIP", inVIPs)
	e.createService(classed("svc-b", "vipcast.io/b"))
	vb := e.waitStatus("web", "svc-b", "a VIP", inVIPs)
	if va[0] == vb[0] {
		t.Errorf("svc-a and svc-b both got %s", va[0])
	}
	e.createService(classed("svc-none", ""))
	e.createService(classed("svc-c", "vipcast.io/c"))
	time.Sleep(3 * time.Second)
	for _, name := range []string{"svc-none", "svc-c"} {
		if got := e.statusOf("web", name); len(got) != 0 {
			t.Errorf("%s, served by neither class, got %v", name, got)
		}
	}
	served := map[*ccmProcess][]string{a: {"web/svc-a"}, b: {"web/svc-b"}}
	for proc, mine := range served {
		data, err := os.ReadFile(proc.log)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"web/svc-a", "web/svc-b", "web/svc-none", "web/svc-c"} {
			ensured := strings.Contains(string(data), `"Ensuring load balancer" service="`+name+`"`)
			if want := len(mine) > 0 && mine[0] == name; ensured != want {
				t.Errorf("%s ensured %s: %v, want %v", proc.log, name, ensured, want)
			}
		}
	}
	if a2.isLeader() {
		t.Errorf("a second CCM of class vipcast.io/a also leads: the class's Lease does not exclude it")
	}
}

// TestForeignStatus: a Service vipcast serves whose status another
// controller overwrites gets a ForeignLoadBalancerStatus Warning; vipcast
// does not write its VIP back and releases the VIP it had; once the status
// is cleared vipcast allocates again. After a restart, an address on a
// Service carrying vipcast's pool annotations is taken as held by that pool
// (poolspec's holding rule) until they go.
func TestForeignStatus(t *testing.T) {
	e := newEnv(t)
	e.mustApplyPools(classPool)
	e.namespace("web", nil)
	c := e.startCCM("a")
	e.createService(lbService("web", "svc"))
	mine := e.waitStatus("web", "svc", "a VIP", inVIPs)
	e.eventually(30*time.Second, "the pool annotation", func() (bool, error) {
		svc, err := e.cp.Client.CoreV1().Services("web").Get(context.Background(), "svc", metav1.GetOptions{})
		return err == nil && svc.Annotations[ccm.AnnotationPool] == "vips", err
	})

	e.writeStatus("web", "svc", foreignIP)
	e.waitEventReason("web", "svc", v1.EventTypeWarning, ccm.ReasonForeignStatus, foreignIP, "did not allocate")
	// A change that makes vipcast sync the Service again does not make it
	// overwrite the status.
	e.patchService("web", "svc", `{"metadata":{"annotations":{"touch":"1"}}}`)
	time.Sleep(2 * time.Second)
	if got := e.statusOf("web", "svc"); len(got) != 1 || got[0] != foreignIP {
		t.Fatalf("status %v, want the other controller's %s left alone", got, foreignIP)
	}
	// vipcast no longer holds its former VIP: a new Service gets it.
	e.createService(lbService("web", "next", withAnnotation(ccm.AnnotationIPs, mine[0])))
	e.waitStatus("web", "next", mine[0], func(ips []string) bool { return len(ips) == 1 && ips[0] == mine[0] })

	// Cleared by the other controller: vipcast serves it again.
	e.writeStatus("web", "svc")
	e.waitStatus("web", "svc", "a vipcast VIP again", inVIPs)

	// After a restart the status alone cannot tell another writer's
	// address from one the annotated pool holds outside its spec (a
	// narrowed pool's), which the speakers go on announcing: it is taken
	// as held, and left as it is. Without vipcast's annotations (the
	// request it filled in and its record) no pool holds it, and vipcast
	// allocates from its pools.
	e.writeStatus("web", "svc", foreignIP)
	e.waitEventReason("web", "svc", v1.EventTypeWarning, ccm.ReasonForeignStatus, foreignIP, "did not allocate")
	c.Stop(5 * time.Second)
	b := e.startCCM("b")
	e.eventually(30*time.Second, "the new CCM rebuilt", func() (bool, error) {
		data, err := os.ReadFile(b.log)
		return strings.Contains(string(data), "Allocator rebuilt from Service status"), err
	})
	e.patchService("web", "svc", `{"metadata":{"annotations":{"touch":"2"}}}`)
	time.Sleep(2 * time.Second)
	if got := e.statusOf("web", "svc"); len(got) != 1 || got[0] != foreignIP {
		t.Fatalf("after a restart: status %v, want %s left as it is", got, foreignIP)
	}
	e.patchService("web", "svc", `{"metadata":{"annotations":{"vipcast.io/pool":null,"vipcast.io/allocated-from-pool":null}}}`)
	e.waitStatus("web", "svc", "a vipcast VIP once the annotations are gone", inVIPs)
}

// TestClassFlagErrors: both binaries refuse a bad class setting at start
// with a message naming the flag and the fix.
func TestClassFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		bin  string
		args []string
		want string
	}{
		{ccmBinary, []string{"--load-balancer-class=bgp"}, "is not a valid spec.loadBalancerClass (it has no domain prefix"},
		{ccmBinary, []string{"--serve-classless-services=false"}, "set --load-balancer-class"},
		{ccmBinary, []string{"--load-balancer-class=example.com/a_.b"}, "set --leader-elect-resource-name"},
		{speakerBinary, []string{"--node-name=n", "--load-balancer-class=Vipcast.io/bgp"}, "such as vipcast.io/bgp"},
		{speakerBinary, []string{"--node-name=n", "--serve-classless-services=false"}, "set --load-balancer-class"},
	} {
		out, err := exec.Command(tc.bin, tc.args...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), tc.want) {
			t.Errorf("%s %v: err %v, output %q; want a failure mentioning %q", filepath.Base(tc.bin), tc.args, err, out, tc.want)
		}
	}
}
