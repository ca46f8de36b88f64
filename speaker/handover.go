package speaker

import (
	"slices"
	"time"

	"github.com/vipcast/vipcast/bgp"
)

// handovers keeps, by Service key, until when this node keeps announcing
// the routes of a Local handover (HandoverRoutes): a node whose endpoints
// all terminate while another node's are ready withdraws only after delay,
// once the routers have had the time to learn the other node's route; a
// withdrawal at once races that announcement, and the routers may hold no
// route for the VIP in between. Owned by the Controller's worker goroutine.
type handovers struct {
	delay time.Duration
	until map[string]time.Time
}

// keep returns which routes of linger, the Service key's HandoverRoutes,
// the node keeps announcing at now: those it announces (held, its routes
// for key), for delay from the first call that finds one; and after how
// long key must be looked at again (0: not for the handover). A route the
// node did not announce is not started; once withdrawn, a route is not
// held any more, and the handover is over until a new one.
func (h *handovers) keep(key string, linger, held []bgp.Route, now time.Time) (keep []bgp.Route, again time.Duration) {
	for _, r := range linger {
		if announced(held, r) {
			keep = append(keep, r)
		}
	}
	if len(keep) == 0 || h.delay <= 0 {
		h.end(key)
		return nil, 0
	}
	until, started := h.until[key]
	if !started {
		until = now.Add(h.delay)
		if h.until == nil {
			h.until = map[string]time.Time{}
		}
		h.until[key] = until
	}
	if !now.Before(until) {
		return nil, 0
	}
	return keep, until.Sub(now)
}

// announced reports whether held has r's prefix.
func announced(held []bgp.Route, r bgp.Route) bool {
	return slices.ContainsFunc(held, func(h bgp.Route) bool { return h.Prefix == r.Prefix })
}

// end ends key's handover, if any.
func (h *handovers) end(key string) { delete(h.until, key) }

// forget drops the handovers of the Services not in keys.
func (h *handovers) forget(keys map[string]bool) {
	for k := range h.until {
		if !keys[k] {
			delete(h.until, k)
		}
	}
}
