package speaker

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/bgp"
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
	notAnnounced := map[string]string{
		"web/b": "no ready endpoint on this node (externalTrafficPolicy Local)",
		"web/a": "no ready endpoint on this node (externalTrafficPolicy Local)",
		"db/x":  "pool zoneb's nodeSelector does not select this node",
	}
	got := BuildSpeakerStatus(sessions, prefixes, notAnnounced)
	at := &metav1.Time{Time: since.Truncate(time.Second)}
	want := vipcastv1alpha1.SpeakerStatusStatus{
		SessionsConfigured:  3,
		SessionsEstablished: 1,
		Sessions: []vipcastv1alpha1.SpeakerSession{
			{Peer: "rr", Address: "fd00::1", State: "Idle"},
			{Peer: "tor-a", Address: "10.0.0.254", State: "Established", Since: at, PrefixesSent: 2, BFD: "Up"},
			{Peer: "tor-b", Address: "10.0.0.253", State: "Active", Since: at, LastError: "connection refused", BFD: "Down", BFDDiagnostic: "control detection time expired"},
		},
		AnnouncedCount:    3,
		Announced:         []string{"198.51.100.0/24", "203.0.113.7/32", "2001:db8::1/128"},
		NotAnnouncedCount: 3,
		NotAnnounced: []vipcastv1alpha1.NotAnnounced{
			{Reason: "no ready endpoint on this node (externalTrafficPolicy Local)", Services: []string{"web/a", "web/b"}},
			{Reason: "pool zoneb's nodeSelector does not select this node", Services: []string{"db/x"}},
		},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("BuildSpeakerStatus =\n%+v\nwant\n%+v", got, want)
	}
	if empty := BuildSpeakerStatus(nil, nil, nil); !reflect.DeepEqual(empty, vipcastv1alpha1.SpeakerStatusStatus{}) {
		t.Errorf("nothing to report: %+v, want the zero status", empty)
	}
}

// statusOf10k is the SpeakerStatus of a node in a cluster of 10,000
// Services: keyLen-byte Service keys, every one announced (IPv4 host
// routes, or IPv6 ones of the longest form with v6) and not announced
// either, for reasons distinct reasons.
func statusOf10k(keyLen, reasons int, v6 bool) *vipcastv1alpha1.SpeakerStatus {
	const n = 10000
	prefixes := make([]netip.Prefix, n)
	notAnnounced := make(map[string]string, n)
	for i := range n {
		if v6 {
			prefixes[i] = netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, byte(i >> 8), byte(i)}), 128)
		} else {
			prefixes[i] = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), 32)
		}
		key := fmt.Sprintf("ns-%04d/svc-%05d", i%100, i)
		key += strings.Repeat("x", max(0, keyLen-len(key)))
		notAnnounced[key] = fmt.Sprintf("no ready endpoint on this node (externalTrafficPolicy Local) [%d]", i%reasons)
	}
	sessions := []bgp.SessionState{{Peer: "tor-a", Address: netip.MustParseAddr("10.0.0.254"), State: "Established", Announced: n}}
	return &vipcastv1alpha1.SpeakerStatus{
		ObjectMeta: metav1.ObjectMeta{Name: "node-a"},
		Status:     BuildSpeakerStatus(sessions, prefixes, notAnnounced),
	}
}

// TestSpeakerStatusSize: with 10,000 Services the object stays well under
// etcd's 1.5 MiB limit — with realistic names, and bounded with the
// longest names and a distinct reason each.
func TestSpeakerStatusSize(t *testing.T) {
	const limit = 3 << 19 // 1.5 MiB
	for _, tc := range []struct {
		name            string
		keyLen, reasons int
		v6              bool
		max             int
	}{
		{"realistic", 20, 3, false, limit / 2},
		{"longest names, distinct reasons, IPv6", 316, 10000, true, limit * 2 / 3},
	} {
		obj := statusOf10k(tc.keyLen, tc.reasons, tc.v6)
		data, err := json.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %d bytes (%.0f%% of 1.5 MiB); %d of %d Services listed", tc.name, len(data), 100*float64(len(data))/limit,
			listed(obj.Status), obj.Status.NotAnnouncedCount)
		if len(data) > tc.max {
			t.Errorf("%s: %d bytes, want at most %d", tc.name, len(data), tc.max)
		}
		if obj.Status.AnnouncedCount != 10000 || obj.Status.NotAnnouncedCount != 10000 {
			t.Errorf("%s: counts %d announced, %d not, want 10000 each", tc.name, obj.Status.AnnouncedCount, obj.Status.NotAnnouncedCount)
		}
	}
}

func listed(st vipcastv1alpha1.SpeakerStatusStatus) int {
	n := 0
	for _, g := range st.NotAnnounced {
		n += len(g.Services)
	}
	return n
}

// BenchmarkSpeakerStatus10k builds the SpeakerStatus of a node of a
// 10,000-Service cluster (realistic names) and reports its size.
func BenchmarkSpeakerStatus10k(b *testing.B) {
	var size int
	for b.Loop() {
		data, err := json.Marshal(statusOf10k(20, 3, false))
		if err != nil {
			b.Fatal(err)
		}
		size = len(data)
	}
	b.ReportMetric(float64(size), "bytes/object")
	b.ReportMetric(float64(size)/(3<<19), "x-etcd-limit")
}
