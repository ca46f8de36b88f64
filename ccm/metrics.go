package ccm

import (
	"fmt"
	"math/big"

	"k8s.io/component-base/metrics"

	"github.com/vipcast/vipcast/ipam"
)

// providerMetrics are the CCM's Prometheus metrics, served on its /metrics
// endpoint next to the cloud-provider app's own.
type providerMetrics struct {
	poolCapacity *metrics.GaugeVec
	poolInUse    *metrics.GaugeVec
	allocations  *metrics.CounterVec
	releases     *metrics.CounterVec
	errors       *metrics.CounterVec
	// statusPending is 1 while an IPPool status refresh is scheduled or
	// running (markStatusDirty), 0 once one has finished after the last
	// change: with the controllers' workqueues drained, the CCM has nothing
	// left to write.
	statusPending *metrics.Gauge
}

func newProviderMetrics() *providerMetrics {
	const ns, sub = "vipcast", "ipam"
	return &providerMetrics{
		poolCapacity: metrics.NewGaugeVec(&metrics.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "pool_capacity_addresses",
			Help:           "Addresses an IPPool can hand out, by address family (avoided .0/.255 addresses excluded).",
			StabilityLevel: metrics.ALPHA,
		}, []string{"pool", "family"}),
		poolInUse: metrics.NewGaugeVec(&metrics.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "pool_in_use_addresses",
			Help:           "Addresses of an IPPool held by Services, by address family.",
			StabilityLevel: metrics.ALPHA,
		}, []string{"pool", "family"}),
		allocations: metrics.NewCounterVec(&metrics.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "allocations_total",
			Help:           "VIPs handed to Services, by pool and address family.",
			StabilityLevel: metrics.ALPHA,
		}, []string{"pool", "family"}),
		releases: metrics.NewCounterVec(&metrics.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "releases_total",
			Help:           "VIPs released by Services, by address family.",
			StabilityLevel: metrics.ALPHA,
		}, []string{"family"}),
		errors: metrics.NewCounterVec(&metrics.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "allocation_errors_total",
			Help:           "Failed VIP allocations, by reason (UnknownPool, NotInPool, IPInUse, PortClash, TrafficPolicyClash, PoolExhausted, NoEligiblePool, InvalidRequest).",
			StabilityLevel: metrics.ALPHA,
		}, []string{"reason"}),
		statusPending: metrics.NewGauge(&metrics.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "pool_status_refresh_pending",
			Help:           "1 while a refresh of the IPPools' status is scheduled or running, 0 once the status reflects every change seen.",
			StabilityLevel: metrics.ALPHA,
		}),
	}
}

// register adds every metric with reg (legacyregistry.Register in the binary).
func (m *providerMetrics) register(reg func(metrics.Registerable) error) error {
	for _, c := range []metrics.Registerable{m.poolCapacity, m.poolInUse, m.allocations, m.releases, m.errors, m.statusPending} {
		if err := reg(c); err != nil {
			return fmt.Errorf("registering metric: %w", err)
		}
	}
	return nil
}

func (m *providerMetrics) setPoolStats(pool string, st ipam.PoolStats) {
	for fam, fs := range map[ipam.Family]ipam.FamilyStats{ipam.IPv4: st.IPv4, ipam.IPv6: st.IPv6} {
		capacity := 0.0
		if fs.Capacity != nil {
			capacity, _ = new(big.Float).SetInt(fs.Capacity).Float64()
		}
		m.poolCapacity.WithLabelValues(pool, fam.String()).Set(capacity)
		m.poolInUse.WithLabelValues(pool, fam.String()).Set(float64(fs.InUse))
	}
}

func (m *providerMetrics) deletePool(pool string) {
	for _, fam := range []ipam.Family{ipam.IPv4, ipam.IPv6} {
		m.poolCapacity.DeleteLabelValues(pool, fam.String())
		m.poolInUse.DeleteLabelValues(pool, fam.String())
	}
}
