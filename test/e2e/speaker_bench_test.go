//go:build routing

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/vipcast/vipcast/bgp/bgptest"
	"github.com/vipcast/vipcast/test/ccmtest"
	"github.com/vipcast/vipcast/test/routers"
)

const benchVIPs = 10000

// BenchmarkSpeakerAnnounce measures, against the real API server and a real
// FRR, how long vipcast-speaker takes to get 10,000 published VIPs
// (Services with status and a ready endpoint) into FRR's table and out
// again, next to the floor measured in the same run: 10,000 bare gobgp
// AddPath (then DeletePath) calls from a plain gobgp server to the same
// FRR. Three speaker figures:
//   - eligible: the node becomes eligible (its exclude label is removed)
//     with the 10,000 VIPs published: one recompute of every Service.
//   - withdraw: the label comes back; FRR must lose all 10,000.
//   - cold start: a new speaker process starts with the 10,000 published;
//     this includes listing them from the API server and opening the session.
//
// Run with -benchtime=1x (make bench).
func BenchmarkSpeakerAnnounce(b *testing.B) {
	for range b.N {
		e := newEnv(b)
		speakerAddr, bareAddr := netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("127.0.0.3")
		frr := routers.StartFRR(b, routers.FRRConfig{ASN: 64500, ListenAddress: netip.MustParseAddr("127.0.0.1"),
			Neighbors: []routers.FRRNeighbor{{Address: speakerAddr, ASN: 64501}, {Address: bareAddr, ASN: 64501}}})
		const excluded = `{"metadata":{"labels":{"node.kubernetes.io/exclude-from-external-load-balancers":"true"}}}`
		const eligible = `{"metadata":{"labels":{"node.kubernetes.io/exclude-from-external-load-balancers":null}}}`
		e.node("bench", map[string]string{"node.kubernetes.io/exclude-from-external-load-balancers": "true"}, "10.0.0.2")
		e.mustApplyPools("apiVersion: vipcast.io/v1alpha1\nkind: IPPool\nmetadata: {name: bench}\nspec: {addresses: [10.200.0.0/16]}\n")
		e.applyPeer(peerDoc("frr", frr.Address, frr.Port, 64500, 64501, ""))

		vips := e.publishBench(benchVIPs)

		sp := e.startSpeaker("bench", "-v", "0")
		if err := frr.WaitEstablished(speakerAddr, 60*time.Second); err != nil {
			b.Fatal(err)
		}
		countIs := func(peer netip.Addr, want int) time.Time {
			b.Helper()
			deadline := time.Now().Add(120 * time.Second)
			for {
				n, err := frr.PrefixCount(peer)
				if err == nil && n == want {
					return time.Now()
				}
				if time.Now().After(deadline) {
					b.Fatalf("FRR holds %d routes from %s, want %d (err %v)", n, peer, want, err)
				}
				time.Sleep(5 * time.Millisecond)
			}
		}

		start := time.Now()
		e.patchNode("bench", eligible)
		announce := countIs(speakerAddr, benchVIPs).Sub(start)
		start = time.Now()
		e.patchNode("bench", excluded)
		withdraw := countIs(speakerAddr, 0).Sub(start)

		// Cold start: a new process with the node eligible.
		e.patchNode("bench", eligible)
		countIs(speakerAddr, benchVIPs)
		sp.Signal(syscall.SIGTERM)
		countIs(speakerAddr, 0)
		<-sp.Done()
		start = time.Now()
		e.startSpeaker("bench", "-v", "0")
		cold := countIs(speakerAddr, benchVIPs).Sub(start)

		// The floor, same FRR, same run.
		plain := bgptest.StartPlain(b, bareAddr, frr.Address, frr.Port, 64501, 64500)
		if err := frr.WaitEstablished(bareAddr, 60*time.Second); err != nil {
			b.Fatal(err)
		}
		nh := netip.MustParseAddr("10.0.0.3")
		start = time.Now()
		if err := plain.Announce(context.Background(), vips, nh); err != nil {
			b.Fatal(err)
		}
		floor := countIs(bareAddr, benchVIPs).Sub(start)
		start = time.Now()
		if err := plain.Withdraw(context.Background(), vips, nh); err != nil {
			b.Fatal(err)
		}
		floorWithdraw := countIs(bareAddr, 0).Sub(start)

		fmt.Printf("BENCH speaker-announce: %d VIPs: node eligible → all in FRR %.2fs; floor (bare gobgp AddPath) %.2fs; ratio %.2fx\n",
			benchVIPs, announce.Seconds(), floor.Seconds(), announce.Seconds()/floor.Seconds())
		fmt.Printf("BENCH speaker-withdraw: %d VIPs: node excluded → none in FRR %.2fs; floor (bare gobgp DeletePath) %.2fs; ratio %.2fx\n",
			benchVIPs, withdraw.Seconds(), floorWithdraw.Seconds(), withdraw.Seconds()/floorWithdraw.Seconds())
		fmt.Printf("BENCH speaker-cold-start: new vipcast-speaker process → all %d in FRR %.2fs (list from the API server + session + announce); %.2fx the floor\n",
			benchVIPs, cold.Seconds(), cold.Seconds()/floor.Seconds())
		b.ReportMetric(announce.Seconds(), "s-announce")
		b.ReportMetric(withdraw.Seconds(), "s-withdraw")
		b.ReportMetric(cold.Seconds(), "s-cold")
		b.ReportMetric(floor.Seconds(), "s-floor")
		b.ReportMetric(floorWithdraw.Seconds(), "s-floor-withdraw")
		b.ReportMetric(announce.Seconds()/floor.Seconds(), "x-floor")
	}
}

// publishBench publishes n VIPs in namespace bench from 10.200.0.0/16,
// each a LoadBalancer Service s-NNNNN with status and one ready endpoint
// on another node, and returns their host prefixes.
func (e *env) publishBench(n int) []netip.Prefix {
	e.T.Helper()
	e.Namespace("bench", nil)
	vips := make([]netip.Prefix, n)
	setup := time.Now()
	e.runWorkers(n, 16, func(i int) error {
		ip := netip.AddrFrom4([4]byte{10, 200, byte(i >> 8), byte(i)})
		vips[i] = netip.PrefixFrom(ip, 32)
		name := fmt.Sprintf("s-%05d", i)
		svc := ccmtest.LBService("bench", name)
		// 10,000 would exhaust the node port range.
		svc.Spec.AllocateLoadBalancerNodePorts = ptr.To(false)
		ctx := context.Background()
		created, err := e.CP.Client.CoreV1().Services("bench").Create(ctx, svc, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		created.Status.LoadBalancer = *lbStatusFor(ip.String())
		if _, err := e.CP.Client.CoreV1().Services("bench").UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			return err
		}
		_, err = e.CP.Client.DiscoveryV1().EndpointSlices("bench").Create(ctx, benchSlice(name, i), metav1.CreateOptions{})
		return err
	})
	e.T.Logf("published %d VIPs in %v", n, time.Since(setup).Round(time.Millisecond))
	return vips
}

// benchSlice is the EndpointSlice of bench Service name: one ready
// endpoint on another node.
func benchSlice(name string, i int) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "bench", Name: name + "-1",
			Labels: map[string]string{discoveryv1.LabelServiceName: name},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)}},
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{fmt.Sprintf("10.244.%d.%d", (i>>8)&0xff, i&0xff)},
			NodeName:   ptr.To("elsewhere"),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
		}},
	}
}
