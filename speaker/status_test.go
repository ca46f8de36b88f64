package speaker

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	clienttesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/bgp"
	"github.com/vipcast/vipcast/lbclass"
)

func TestBuildSpeakerStatus(t *testing.T) {
	since := time.Date(2026, 11, 24, 10, 0, 0, 500, time.UTC)
	sessions := []bgp.SessionState{
		{Peer: "tor-b", Address: netip.MustParseAddr("10.0.0.253"), State: "Active", Reason: "connection refused", Since: since,
			BFD: "Down", BFDDiag: "control detection time expired"},
		// A reason left from an earlier failure is not shown once up.
		{Peer: "tor-a", Address: netip.MustParseAddr("10.0.0.254"), State: "Established", Reason: "hold timer expired", Since: since, Announced: 2, BFD: "Up"},
		{Peer: "rr", Address: netip.MustParseAddr("fd00::1"), State: "Idle"},
	}
	prefixes := []netip.Prefix{netip.MustParsePrefix("203.0.113.7/32"), netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("2001:db8::1/128")}
	refused := map[string]string{
		"web/b": "IPVS: file exists; " + strings.Repeat("x", 300),
		"web/a": "IPVS: invalid argument",
	}
	for i := range 20 {
		prefixes = append(prefixes, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}), 32))
	}
	got := BuildSpeakerStatus(sessions, 10000, prefixes, 3, refused, lbclass.Selector{Class: "vipcast.io/bgp"})
	at := &metav1.Time{Time: since.Truncate(time.Second)}
	want := vipcastv1alpha1.SpeakerStatusStatus{
		SessionsConfigured:  3,
		SessionsEstablished: 1,
		Sessions: []vipcastv1alpha1.SpeakerSession{
			{Peer: "rr", Address: "fd00::1", State: "Idle"},
			{Peer: "tor-a", Address: "10.0.0.254", State: "Established", Since: at, PrefixesSent: 2, BFD: "Up"},
			{Peer: "tor-b", Address: "10.0.0.253", State: "Active", Since: at, LastError: "connection refused", BFD: "Down", BFDDiagnostic: "control detection time expired"},
		},
		// The count exact, the first 8 prefixes as a sample.
		AnnouncedCount:    10000,
		Announced:         []string{"10.0.0.0/32", "10.0.0.1/32", "10.0.0.2/32", "10.0.0.3/32", "10.0.0.4/32", "10.0.0.5/32", "10.0.0.6/32", "10.0.0.7/32"},
		NotAnnouncedCount: 3,
		RefusedCount:      2,
		Refused: []vipcastv1alpha1.RefusedService{
			{Service: "web/a", Message: "IPVS: invalid argument"},
			{Service: "web/b", Message: ("IPVS: file exists; " + strings.Repeat("x", 300))[:vipcastv1alpha1.MaxSpeakerStatusMessage-len("…")] + "…"},
		},
		LoadBalancerClass: "vipcast.io/bgp",
		ServesClassless:   true, // the class and the class-less Services
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("BuildSpeakerStatus =\n%+v\nwant\n%+v", got, want)
	}
	if empty := BuildSpeakerStatus(nil, 0, nil, 0, nil, lbclass.Selector{}); !reflect.DeepEqual(empty, vipcastv1alpha1.SpeakerStatusStatus{ServesClassless: true}) {
		t.Errorf("nothing to report: %+v, want the zero status serving class-less Services", empty)
	}
	if c := cut(strings.Repeat("é", 200)); len(c) > vipcastv1alpha1.MaxSpeakerStatusMessage || !utf8.ValidString(c) {
		t.Errorf("cut: %d bytes, valid UTF-8 %v", len(c), utf8.ValidString(c))
	}
}

