package speaker

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the speaker's own Prometheus metrics (the BGP sessions'
// metrics come from bgp.NewCollector). A nil *Metrics records nothing.
type Metrics struct {
	announced      prometheus.Gauge
	syncSeconds    *prometheus.HistogramVec
	virtualServers prometheus.Gauge
	changes        prometheus.Counter
}

// NewMetrics creates the speaker's metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		announced: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vipcast_speaker_announced_prefixes",
			Help: "Prefixes this node currently announces over BGP.",
		}),
		syncSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "vipcast_speaker_sync_duration_seconds",
			Help:    "Time to recompute and apply routes and virtual servers, by kind of sync: service (one Service), config (node, pools or peers changed: every Service) or dataplane-resync (the whole kernel table compared).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}, []string{"kind"}),
		virtualServers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vipcast_ipvs_virtual_servers",
			Help: "IPVS virtual servers this node programs for LoadBalancer Services.",
		}),
		changes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vipcast_ipvs_kernel_changes_total",
			Help: "IPVS, VIP address and SNAT changes made in the kernel (a resync that finds no drift makes none).",
		}),
	}
	for _, c := range []prometheus.Collector{m.announced, m.syncSeconds, m.virtualServers, m.changes} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *Metrics) observeSync(kind string, start time.Time) {
	if m != nil {
		m.syncSeconds.WithLabelValues(kind).Observe(time.Since(start).Seconds())
	}
}

func (m *Metrics) setAnnounced(n int) {
	if m != nil {
		m.announced.Set(float64(n))
	}
}

func (m *Metrics) setVirtualServers(n int) {
	if m != nil {
		m.virtualServers.Set(float64(n))
	}
}

func (m *Metrics) kernelChanges(n int) {
	if m != nil && n > 0 {
		m.changes.Add(float64(n))
	}
}
