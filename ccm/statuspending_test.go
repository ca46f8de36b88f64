package ccm

import (
	"testing"

	"k8s.io/client-go/util/workqueue"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/testutil"
)

// TestStatusRefreshPending: vipcast_ipam_pool_status_refresh_pending reads
// 1 from a pool change until a status write that started after it
// succeeds; a change during a write keeps it at 1 until the next write.
func TestStatusRefreshPending(t *testing.T) {
	m := newProviderMetrics()
	if err := m.register(metrics.NewKubeRegistry().Register); err != nil {
		t.Fatal(err)
	}
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
	defer q.ShutDown()
	pc := &poolController{metrics: m, queue: q}
	gauge := func(step string, want float64) {
		t.Helper()
		got, err := testutil.GetGaugeMetricValue(m.statusPending)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("%s: vipcast_ipam_pool_status_refresh_pending = %v, want %v", step, got, want)
		}
	}
	gauge("at start", 0)
	pc.markStatusDirty()
	gauge("after a pool change", 1)
	n := pc.statusWriteStarts()
	pc.markStatusDirty()
	pc.statusWritten(n)
	gauge("after a write that started before the last change", 1)
	n = pc.statusWriteStarts()
	pc.statusWritten(n)
	gauge("after a write that covers every change", 0)
	var none *poolController
	none.markStatusDirty() // no pools controller: nothing to write, no panic
}
