package poolspec

import (
	"fmt"
	"net/netip"
	"reflect"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/vipcast/vipcast/api/v1alpha1"
	fx "github.com/vipcast/vipcast/api/v1alpha1/v1alpha1test"
)

func terminatingPool(p *v1alpha1.IPPool) *v1alpha1.IPPool {
	p.DeletionTimestamp = &metav1.Time{Time: fx.Epoch()}
	return p
}

func TestHolder(t *testing.T) {
	narrowed := fx.WithBGP(fx.Pool("narrowed", 0, "192.0.2.16/28"), v1alpha1.IPPoolBGP{Communities: []string{"64512:1"}, AggregationLength: ptr.To[int32](28)})
	// Refused: its aggregate would cover addresses outside it; its
	// community still decodes, its other community does not.
	broken := fx.WithBGP(fx.Pool("broken", 1, "198.51.100.10-198.51.100.20"),
		v1alpha1.IPPoolBGP{Communities: []string{"64512:2", "bogus"}, AggregationLength: ptr.To[int32](24), PeerSelector: &badSel})
	closing := terminatingPool(fx.Pool("closing", 2, "203.0.113.0/24"))
	pools := []*v1alpha1.IPPool{narrowed, broken, closing}
	adm := Admit(pools)

	tests := []struct {
		name   string
		ip     string
		named  string
		pool   string // "" for no holder
		inSpec bool
		comms  []uint32
		agg    int
	}{
		{"in spec, no annotation", "192.0.2.17", "", "narrowed", true, []uint32{64512<<16 | 1}, 28},
		{"in spec: the spec wins over the annotation", "192.0.2.17", "broken", "narrowed", true, []uint32{64512<<16 | 1}, 28},
		{"narrowed out: the annotated pool holds it, host route", "192.0.2.3", "narrowed", "narrowed", false, []uint32{64512<<16 | 1}, 32},
		{"narrowed out, no annotation: no holder", "192.0.2.3", "", "", false, nil, 0},
		{"annotation naming no pool: no holder", "192.0.2.3", "gone", "", false, nil, 0},
		{"refused pool's spec contains it", "198.51.100.15", "", "broken", false, []uint32{64512<<16 | 2}, 32},
		{"refused pool, annotated", "198.51.100.15", "broken", "broken", false, []uint32{64512<<16 | 2}, 32},
		{"terminating pool still owns its spec", "203.0.113.9", "", "closing", true, nil, 32},
		{"terminating pool holds outside its spec too", "10.9.9.9", "closing", "closing", false, nil, 32},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, ok := adm.Holder(netip.MustParseAddr(tt.ip), tt.named)
			if ok != (tt.pool != "") || h.Pool != tt.pool || h.InSpec != tt.inSpec {
				t.Fatalf("Holder(%s, %q) = %+v, %v; want pool %q inSpec %v", tt.ip, tt.named, h, ok, tt.pool, tt.inSpec)
			}
			if !ok {
				return
			}
			if !reflect.DeepEqual(h.BGP.Communities, tt.comms) || h.BGP.AggregationLength != tt.agg {
				t.Errorf("BGP = communities %v aggregation %d, want %v %d", h.BGP.Communities, h.BGP.AggregationLength, tt.comms, tt.agg)
			}
			if tt.pool == "broken" && h.BGP.PeerSelector != nil {
				t.Errorf("an unparsable peerSelector must fall back to every peer (nil), got %v", h.BGP.PeerSelector)
			}
		})
	}
	if r, ok := adm.RefusalOf("broken"); !ok || r.Reason != v1alpha1.ReasonInvalidAddresses {
		t.Errorf("broken: refusal %+v %v, want InvalidAddresses", r, ok)
	}
	if p := adm.PoolFor(netip.MustParseAddr("203.0.113.9")); p == nil || !p.Spec.Terminating {
		t.Errorf("closing: admitted %v, want admitted and Terminating in the allocator's spec", p)
	}
}

func TestHoldings(t *testing.T) {
	adm := Admit([]*v1alpha1.IPPool{fx.Pool("a", 0, "192.0.2.0/28"), fx.Pool("b", 1, "2001:db8::/120")})
	got := adm.Holdings([]Published{
		{Service: "ns/one", Pool: "a", IPs: []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1")}},
		{Service: "ns/two", Pool: "a", IPs: []netip.Addr{netip.MustParseAddr("192.0.2.200")}},
		{Service: "ns/three", IPs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}},
	})
	want := map[string][]Holding{
		"a": {{"ns/one", netip.MustParseAddr("192.0.2.1"), true}, {"ns/two", netip.MustParseAddr("192.0.2.200"), false}},
		"b": {{"ns/one", netip.MustParseAddr("2001:db8::1"), true}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Holdings = %v, want %v", got, want)
	}
	if h := Holders(append(got["a"], got["b"]...)); !reflect.DeepEqual(h, []string{"ns/one", "ns/two"}) {
		t.Errorf("Holders = %v", h)
	}
}

func TestSummary(t *testing.T) {
	for _, tt := range []struct {
		list  []string
		limit int
		want  string
	}{
		{nil, 3, ""},
		{[]string{"a", "b"}, 3, "a, b"},
		{[]string{"a", "b", "c", "d", "e"}, 3, "a, b, c and 2 more"},
	} {
		if got := Summary(tt.list, tt.limit); got != tt.want {
			t.Errorf("Summary(%v, %d) = %q, want %q", tt.list, tt.limit, got, tt.want)
		}
	}
}

func TestHeldBy(t *testing.T) {
	tests := []struct {
		name string
		ann  map[string]string
		want string
	}{
		{"none", nil, ""},
		{"request only (published before the record existed)", map[string]string{AnnotationPool: "a"}, "a"},
		{"record only", map[string]string{AnnotationAllocatedFrom: "b"}, "b"},
		{"the record wins over an edited request", map[string]string{AnnotationPool: "gone", AnnotationAllocatedFrom: "b"}, "b"},
		{"an empty record falls back to the request", map[string]string{AnnotationPool: "a", AnnotationAllocatedFrom: ""}, "a"},
	}
	for _, tt := range tests {
		if got := HeldBy(tt.ann); got != tt.want {
			t.Errorf("%s: HeldBy(%v) = %q, want %q", tt.name, tt.ann, got, tt.want)
		}
	}
}

// BenchmarkHolders: the distinct holders of a pool holding 10,000
// Services' VIPs, two each (dual stack), as the CCM computes them for a
// pool's deletion protection.
func BenchmarkHolders(b *testing.B) {
	hs := make([]Holding, 0, 20000)
	for i := range 10000 {
		svc := fmt.Sprintf("ns%d/svc%d", i%50, i)
		hs = append(hs, Holding{Service: svc}, Holding{Service: svc})
	}
	b.ReportAllocs()
	for b.Loop() {
		if got := Holders(hs); len(got) != 10000 {
			b.Fatalf("%d holders, want 10000", len(got))
		}
	}
}
