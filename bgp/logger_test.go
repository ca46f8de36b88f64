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
	l := newGobgpLogger(sink, func(int) { t.Error("exit called") })

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

// TestLoggerExitsOnPanicAndFatal checks that gobgp's Panic and Fatal end
// the process (through the exit hook) after logging the message.
func TestLoggerExitsOnPanicAndFatal(t *testing.T) {
	for _, call := range []string{"Panic", "Fatal"} {
		var lines []string
		var codes []int
		l := newGobgpLogger(funcr.New(func(_, args string) { lines = append(lines, args) }, funcr.Options{}),
			func(code int) { codes = append(codes, code) })
		fields := gobgplog.Fields{"Topic": "Peer", "Key": "192.0.2.1", "State": "BGP_FSM_ESTABLISHED"}
		if call == "Panic" {
			l.Panic("code logic bug", fields)
		} else {
			l.Fatal("failed to listen grpc port", fields)
		}
		if len(codes) != 1 || codes[0] != 1 {
			t.Errorf("%s: exit codes %v, want [1]", call, codes)
		}
		if len(lines) != 1 || !strings.Contains(lines[0], "exiting") || !strings.Contains(lines[0], "192.0.2.1") {
			t.Errorf("%s: logged %q, want one line saying it exits, with gobgp's fields", call, lines)
		}
	}
}

// TestLoggerPrefixLimitQuiet checks that gobgp's repeated "prefix limit
// reached" warning stays below the default verbosity.
func TestLoggerPrefixLimitQuiet(t *testing.T) {
	var lines []string
	sink := funcr.New(func(_, args string) { lines = append(lines, args) }, funcr.Options{Verbosity: 0})
	l := newGobgpLogger(sink, func(int) { t.Error("exit called") })
	for range 100 {
		l.Warn("prefix limit reached", gobgplog.Fields{"Topic": "Peer", "Key": "192.0.2.1", "Family": "ipv4-unicast"})
	}
	l.Warn("sent notification", gobgplog.Fields{"Topic": "Peer", "Key": "192.0.2.1"})
	if len(lines) != 1 || !strings.Contains(lines[0], "sent notification") {
		t.Errorf("at verbosity 0 got %q, want only the other warning", lines)
	}
}