// statusOf is the SpeakerStatus of a node in a cluster of n Services,
// every one announced (IPv4 host routes) and not announced either, every
// tenth refused by the kernel with the longest message, with four
// sessions.
func statusOf(n int) *vipcastv1alpha1.SpeakerStatus {
	prefixes := make([]netip.Prefix, n)
	refused := map[string]string{}
	for i := range n {
		prefixes[i] = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), 32)
		if i%10 == 0 {
			refused[fmt.Sprintf("ns-%04d/svc-%05d", i%100, i)] = strings.Repeat("x", 1000)
		}
	}
	var sessions []bgp.SessionState
	for i := range vipcastv1alpha1.MaxSpeakerStatusSessions {
		sessions = append(sessions, bgp.SessionState{Peer: fmt.Sprintf("tor-%d", i), Address: netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}),
			State: "Active", Reason: strings.Repeat("y", 1000), Since: time.Now(), BFD: "Down", BFDDiag: "control detection time expired"})
	}
	return &vipcastv1alpha1.SpeakerStatus{
		ObjectMeta: metav1.ObjectMeta{Name: "node-a"},
		Status:     BuildSpeakerStatus(sessions, n, prefixes, n, refused, lbclass.Selector{}),
	}
}

// samplePrefixes returns n IPv4 host prefixes.
func samplePrefixes(n int) []netip.Prefix {
	out := make([]netip.Prefix, n)
	for i := range out {
		out[i] = netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 51, 100, byte(i)}), 32)
	}
	return out
}

// TestSpeakerStatusSize: the object's size does not grow with the
// Services — the same at 100 and at 10,000, and small (what each write
// costs etcd).
func TestSpeakerStatusSize(t *testing.T) {
	size := func(n int) int {
		data, err := json.Marshal(statusOf(n))
		if err != nil {
			t.Fatal(err)
		}
		return len(data)
	}
	small, large := size(100), size(10000)
	t.Logf("100 Services: %d bytes; 10,000: %d bytes", small, large)
	// Only the digits of the counts differ.
	if large-small > 16 {
		t.Errorf("%d bytes at 10,000 Services, %d at 100: the status grows with the Services", large, small)
	}
	if large > 20<<10 {
		t.Errorf("%d bytes with every list full and the longest messages, want at most 20 KiB", large)
	}
	// A typical node: two sessions up, a few prefixes, nothing refused.
	typical := &vipcastv1alpha1.SpeakerStatus{ObjectMeta: metav1.ObjectMeta{Name: "worker-017.rack-04.example.com"}, Status: BuildSpeakerStatus(
		[]bgp.SessionState{
			{Peer: "tor-a", Address: netip.MustParseAddr("10.0.0.254"), State: "Established", Since: time.Now(), Announced: 10000, BFD: "Up"},
			{Peer: "tor-b", Address: netip.MustParseAddr("10.0.1.254"), State: "Established", Since: time.Now(), Announced: 10000, BFD: "Up"},
		}, 10000, samplePrefixes(8), 120, nil, lbclass.Selector{})}
	data, err := json.Marshal(typical)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("a typical node (two sessions up, 10,000 prefixes, 120 Services not announced): %d bytes", len(data))
	if len(data) > 2<<10 {
		t.Errorf("a typical node's status: %d bytes, want at most 2 KiB", len(data))
	}
}

// BenchmarkSpeakerStatus10k builds the SpeakerStatus of a node of a
// 10,000-Service cluster (every list full) and reports its size.
func BenchmarkSpeakerStatus10k(b *testing.B) {
	var size int
	for b.Loop() {
		data, err := json.Marshal(statusOf(10000))
		if err != nil {
			b.Fatal(err)
		}
		size = len(data)
	}
	b.ReportMetric(float64(size), "bytes/object")
	b.ReportMetric(float64(size)/(3<<19), "x-etcd-limit")
}

