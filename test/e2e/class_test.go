//go:build controlplane

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/vipcast/vipcast/ccm"
	"github.com/vipcast/vipcast/test/ccmtest"
)

// TestTwoClasses: two vipcast-ccm processes given different classes each
// lead their own Lease and serve only their class's Services; a third given
// the same class as the first waits for the first's Lease.
func TestTwoClasses(t *testing.T) {
	t.Parallel() // control plane and vipcast-ccm only (see TestMain)
	e := newEnv(t)
	e.mustApplyPools(classPool)
	e.Namespace("web", nil)
	a := e.StartCCM("a", "--load-balancer-class=vipcast.io/a")
	b := e.StartCCM("b", "--load-balancer-class=vipcast.io/b")
	e.Eventually(30*time.Second, "both leaders", func() (bool, error) {
		return a.IsLeader() && b.IsLeader(), fmt.Errorf("a leader %v, b leader %v", a.IsLeader(), b.IsLeader())
	})
	a2 := e.StartCCM("a2", "--load-balancer-class=vipcast.io/a")
	for _, lease := range []string{"vipcast-ccm-vipcast.io-a", "vipcast-ccm-vipcast.io-b"} {
		leases, err := e.CP.Client.CoordinationV1().Leases("").List(context.Background(), metav1.ListOptions{FieldSelector: "metadata.name=" + lease})
		if err != nil || len(leases.Items) != 1 {
			t.Fatalf("Lease %s: %v, %d found", lease, err, len(leases.Items))
		}
	}

	classed := func(name, class string) *v1.Service {
		s := ccmtest.LBService("web", name)
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
	served := map[*ccmtest.CCM][]string{a: {"web/svc-a"}, b: {"web/svc-b"}}
	for proc, mine := range served {
		data, err := os.ReadFile(proc.Log)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"web/svc-a", "web/svc-b", "web/svc-none", "web/svc-c"} {
			ensured := strings.Contains(string(data), `"Ensuring load balancer" service="`+name+`"`)
			if want := len(mine) > 0 && mine[0] == name; ensured != want {
				t.Errorf("%s ensured %s: %v, want %v", proc.Log, name, ensured, want)
			}
		}
	}
	if a2.IsLeader() {
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
	t.Parallel() // control plane and vipcast-ccm only (see TestMain)
	e := newEnv(t)
	e.mustApplyPools(classPool)
	e.Namespace("web", nil)
	c := e.StartCCM("a")
	e.createService(ccmtest.LBService("web", "svc"))
	mine := e.waitStatus("web", "svc", "a VIP", inVIPs)
	e.Eventually(30*time.Second, "the pool annotation", func() (bool, error) {
		svc, err := e.CP.Client.CoreV1().Services("web").Get(context.Background(), "svc", metav1.GetOptions{})
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
	e.createService(ccmtest.LBService("web", "next", withAnnotation(ccm.AnnotationIPs, mine[0])))
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
	b := e.StartCCM("b")
	e.Eventually(30*time.Second, "the new CCM rebuilt", func() (bool, error) {
		data, err := os.ReadFile(b.Log)
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
