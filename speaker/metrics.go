package speaker

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the speaker's own Prometheus metrics (the BGP sessions'
// metrics come from bgp.NewCollector). A nil *Metrics records nothing.
type Metrics struct {
	announced   prometheus.Gauge
	syncSeconds *prometheus.HistogramVec
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
			Help:    "Time to recompute and apply routes, by kind of sync: service (one Service) or config (node, pools or peers changed: every Service).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}, []string{"kind"}),
	}
	for _, c := range []prometheus.Collector{m.announced, m.syncSeconds} {
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
