package bgp

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// slowSpeaker is a Speaker whose engine does not answer: Sessions fails.
type slowSpeaker struct{ Speaker }

func (slowSpeaker) Sessions(context.Context) ([]SessionState, error) {
	return nil, errors.New("list BGP peers: context deadline exceeded")
}

// TestCollectorEngineSilent: when the engine does not answer, the scrape
// still succeeds: vipcast_bgp_scrape_success 0, no session metrics, and
// the registry's other metrics are gathered (CI once lost the API
// server's last-contact metric to a BGP engine busy for 5 s).
func TestCollectorEngineSilent(t *testing.T) {
	reg := prometheus.NewRegistry()
	other := prometheus.NewGauge(prometheus.GaugeOpts{Name: "vipcast_speaker_apiserver_last_contact_timestamp_seconds", Help: "h"})
	other.Set(42)
	reg.MustRegister(NewCollector(slowSpeaker{}), other)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP vipcast_bgp_scrape_success Whether this scrape read the BGP sessions from the engine (1) or the engine did not answer within 5 s (0: the session metrics are absent from this scrape).
# TYPE vipcast_bgp_scrape_success gauge
vipcast_bgp_scrape_success 0
# HELP vipcast_speaker_apiserver_last_contact_timestamp_seconds h
# TYPE vipcast_speaker_apiserver_last_contact_timestamp_seconds gauge
vipcast_speaker_apiserver_last_contact_timestamp_seconds 42
`)); err != nil {
		t.Errorf("gather with a silent engine: %v", err)
	}
}
