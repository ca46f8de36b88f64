package speaker

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vipcast/vipcast/ipvs"
)

// Metrics are the speaker's own Prometheus metrics (the BGP sessions'
// metrics come from bgp.NewCollector). A nil *Metrics records nothing.
type Metrics struct {
	announced      prometheus.Gauge
	syncSeconds    *prometheus.HistogramVec
	virtualServers prometheus.Gauge
	changes        prometheus.Counter
	drift          prometheus.Counter
	serviceErrors  *prometheus.GaugeVec
	lastContact    prometheus.Gauge
	tier1Nodes     *prometheus.GaugeVec
	outageHeld     prometheus.Gauge
}

// The reasons of vipcast_speaker_service_errors.
const (
	// reasonScheduler: the kernel lacks the Service's IPVS scheduler.
	reasonScheduler = "scheduler"
	// reasonKernel: the kernel refused the Service's virtual servers
	// for another reason.
	reasonKernel = "kernel"
)

// refusalReason classifies why the dataplane refused a Service.
func refusalReason(err error) string {
	if errors.Is(err, ipvs.ErrSchedulerUnavailable) {
		return reasonScheduler
	}
	return reasonKernel
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
			Help:    "Time to recompute and apply routes and virtual servers, by kind of sync: service (one Service), config (node, pools or peers changed: every Service), nodes (with two tiers, other nodes' NodeTunnels came, went or changed their addresses: the tunnel routes and the Services with endpoints on those nodes) or dataplane-resync (the whole kernel table compared).",
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
		drift: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vipcast_ipvs_drift_detected_total",
			Help: "Times the speaker found virtual servers it programmed gone from the kernel, removed by another program (kube-proxy flushes IPVS when it starts in nftables mode), and programmed them again: found by the resync its probe (every --dataplane-probe-period) asks for, by the periodic resync, or by a Service's sync.",
		}),
		serviceErrors: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "vipcast_speaker_service_errors",
			Help: "Services whose virtual servers this node's kernel refused, so that it does not announce them, by reason: scheduler (the kernel lacks the Service's IPVS scheduler) or kernel (another refusal).",
		}, []string{"reason"}),
		lastContact: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vipcast_speaker_apiserver_last_contact_timestamp_seconds",
			Help: "Unix time of the API server's last answer to the speaker's probe (every 10s); 0 before the first. While the API server is unreachable the speaker keeps its sessions, routes and IPVS as they are: alert on time() minus this.",
		}),
		tier1Nodes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "vipcast_speaker_tier1_nodes",
			Help: "With two tiers and --speaker-service: the nodes with a tunnel address, by whether their speaker is ready (a ready endpoint of the speakers' Service). Tier 1 sends no new flow to a not_ready node while a ready one hosts an endpoint.",
		}, []string{"state"}),
		outageHeld: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vipcast_speaker_outage_held_endpoints",
			Help: "Endpoints the EndpointSlices call not ready that the speaker reads as ready, as they were when the API server became unreachable, until --outage-settle after it answers again (the node monitor's catch-up after an outage). 0 outside that time.",
		}),
	}
	for _, r := range []string{reasonScheduler, reasonKernel} {
		m.serviceErrors.WithLabelValues(r).Set(0)
	}
	for _, c := range []prometheus.Collector{m.announced, m.syncSeconds, m.virtualServers, m.changes, m.drift, m.serviceErrors, m.lastContact, m.tier1Nodes, m.outageHeld} {
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

func (m *Metrics) setTier1Nodes(ready, notReady int) {
	if m != nil {
		m.tier1Nodes.WithLabelValues("ready").Set(float64(ready))
		m.tier1Nodes.WithLabelValues("not_ready").Set(float64(notReady))
	}
}

func (m *Metrics) setOutageHeld(n int) {
	if m != nil {
		m.outageHeld.Set(float64(n))
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

func (m *Metrics) driftDetected() {
	if m != nil {
		m.drift.Inc()
	}
}

// setServiceErrors counts the refused Services (refused: by Service key)
// by reason.
func (m *Metrics) setServiceErrors(refused map[string]error) {
	if m == nil {
		return
	}
	counts := map[string]int{reasonScheduler: 0, reasonKernel: 0}
	for _, err := range refused {
		counts[refusalReason(err)]++
	}
	for r, n := range counts {
		m.serviceErrors.WithLabelValues(r).Set(float64(n))
	}
}

// contacted records an answer of the API server at t.
func (m *Metrics) contacted(t time.Time) {
	if m != nil {
		m.lastContact.Set(float64(t.UnixNano()) / 1e9)
	}
}

// relayCollector reads the connection sync relay's counters at each
// scrape (see RegisterRelayMetrics).
type relayCollector struct {
	desc, dropped, conns, clamped *prometheus.Desc
	stats                         func() (ipvs.RelayStats, bool)
}

// RegisterRelayMetrics registers
// vipcast_ipvs_conn_sync_relay_messages_total{direction}, read from stats
// at each scrape: the sync daemons' messages the relay sent to other
// nodes, received from them (and passed to the local backup), and dropped;
// vipcast_ipvs_conn_sync_relay_dropped_messages_total{reason} (the dropped
// ones by reason), vipcast_ipvs_conn_sync_relay_dropped_connections_total{reason}
// (connections left out of the messages: not tunnelled, or not to a
// tier-1 virtual server and real server of this node) and
// vipcast_ipvs_conn_sync_relay_clamped_connections_total.
// Without a relay (stats' ok false) they have no samples.
func RegisterRelayMetrics(reg prometheus.Registerer, stats func() (ipvs.RelayStats, bool)) error {
	return reg.Register(relayCollector{
		desc: prometheus.NewDesc("vipcast_ipvs_conn_sync_relay_messages_total",
			"IPVS sync messages the connection sync relay (--conn-sync-transport=relay) handled, by direction: sent (the local master's, once per other node), received (from other nodes, passed to the local backup) and dropped (see vipcast_ipvs_conn_sync_relay_dropped_messages_total).",
			[]string{"direction"}, nil),
		dropped: prometheus.NewDesc("vipcast_ipvs_conn_sync_relay_dropped_messages_total",
			"Datagrams the connection sync relay dropped, by reason: unknown-source (not a node's address), unsigned, unknown-key, bad-mac, stale (more than 30 s from this node's clock: a replay, or clocks apart), malformed (not a sync message of this sync ID), no-connection-left (every connection left out), send-failed.",
			[]string{"reason"}, nil),
		conns: prometheus.NewDesc("vipcast_ipvs_conn_sync_relay_dropped_connections_total",
			"Connections the relay left out of the messages it took, by reason: not-tunnel (another forwarding method than tier 1's) and unknown-target (no tier-1 virtual server of this node with that real server).",
			[]string{"reason"}, nil),
		clamped: prometheus.NewDesc("vipcast_ipvs_conn_sync_relay_clamped_connections_total",
			"Connections the relay passed on with their timeout cut to one hour.", nil, nil),
		stats: stats,
	})
}

// Describe implements prometheus.Collector.
func (c relayCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.desc
	ch <- c.dropped
	ch <- c.conns
	ch <- c.clamped
}

// Collect implements prometheus.Collector.
func (c relayCollector) Collect(ch chan<- prometheus.Metric) {
	s, ok := c.stats()
	if !ok {
		return
	}
	for _, v := range []struct {
		dir string
		n   uint64
	}{{"sent", s.Sent}, {"received", s.Received}, {"dropped", s.Dropped}} {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(v.n), v.dir)
	}
	for reason, n := range s.DroppedBy {
		ch <- prometheus.MustNewConstMetric(c.dropped, prometheus.CounterValue, float64(n), reason)
	}
	for reason, n := range s.DroppedConns {
		ch <- prometheus.MustNewConstMetric(c.conns, prometheus.CounterValue, float64(n), reason)
	}
	ch <- prometheus.MustNewConstMetric(c.clamped, prometheus.CounterValue, float64(s.ClampedConns))
}

// guardCollector reads the guards' drop counters at each scrape (see
// RegisterGuardMetrics).
type guardCollector struct {
	desc  *prometheus.Desc
	drops func() (map[string]uint64, error)
}

// RegisterGuardMetrics registers vipcast_ipvs_guard_dropped_packets_total{reason},
// read from drops (the kernel's counters, ipvs.Dataplane.GuardDrops) at
// each scrape: the packets the tunnel guard and the host guard dropped
// before they reached a tunnel device or a listener of the speaker.
func RegisterGuardMetrics(reg prometheus.Registerer, drops func() (map[string]uint64, error)) error {
	return reg.Register(guardCollector{
		desc: prometheus.NewDesc("vipcast_ipvs_guard_dropped_packets_total",
			"Packets the node's guards dropped in the kernel, by what they were for: tunnel (IPIP, 6in4, ip6ip6 from an address that is no node's), relay and sync-multicast (connection sync from a non-node), bfd (BFD from an address the node runs no BFD session with), metrics (the metrics port from a source --metrics-allowed-sources does not name). A guard not in force has no sample; its counters restart when its rules are rewritten.",
			[]string{"reason"}, nil),
		drops: drops,
	})
}

// Describe implements prometheus.Collector.
func (c guardCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c guardCollector) Collect(ch chan<- prometheus.Metric) {
	drops, err := c.drops()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.desc, err)
		return
	}
	for reason, n := range drops {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(n), reason)
	}
}
