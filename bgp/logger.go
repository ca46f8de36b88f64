package bgp

import (
	"fmt"
	"sync"

	gobgplog "github.com/osrg/gobgp/v3/pkg/log"
	"k8s.io/klog/v2"
)

// gobgpLogger adapts gobgp's logger to klog structured logging (gobgp
// Debug → V(4), Info → V(2)) and remembers, per neighbor address, the last
// message explaining why a session failed: gobgp's API exposes no such
// reason, only its logs do.
type gobgpLogger struct {
	log  klog.Logger
	exit func(code int) // called after Panic and Fatal

	mu      sync.Mutex
	reasons map[string]string // neighbor address → last failure reason
}

var _ gobgplog.Logger = (*gobgpLogger)(nil)

func newGobgpLogger(l klog.Logger, exit func(code int)) *gobgpLogger {
	return &gobgpLogger{log: l.WithName("gobgp"), exit: exit, reasons: map[string]string{}}
}

// reason returns the last failure reason recorded for a neighbor address.
func (l *gobgpLogger) reason(addr string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.reasons[addr]
}

// clearReason forgets the failure reason of a neighbor address.
func (l *gobgpLogger) clearReason(addr string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.reasons, addr)
}

// observe records a failure reason from the gobgp log messages that carry one.
func (l *gobgpLogger) observe(msg string, fields gobgplog.Fields) {
	key, _ := fields["Key"].(string)
	if key == "" {
		return
	}
	var reason string
	switch msg {
	case "Peer Down":
		reason = fmt.Sprint(fields["Reason"])
	case "failed to connect":
		reason = fmt.Sprint(fields["Error"])
	case "state changed":
		// Only transitions away from progress carry a failure reason.
		switch fields["new"] {
		case "BGP_FSM_IDLE", "BGP_FSM_ACTIVE", "BGP_FSM_CONNECT":
		default:
			return
		}
		r := fields["reason"]
		if r == nil {
			return
		}
		reason = fmt.Sprint(r)
		switch reason {
		case "<nil>", "", "idle-hold-timer-expired", "new-connection", "open-msg-received", "open-msg-negotiated":
			// Not a failure.
			return
		}
	default:
		return
	}
	l.mu.Lock()
	changed := l.reasons[key] != reason
	l.reasons[key] = reason
	l.mu.Unlock()
	// A session that never comes up stays Active without a state change:
	// gobgp retries quietly (its "failed to connect" is a debug message).
	// Say it once per distinct error, at the default verbosity.
	if msg == "failed to connect" && changed {
		l.log.Info("Cannot connect to BGP peer; retrying", "peer", key, "error", reason)
	}
}

func (l *gobgpLogger) kv(fields gobgplog.Fields) []any {
	kv := make([]any, 0, 2*len(fields))
	for k, v := range fields {
		kv = append(kv, k, v)
	}
	return kv
}

// Panic logs msg as an error and ends the process: gobgp calls it on its
// "code logic bug" paths, after which its state is not to be trusted.
func (l *gobgpLogger) Panic(msg string, fields gobgplog.Fields) {
	l.die(msg, fields)
}

// Fatal logs msg as an error and ends the process, as gobgp expects.
func (l *gobgpLogger) Fatal(msg string, fields gobgplog.Fields) {
	l.die(msg, fields)
}

// die logs gobgp's message and exits with status 1, so that the DaemonSet
// restarts the speaker in a known state.
func (l *gobgpLogger) die(msg string, fields gobgplog.Fields) {
	l.log.Error(nil, "gobgp failed; exiting so that the speaker restarts in a known state", append([]any{"gobgpMessage", msg}, l.kv(fields)...)...)
	l.exit(1)
}

// Error logs msg as an error.
func (l *gobgpLogger) Error(msg string, fields gobgplog.Fields) {
	l.observe(msg, fields)
	l.log.Error(nil, msg, l.kv(fields)...)
}

// Warn logs msg at verbosity 0 (klog has no warning level), except
// gobgp's "prefix limit reached", which it repeats for every UPDATE
// already queued when the limit trips (hundreds per shutdown): the
// speaker logs the shutdown once, clearly (prefixLimitShutdown), and
// gobgp's lines go to verbosity 2.
func (l *gobgpLogger) Warn(msg string, fields gobgplog.Fields) {
	l.observe(msg, fields)
	if msg == "prefix limit reached" {
		if v := l.log.V(2); v.Enabled() {
			v.Info(msg, l.kv(fields)...)
		}
		return
	}
	l.log.Info(msg, l.kv(fields)...)
}

// Info logs msg at verbosity 2.
func (l *gobgpLogger) Info(msg string, fields gobgplog.Fields) {
	l.observe(msg, fields)
	if v := l.log.V(2); v.Enabled() {
		v.Info(msg, l.kv(fields)...)
	}
}

// Debug logs msg at verbosity 4.
func (l *gobgpLogger) Debug(msg string, fields gobgplog.Fields) {
	l.observe(msg, fields)
	if v := l.log.V(4); v.Enabled() {
		v.Info(msg, l.kv(fields)...)
	}
}

// SetLevel is ignored: klog's verbosity decides what is written.
func (l *gobgpLogger) SetLevel(gobgplog.LogLevel) {}

// GetLevel returns DebugLevel so that gobgp emits the debug messages that
// explain connection failures; klog's verbosity filters what is written.
func (l *gobgpLogger) GetLevel() gobgplog.LogLevel { return gobgplog.DebugLevel }
