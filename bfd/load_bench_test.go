package bfd

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"time"

	"k8s.io/klog/v2"
)

// BenchmarkTimersUnderLoad measures how late the process's own load makes
// a BFD session's timers: two Managers over loopback at 50 ms × 3
// (detection 150 ms, a sixth of the usual 300 ms × 3), while goroutines
// of the same process decode JSON lists, as a speaker's informers do
// when they relist after an API server outage: none, GOMAXPROCS and four
// times GOMAXPROCS of them, each window 3 s. It reports the most a
// periodic packet went out late (tx-late-ms) and the longest gap between
// two packets received while Up (rx-gap-ms, the peer's interval
// included), over both sessions, and the gap's share of the detection
// time (rx-gap/detect: the session goes down at 1).
func BenchmarkTimersUnderLoad(b *testing.B) {
	procs := runtime.GOMAXPROCS(0)
	for _, decoders := range []int{0, procs, 4 * procs} {
		b.Run(fmt.Sprintf("decoders=%d", decoders), func(b *testing.B) {
			for range b.N {
				txLate, rxGap, detect := timersUnderLoad(b, decoders, 3*time.Second)
				b.ReportMetric(float64(txLate)/float64(time.Millisecond), "tx-late-ms")
				b.ReportMetric(float64(rxGap)/float64(time.Millisecond), "rx-gap-ms")
				b.ReportMetric(float64(rxGap)/float64(detect), "rx-gap/detect")
			}
		})
	}
}

// timersUnderLoad brings two sessions Up at 50 ms × 3, runs decoders
// decoding goroutines for window, and returns the sessions' worst
// transmit delay and receive gap and their detection time.
func timersUnderLoad(b *testing.B, decoders int, window time.Duration) (txLate, rxGap, detect time.Duration) {
	b.Helper()
	timers := Timers{MinTx: 50 * time.Millisecond, MinRx: 50 * time.Millisecond, Multiplier: 3}
	a1, a2 := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")
	ma, mb := NewManager(klog.Background(), nil), NewManager(klog.Background(), nil)
	defer ma.Close()
	defer mb.Close()
	if err := ma.Set("b", SessionConfig{Peer: a2, Local: a1, Timers: timers}); err != nil {
		b.Fatal(err)
	}
	if err := mb.Set("a", SessionConfig{Peer: a1, Local: a2, Timers: timers}); err != nil {
		b.Fatal(err)
	}
	fast := func(st Status) bool { return st.State == Up && st.Tx == timers.MinTx }
	waitStatus(b, ma, "b", "Up at 50 ms", 10*time.Second, fast)
	waitStatus(b, mb, "a", "Up at 50 ms", 10*time.Second, fast)
	before := [2]Status{}
	before[0], _ = ma.Status("b")
	before[1], _ = mb.Status("a")

	list := catchUpList(b, 2000)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range decoders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				var out []map[string]any
				if err := json.Unmarshal(list, &out); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	time.Sleep(window)
	close(stop)
	wg.Wait()

	for i, st := range []Status{mustStatus(b, ma, "b"), mustStatus(b, mb, "a")} {
		if st.State != Up || st.Downs != before[i].Downs {
			b.Logf("session %d went down under load: %+v", i, st)
		}
		txLate, rxGap = max(txLate, st.TxLateMax), max(rxGap, st.RxGapMax)
		detect = st.Detect
	}
	return txLate, rxGap, detect
}

func mustStatus(b *testing.B, m *Manager, key string) Status {
	b.Helper()
	st, ok := m.Status(key)
	if !ok {
		b.Fatalf("session %s is gone", key)
	}
	return st
}

// catchUpList is a JSON list of n objects shaped like Services: what a
// relist decodes.
func catchUpList(b *testing.B, n int) []byte {
	b.Helper()
	type port struct {
		Name       string `json:"name"`
		Port       int    `json:"port"`
		TargetPort int    `json:"targetPort"`
		Protocol   string `json:"protocol"`
	}
	type obj struct {
		Metadata map[string]any `json:"metadata"`
		Spec     map[string]any `json:"spec"`
		Status   map[string]any `json:"status"`
	}
	objs := make([]obj, n)
	for i := range objs {
		objs[i] = obj{
			Metadata: map[string]any{"name": fmt.Sprintf("svc-%d", i), "namespace": "ns", "uid": fmt.Sprintf("%032x", i),
				"labels": map[string]string{"app": fmt.Sprintf("app-%d", i), "tier": "web"}, "resourceVersion": fmt.Sprint(1000 + i)},
			Spec: map[string]any{"type": "LoadBalancer", "clusterIP": "10.96.0.1", "externalTrafficPolicy": "Cluster",
				"ports": []port{{"http", 80, 8080, "TCP"}, {"https", 443, 8443, "TCP"}}, "selector": map[string]string{"app": "web"}},
			Status: map[string]any{"loadBalancer": map[string]any{"ingress": []map[string]string{{"ip": "192.0.2.1", "ipMode": "Proxy"}}}},
		}
	}
	out, err := json.Marshal(objs)
	if err != nil {
		b.Fatal(err)
	}
	return out
}
