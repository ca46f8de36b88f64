package speaker

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/klog/v2/textlogger"
)

// TestContactLogsOncePerOutage checks what the API server probe says: one
// line when contact is lost (another wording when it never was made), one
// when it returns, nothing for the failures in between, and the last
// answer's time in vipcast_speaker_apiserver_last_contact_timestamp_seconds.
func TestContactLogsOncePerOutage(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	cfg := textlogger.NewConfig(textlogger.Output(&buf), textlogger.Verbosity(0))
	logger := textlogger.NewLogger(cfg)
	clock := time.Unix(1_000_000, 0)
	var lost, back int
	c := &contact{metrics: m, now: func() time.Time { return clock }, lost: func() { lost++ }, back: func() { back++ }}
	down := errors.New("connection refused")

	// lost and back (the outage hold's hooks) are called once per outage
	// after the first answer, not for the failures before it.
	steps := []struct {
		err             error
		wantLog         string // substring of the only new line; empty: no line
		wantLast        float64
		wantLost, wantB int
	}{
		{down, "unreachable at start: nothing is announced", 0, 0, 0},
		{down, "", 0, 0, 0},
		{nil, "reachable again", 1_000_020, 0, 0},
		{nil, "", 1_000_030, 0, 0},
		{down, "keeping BGP sessions, routes and IPVS exactly as they are", 1_000_030, 1, 0},
		{down, "", 1_000_030, 1, 0},
		{down, "", 1_000_030, 1, 0},
		{nil, `unreachableFor="30s"`, 1_000_070, 1, 1},
		{nil, "", 1_000_080, 1, 1},
	}
	for i, s := range steps {
		buf.Reset()
		c.record(logger, s.err)
		lines := strings.Count(buf.String(), "\n")
		switch {
		case s.wantLog == "" && lines != 0:
			t.Errorf("step %d: logged %q, want nothing", i, buf.String())
		case s.wantLog != "" && (lines != 1 || !strings.Contains(buf.String(), s.wantLog)):
			t.Errorf("step %d: logged %q, want one line with %q", i, buf.String(), s.wantLog)
		}
		if got := testutil.ToFloat64(m.lastContact); got != s.wantLast {
			t.Errorf("step %d: last contact metric %v, want %v", i, got, s.wantLast)
		}
		if lost != s.wantLost || back != s.wantB {
			t.Errorf("step %d: lost called %d times, back %d, want %d and %d", i, lost, back, s.wantLost, s.wantB)
		}
		clock = clock.Add(10 * time.Second)
	}
}
