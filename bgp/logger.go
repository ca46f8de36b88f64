package bgp

import (
	"context"
	"log/slog"
	"sync"

	"k8s.io/klog/v2"
)

// gobgpLogger adapts gobgp's slog logging to klog structured logging
// (gobgp Debug → V(4), Info → V(2), Warn → V(0), Error → an error) and
// remembers, per neighbor address, the last message explaining why a
// session could not come up: gobgp's peer events say why a session went
// down, but only its logs say why a connection attempt failed.
//
// gobgp v4 has no fatal or panic level: the paths v3 logged at those
// levels (and after which vipcast exited) log errors and go on, some of
// them reachable from a peer's UPDATE. Nothing here ends the process.
type gobgpLogger struct {
	log klog.Logger

	mu      sync.Mutex
	reasons map[string]string // neighbor address → last failure reason
}

func newGobgpLogger(l klog.Logger) *gobgpLogger {
	return &gobgpLogger{log: l.WithName("gobgp"), reasons: map[string]string{}}
}

// slog returns the *slog.Logger to give gobgp.
func (l *gobgpLogger) slog() *slog.Logger { return slog.New(&gobgpHandler{l: l}) }

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

// setReason records reason for addr and reports whether it changed.
func (l *gobgpLogger) setReason(addr, reason string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	changed := l.reasons[addr] != reason
	l.reasons[addr] = reason
	return changed
}

// notFailures are the reasons gobgp gives for state changes that are
// progress, or its own retry, rather than a failure.
var notFailures = map[string]bool{
	"": true, "<nil>": true, "idle-hold-timer-expired": true, "new-connection": true,
	"open-msg-received": true, "open-msg-negotiated": true,
}

// observe records a failure reason from the gobgp log messages that carry
// one; attrs holds the record's attributes as strings, gobgp's per-peer
// "Key" (the neighbor address) among them.
func (l *gobgpLogger) observe(msg string, attrs map[string]string) {
	key := attrs["Key"]
	if key == "" {
		return
	}
	var reason string
	switch msg {
	case "Peer Down":
		reason = attrs["Reason"]
	case "failed to connect":
		reason = attrs["Error"]
	case "state changed":
		// Only transitions away from progress carry a failure reason.
		switch attrs["new"] {
		case "BGP_FSM_IDLE", "BGP_FSM_ACTIVE", "BGP_FSM_CONNECT":
		default:
			return
		}
		reason = attrs["reason"]
	default:
		return
	}
	if notFailures[reason] {
		return
	}
	// A session that never comes up stays Active without a state change:
	// gobgp retries quietly (its "failed to connect" is a debug message).
	// Say it once per distinct error, at the default verbosity.
	if l.setReason(key, reason) && msg == "failed to connect" {
		l.log.Info("Cannot connect to BGP peer; retrying", "peer", key, "error", reason)
	}
}

// gobgpHandler is the slog.Handler of a gobgpLogger, with the attributes
// and group gobgp's logger.With and WithGroup added.
type gobgpHandler struct {
	l      *gobgpLogger
	attrs  []slog.Attr // qualified by their groups already
	prefix string      // the open groups, "a.b."
}

var _ slog.Handler = (*gobgpHandler)(nil)

// Enabled reports every level enabled: gobgp's debug messages explain
// connection failures (see observe), and klog's verbosity filters what is
// written.
func (h *gobgpHandler) Enabled(context.Context, slog.Level) bool { return true }

// WithAttrs returns a handler that adds attrs to every record.
func (h *gobgpHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	n := *h
	n.attrs = append(append([]slog.Attr(nil), h.attrs...), qualify(h.prefix, attrs)...)
	return &n
}

// WithGroup returns a handler whose later attributes are in group name.
func (h *gobgpHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	n := *h
	n.prefix = h.prefix + name + "."
	return &n
}

// qualify prefixes the keys of attrs with prefix, flattening groups.
func qualify(prefix string, attrs []slog.Attr) []slog.Attr {
	out := make([]slog.Attr, 0, len(attrs))
	for _, a := range attrs {
		v := a.Value.Resolve()
		if v.Kind() == slog.KindGroup {
			p := prefix
			if a.Key != "" {
				p += a.Key + "."
			}
			out = append(out, qualify(p, v.Group())...)
			continue
		}
		out = append(out, slog.Attr{Key: prefix + a.Key, Value: v})
	}
	return out
}

// Handle writes r to klog at the verbosity of its level, after observing
// it for failure reasons. gobgp repeats "prefix limit reached" for every
// UPDATE already queued when the limit trips (hundreds per shutdown): the
// speaker logs the shutdown once, clearly (prefixLimitShutdown), and
// gobgp's lines go to verbosity 2.
func (h *gobgpHandler) Handle(_ context.Context, r slog.Record) error {
	attrs := append([]slog.Attr(nil), h.attrs...)
	r.Attrs(func(a slog.Attr) bool {
		attrs = append(attrs, qualify(h.prefix, []slog.Attr{a})...)
		return true
	})
	strs := make(map[string]string, len(attrs))
	kv := make([]any, 0, 2*len(attrs))
	for _, a := range attrs {
		strs[a.Key] = a.Value.String()
		kv = append(kv, a.Key, a.Value.Any())
	}
	h.l.observe(r.Message, strs)
	log := h.l.log
	switch {
	case r.Level >= slog.LevelError:
		log.Error(nil, r.Message, kv...)
	case r.Level >= slog.LevelWarn && r.Message != "prefix limit reached":
		log.Info(r.Message, kv...)
	case r.Level >= slog.LevelWarn, r.Level >= slog.LevelInfo:
		if v := log.V(2); v.Enabled() {
			v.Info(r.Message, kv...)
		}
	default:
		if v := log.V(4); v.Enabled() {
			v.Info(r.Message, kv...)
		}
	}
	return nil
}
