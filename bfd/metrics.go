package bfd

import (
	"sort"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// reasonKernel counts the packets the listening sockets' kernel filters
// dropped (a TTL below the minimum) or that found the socket's queue full:
// the kernel's drop count, read with each received packet.
const reasonKernel = "kernel"

// Discards counts a Manager's discarded packets by reason; the set of
// reasons is fixed when it is made, so that each is exported from zero.
type Discards struct {
	by map[string]*atomic.Uint64
}

func newDiscards() *Discards {
	m := map[string]*atomic.Uint64{reasonKernel: {}, "other": {}}
	for _, r := range reasons {
		m[r] = &atomic.Uint64{}
	}
	return &Discards{by: m}
}

// count adds n packets discarded for reason.
func (d *Discards) count(reason string, n uint64) {
	c := d.by[reason]
	if c == nil {
		c = d.by["other"]
	}
	c.Add(n)
}

// Discarded returns how many received packets were discarded for reason
// (a label of vipcast_bfd_discarded_packets_total).
func (d *Discards) Discarded(reason string) uint64 {
	if c := d.by[reason]; c != nil {
		return c.Load()
	}
	return 0
}

// discardedDesc describes vipcast_bfd_discarded_packets_total.
var discardedDesc = prometheus.NewDesc("vipcast_bfd_discarded_packets_total",
	"BFD Control packets received and discarded (RFC 5880 section 6.8.6), by reason: malformed (short, version, length, detect_mult, "+
		"multipoint, my_discriminator_zero, your_discriminator_zero, auth_length), of no session (no_session), with Your Discriminator 0 "+
		"while the session is not Down (your_discriminator_zero_session_up), with another My Discriminator while Up "+
		"(my_discriminator_mismatch), below the minimum TTL (ttl; kernel counts the kernel filter's drops), or failing authentication "+
		"(auth_missing, auth_unexpected, auth_key, auth_digest, auth_sequence).",
	[]string{"reason"}, nil)

// Collector returns the Prometheus collector of the discard counters:
//
//	vipcast_bfd_discarded_packets_total{reason}
func (d *Discards) Collector() prometheus.Collector { return collector{d} }

type collector struct{ d *Discards }

// Describe sends the descriptor.
func (collector) Describe(ch chan<- *prometheus.Desc) { ch <- discardedDesc }

// Collect sends one counter per reason.
func (c collector) Collect(ch chan<- prometheus.Metric) {
	names := make([]string, 0, len(c.d.by))
	for r := range c.d.by {
		names = append(names, r)
	}
	sort.Strings(names)
	for _, r := range names {
		ch <- prometheus.MustNewConstMetric(discardedDesc, prometheus.CounterValue, float64(c.d.by[r].Load()), r)
	}
}
