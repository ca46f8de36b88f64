package bgp

import (
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr/funcr"
	gobgplog "github.com/osrg/gobgp/v3/pkg/log"
)

func TestLoggerConnectFailures(t *testing.T) {
	var mu sync.Mutex
	var lines []string
	sink := funcr.New(func(_, args string) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, args)
	}, funcr.Options{Verbosity: 0})
	l := newGobgpLogger(sink)

	refused := gobgplog.Fields{"Topic": "Peer", "Key": "192.0.2.1", "Error": "dial tcp 192.0.2.1:179: connect: connection refused"}
	timeout := gobgplog.Fields{"Topic": "Peer", "Key": "192.0.2.1", "Error": "dial tcp 192.0.2.1:179: i/o timeout"}
	for range 3 {
		l.Debug("failed to connect", refused) // gobgp retries
	}
	l.Debug("failed to connect", timeout)
	l.Debug("failed to connect", timeout)

	var said []string
	for _, line := range lines {
		if strings.Contains(line, "Cannot connect to BGP peer") {
			said = append(said, line)
		}
	}
	if len(said) != 2 || !strings.Contains(said[0], "connection refused") || !strings.Contains(said[1], "i/o timeout") {
		t.Fatalf("want one line per distinct error at verbosity 0, got %q (all: %q)", said, lines)
	}
	if got := l.reason("192.0.2.1"); !strings.Contains(got, "i/o timeout") {
		t.Errorf("reason = %q, want the last error", got)
	}
	// Debug messages themselves stay at V(4).
	for _, line := range lines {
		if strings.Contains(line, `"msg"="failed to connect"`) {
			t.Errorf("gobgp's debug message was written at verbosity 0: %s", line)
		}
	}
}
