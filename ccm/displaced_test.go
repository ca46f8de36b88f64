package ccm

import (
	"context"
	"net/netip"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/vipcast/vipcast/ipam"
)

// TestRestoreDisplacesTheNewerSharer: a CCM that starts and finds two
// Services publishing one VIP under requests that may not share it (one
// dropped, changed or clashed its sharing while no CCM ran) leaves the VIP
// with the older Service, whichever of the two is listed or changed
// first, and displaces the newer one: its status is vipcast's to replace,
// not another writer's to leave alone.
func TestRestoreDisplacesTheNewerSharer(t *testing.T) {
	const vip = "10.0.0.1"
	older := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name         string
		olderOpts    []svcOption // the older Service's request now
		newerOpts    []svcOption // the newer Service's request now
		olderName    string
		newerName    string
		sameCreation bool
	}{
		{name: "the newer dropped its key", olderName: "a", newerName: "b",
			olderOpts: []svcOption{withAnnotation(AnnotationSharingKey, "k2"), withPorts(port("", 80))},
			newerOpts: []svcOption{withPorts(port("", 443))}},
		{name: "the older dropped its key", olderName: "b", newerName: "a",
			olderOpts: []svcOption{withPorts(port("", 80))},
			newerOpts: []svcOption{withAnnotation(AnnotationSharingKey, "k2"), withPorts(port("", 443))}},
		{name: "the newer changed its key", olderName: "a", newerName: "b",
			olderOpts: []svcOption{withAnnotation(AnnotationSharingKey, "k2"), withPorts(port("", 80))},
			newerOpts: []svcOption{withAnnotation(AnnotationSharingKey, "k1"), withPorts(port("", 443))}},
		{name: "ports clash", olderName: "a", newerName: "b",
			olderOpts: []svcOption{withAnnotation(AnnotationSharingKey, "k2"), withPorts(port("", 80))},
			newerOpts: []svcOption{withAnnotation(AnnotationSharingKey, "k2"), withPorts(port("", 80))}},
		{name: "created together: the first by name keeps it", olderName: "a", newerName: "b", sameCreation: true,
			olderOpts: []svcOption{withPorts(port("", 80))},
			newerOpts: []svcOption{withPorts(port("", 443))}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mk := func(name string, created time.Time, opts []svcOption) *v1.Service {
				opts = append([]svcOption{withName(name), withIngress(v1.LoadBalancerIngress{IP: vip})}, opts...)
				svc := newService(opts...)
				svc.CreationTimestamp = metav1.NewTime(created)
				return svc
			}
			newerCreated := older.Add(time.Hour)
			if tc.sameCreation {
				newerCreated = older
			}
			o, n := mk(tc.olderName, older, tc.olderOpts), mk(tc.newerName, newerCreated, tc.newerOpts)
			indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
			for _, svc := range []*v1.Service{n, o} {
				if err := indexer.Add(svc); err != nil {
					t.Fatal(err)
				}
			}
			p := &Provider{
				alloc:     ipam.New(),
				foreign:   map[string][]netip.Addr{},
				displaced: map[string][]netip.Addr{},
				services:  corelisters.NewServiceLister(indexer),
			}
			if errs := p.alloc.SetPools([]ipam.Pool{{Name: "p", Addresses: []string{"10.0.0.0/29"}, AutoAssign: true}}); errs != nil {
				t.Fatal(errs)
			}
			restored, conflicts := p.restore(context.Background())
			if restored != 1 || conflicts != 1 {
				t.Fatalf("restore: %d restored, %d conflicts; want 1 and 1", restored, conflicts)
			}
			if got := p.alloc.Holders(netip.MustParseAddr(vip)); len(got) != 1 || got[0] != Owner(o) {
				t.Fatalf("holders of %s: %v, want the older %s", vip, got, Owner(o))
			}
			client := fake.NewClientset(n.DeepCopy())
			svc, foreign, err := p.foreignStatus(context.Background(), client, n)
			if err != nil || foreign != "" {
				t.Fatalf("foreignStatus of the displaced %s: %q, %v; want it vipcast's own", Owner(n), foreign, err)
			}
			if svc != n || p.isForeign(Owner(n)) {
				t.Fatalf("the displaced %s was marked foreign", Owner(n))
			}
			// It gets another VIP; the older keeps its own.
			req, err := RequestFor(n, nil)
			if err != nil {
				t.Fatal(err)
			}
			a, err := p.alloc.Assign(req)
			if err != nil || len(a.IPs) != 1 || a.IPs[0] == netip.MustParseAddr(vip) {
				t.Fatalf("Assign(%s) = %v, %v; want another VIP", Owner(n), a, err)
			}
			if got := p.alloc.Holders(netip.MustParseAddr(vip)); len(got) != 1 || got[0] != Owner(o) {
				t.Fatalf("holders of %s after the move: %v, want %s", vip, got, Owner(o))
			}
			// Its status clears: the mark goes.
			cleared := n.DeepCopy()
			cleared.Status = v1.ServiceStatus{}
			if _, _, err := p.foreignStatus(context.Background(), client, cleared); err != nil {
				t.Fatal(err)
			}
			if p.wasDisplaced(Owner(n), []netip.Addr{netip.MustParseAddr(vip)}) {
				t.Fatal("the displaced mark outlived the status")
			}
		})
	}
}
