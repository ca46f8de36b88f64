package bgp

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// sessionStates are the values of the state label of
// vipcast_bgp_session_state.
var sessionStates = []string{"Idle", "Connect", "Active", "OpenSent", "OpenConfirm", "Established"}

// collector exports a Speaker's sessions as Prometheus metrics.
type collector struct {
	s       Speaker
	timeout time.Duration

	read, up, state, announced, sent, received, transitions, limited, bfdUp, bfdDowns, bfdTxLate, bfdRxGap *prometheus.Desc
}

// NewCollector returns a Prometheus collector that reports the sessions
// of s at every scrape (through s.Sessions):
//
//	vipcast_bgp_scrape_success                    1 when the sessions were read
//	vipcast_bgp_session_up{peer}                  1 when Established
//	vipcast_bgp_session_state{peer,state}         1 for the current FSM state
//	vipcast_bgp_announced_prefixes{peer}          prefixes sent to the peer
//	vipcast_bgp_updates_sent_total{peer}          UPDATE messages sent
//	vipcast_bgp_updates_received_total{peer}      UPDATE messages received
//	vipcast_bgp_session_transitions_total{peer}   FSM state changes
//	vipcast_bgp_prefix_limit_shutdowns_total{peer}
//	    sessions shut down because the peer sent more than its prefix limit
//	vipcast_bfd_session_up{peer}                  1 when the BFD session is Up
//	vipcast_bfd_session_down_transitions_total{peer}
//	    BFD session changes from Up to Down
//	vipcast_bfd_transmit_delay_max_seconds{peer}
//	    the most a periodic BFD packet went out after its time
//	vipcast_bfd_receive_gap_max_seconds{peer}
//	    the longest time between two BFD packets accepted while Up
//
// The BFD metrics exist only for peers with BFD. When the engine does not
// answer within 5 s, the scrape carries vipcast_bgp_scrape_success 0 and
// no session metrics, and the speaker's other metrics are still served.
func NewCollector(s Speaker) prometheus.Collector {
	peer := []string{"peer"}
	return &collector{
		s:       s,
		timeout: 5 * time.Second,
		read: prometheus.NewDesc("vipcast_bgp_scrape_success",
			"Whether this scrape read the BGP sessions from the engine (1) or the engine did not answer within 5 s (0: the session metrics are absent from this scrape).", nil, nil),
		up: prometheus.NewDesc("vipcast_bgp_session_up",
			"Whether the BGP session is Established (1) or not (0).", peer, nil),
		state: prometheus.NewDesc("vipcast_bgp_session_state",
			"The BGP session's FSM state: 1 for the current state, 0 for the others.", []string{"peer", "state"}, nil),
		announced: prometheus.NewDesc("vipcast_bgp_announced_prefixes",
			"Prefixes announced to the BGP peer.", peer, nil),
		sent: prometheus.NewDesc("vipcast_bgp_updates_sent_total",
			"BGP UPDATE messages sent to the peer in the current session.", peer, nil),
		received: prometheus.NewDesc("vipcast_bgp_updates_received_total",
			"BGP UPDATE messages received from the peer in the current session.", peer, nil),
		transitions: prometheus.NewDesc("vipcast_bgp_session_transitions_total",
			"BGP session state changes since the peer was configured.", peer, nil),
		limited: prometheus.NewDesc("vipcast_bgp_prefix_limit_shutdowns_total",
			"BGP sessions shut down because the peer sent more prefixes than its limit in an address family, since the peer was configured.", peer, nil),
		bfdUp: prometheus.NewDesc("vipcast_bfd_session_up",
			"Whether the peer's BFD session is Up (1) or not (0); only for peers with BFD.", peer, nil),
		bfdDowns: prometheus.NewDesc("vipcast_bfd_session_down_transitions_total",
			"BFD session changes from Up to Down, each of which reset the BGP session unless the router had set the BFD session AdminDown.", peer, nil),
		bfdTxLate: prometheus.NewDesc("vipcast_bfd_transmit_delay_max_seconds",
			"The most a periodic BFD packet to the peer went out after its time, since the session started: the speaker's own scheduling delay on the sending side (compare with the peer's detection time).", peer, nil),
		bfdRxGap: prometheus.NewDesc("vipcast_bfd_receive_gap_max_seconds",
			"The longest time between two BFD packets from the peer accepted while the session was Up, since it started: the peer's interval and jitter plus the speaker's delay on the receiving side (compare with the detection time).", peer, nil),
	}
}

// Describe sends the descriptors of every metric.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.read, c.up, c.state, c.announced, c.sent, c.received, c.transitions, c.limited, c.bfdUp, c.bfdDowns, c.bfdTxLate, c.bfdRxGap} {
		ch <- d
	}
}

// Collect reports the current sessions. When the engine does not answer
// it reports vipcast_bgp_scrape_success 0 alone, rather than failing the
// whole scrape: a busy engine must not hide the speaker's other metrics
// (the API server's last contact, the dataplane's), which matter most
// when something is wrong.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	sessions, err := c.s.Sessions(ctx)
	ch <- prometheus.MustNewConstMetric(c.read, prometheus.GaugeValue, boolValue(err == nil))
	if err != nil {
		return
	}
	for _, s := range sessions {
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, boolValue(s.Established()), s.Peer)
		for _, st := range sessionStates {
			ch <- prometheus.MustNewConstMetric(c.state, prometheus.GaugeValue, boolValue(s.State == st), s.Peer, st)
		}
		ch <- prometheus.MustNewConstMetric(c.announced, prometheus.GaugeValue, float64(s.Announced), s.Peer)
		ch <- prometheus.MustNewConstMetric(c.sent, prometheus.CounterValue, float64(s.UpdatesSent), s.Peer)
		ch <- prometheus.MustNewConstMetric(c.received, prometheus.CounterValue, float64(s.UpdatesReceived), s.Peer)
		ch <- prometheus.MustNewConstMetric(c.transitions, prometheus.CounterValue, float64(s.Transitions), s.Peer)
		ch <- prometheus.MustNewConstMetric(c.limited, prometheus.CounterValue, float64(s.PrefixLimitShutdowns), s.Peer)
		if s.BFD != "" {
			ch <- prometheus.MustNewConstMetric(c.bfdUp, prometheus.GaugeValue, boolValue(s.BFD == "Up"), s.Peer)
			ch <- prometheus.MustNewConstMetric(c.bfdDowns, prometheus.CounterValue, float64(s.BFDDowns), s.Peer)
			ch <- prometheus.MustNewConstMetric(c.bfdTxLate, prometheus.GaugeValue, s.BFDTxLateMax.Seconds(), s.Peer)
			ch <- prometheus.MustNewConstMetric(c.bfdRxGap, prometheus.GaugeValue, s.BFDRxGapMax.Seconds(), s.Peer)
		}
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
