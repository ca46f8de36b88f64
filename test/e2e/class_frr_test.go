//go:build routing

package e2e

import (
	"net/netip"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/vipcast/vipcast/ccm"
	"github.com/vipcast/vipcast/test/ccmtest"
	"github.com/vipcast/vipcast/test/routers"
)

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
	e.Namespace("web", nil)
	e.StartCCM("a")
	e.startSpeaker("node-a")
	if err := frr.WaitEstablished(speakerAddr, 30*time.Second); err != nil {
		t.Fatal(err)
	}

	// Two Services of another implementation: one publishes an address
	// outside vipcast's pools, one an address inside them.
	other := func(name string) *v1.Service {
		s := ccmtest.LBService("web", name)
		s.Spec.LoadBalancerClass = ptr.To("example.com/other")
		return s
	}
	e.createService(other("moving"))
	e.writeStatus("web", "moving", foreignIP)
	e.createService(other("inpool"))
	e.writeStatus("web", "inpool", "10.100.0.50")
	// vipcast reserves 10.100.0.50: a Service asking for it is refused.
	e.createService(ccmtest.LBService("web", "asks", withAnnotation(ccm.AnnotationIPs, "10.100.0.50")))
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