// TestStatusWriter: the writer creates the object owned by the Node and
// writes with one JSON patch of the status subresource; a change of the
// counts waits for the interval (with its jitter), a change of a session
// is written at once, and a status equal to the written one is not
// written again.
func TestStatusWriter(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := vipcastv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme,
		map[schema.GroupVersionResource]string{vipcastv1alpha1.SpeakerStatusesResource: "SpeakerStatusList"})
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC))
	const interval = 30 * time.Second
	w := newStatusWriter(dyn, interval, clk)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go w.run(ctx)

	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "uid-1"}}
	sessions := []bgp.SessionState{{Peer: "tor", Address: netip.MustParseAddr("10.0.0.254"), State: "Established"}}
	read := func() vipcastv1alpha1.SpeakerStatus {
		u, err := dyn.Resource(vipcastv1alpha1.SpeakerStatusesResource).Get(t.Context(), "n1", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return vipcastv1alpha1.SpeakerStatus{}
		}
		if err != nil {
			t.Fatal(err)
		}
		var s vipcastv1alpha1.SpeakerStatus
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	waitCount := func(what string, n int32) {
		t.Helper()
		eventually(t, what, func() bool { return read().Status.AnnouncedCount == n }, func() string { return fmt.Sprintf("%+v", read().Status) })
	}
	// settled waits until the writer waits on its timer, or on nothing.
	settled := func(timer bool) {
		t.Helper()
		eventually(t, "the writer waiting", func() bool { return clk.HasWaiters() == timer && len(w.kick) == 0 },
			func() string { return fmt.Sprint("waiters ", clk.Waiters()) })
		time.Sleep(20 * time.Millisecond) // past the check, into the select
	}

	w.set(node, BuildSpeakerStatus(sessions, 1, nil, 0, nil, lbclass.Selector{}))
	waitCount("the first status, at once", 1)
	if o := read().OwnerReferences; len(o) != 1 || o[0].Kind != "Node" || o[0].UID != "uid-1" {
		t.Errorf("owner references %+v, want the Node", o)
	}
	patches := func() (n int) {
		for _, a := range dyn.Actions() {
			if p, ok := a.(clienttesting.PatchAction); ok {
				if p.GetSubresource() != "status" || p.GetPatchType() != types.JSONPatchType {
					t.Errorf("patch of %q with %s, want a JSON patch of the status", p.GetSubresource(), p.GetPatchType())
				}
				n++
			}
			if a.GetVerb() == "update" { // the test's reads are the gets
				t.Errorf("update %s: the writer only patches (and creates)", a.GetSubresource())
			}
		}
		return n
	}

	// The counts change: written once the interval (and its jitter) has
	// passed, not before; the latest status wins.
	first := patches()
	w.set(node, BuildSpeakerStatus(sessions, 2, nil, 0, nil, lbclass.Selector{}))
	w.set(node, BuildSpeakerStatus(sessions, 3, nil, 0, nil, lbclass.Selector{}))
	settled(true)
	clk.Step(interval - time.Second)
	settled(true)
	if got := read().Status.AnnouncedCount; got != 1 || patches() != first {
		t.Fatalf("announcedCount %d, %d patches before the interval passed, want 1 and %d", got, patches(), first)
	}
	clk.Step(time.Duration(statusJitter*float64(interval)) + time.Second)
	waitCount("the counts, after the interval", 3)
	if patches() != first+1 {
		t.Errorf("%d patches, want %d: one for both changes", patches(), first+1)
	}

	// A session goes down: written at once.
	down := []bgp.SessionState{{Peer: "tor", Address: netip.MustParseAddr("10.0.0.254"), State: "Active", Reason: "hold timer expired"}}
	w.set(node, BuildSpeakerStatus(down, 3, nil, 0, nil, lbclass.Selector{}))
	eventually(t, "the session's change, at once", func() bool { return read().Status.SessionsEstablished == 0 }, func() string { return fmt.Sprintf("%+v", read().Status) })

	// The same status again: nothing written.
	n := patches()
	w.set(node, BuildSpeakerStatus(down, 3, nil, 0, nil, lbclass.Selector{}))
	settled(false)
	clk.Step(2 * interval)
	settled(false)
	if patches() != n {
		t.Errorf("%d patches after an unchanged status, want %d", patches(), n)
	}

	// The object deleted behind the writer's back: created again.
	if err := dyn.Resource(vipcastv1alpha1.SpeakerStatusesResource).Delete(t.Context(), "n1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	w.set(node, BuildSpeakerStatus(sessions, 3, nil, 0, nil, lbclass.Selector{}))
	waitCount("the status, recreated", 3)
}
