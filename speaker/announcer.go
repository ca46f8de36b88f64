package speaker

import (
	"context"
	"fmt"
	"iter"
	"net/netip"
	"sync"

	"k8s.io/klog/v2"

	"github.com/vipcast/vipcast/bgp"
)

// announcer keeps the routes this node wants (a RouteTable) and what the
// BGP engine has been told, the way programmer does for the dataplane: a
// change of one Service costs BGP work for that Service only, and a failed
// Apply is repaired by handing BGP the whole table at the next config sync.
//
// The route table is used by the controller's single worker goroutine;
// what BGP holds is also read by WithdrawAll at shutdown, so it is locked.
type announcer struct {
	bgp     bgp.Speaker
	metrics *Metrics
	table   *RouteTable
	// failed is called after a failed Apply: the controller queues a
	// config sync, which re-applies the whole table.
	failed func()

	mu        sync.Mutex
	announced map[netip.Prefix]bool // what bgp has been told, for the final withdraw
	uncertain map[netip.Prefix]bool // prefixes of a failed Apply: BGP may or may not hold them
}

func newAnnouncer(engine bgp.Speaker, m *Metrics, failed func()) *announcer {
	return &announcer{
		bgp:       engine,
		metrics:   m,
		table:     NewRouteTable(),
		failed:    failed,
		announced: map[netip.Prefix]bool{},
		uncertain: map[netip.Prefix]bool{},
	}
}

// setService makes routes one Service's routes and hands the difference to
// BGP.
func (a *announcer) setService(ctx context.Context, key string, routes []bgp.Route) error {
	ann, wd := a.table.Set(key, routes)
	return a.apply(ctx, ann, wd)
}

// deleteService drops a gone Service's routes and hands the difference to
// BGP.
func (a *announcer) deleteService(ctx context.Context, key string) error {
	ann, wd := a.table.Delete(key)
	return a.apply(ctx, ann, wd)
}

// syncAll replaces the routes of every Service — routes yields each
// existing Service's key and routes; the table's other Services are gone —
// and hands BGP the change in one Apply. After a failed Apply it hands BGP the whole table instead
// (re-announcing an unchanged route sends nothing) and withdraws whatever
// BGP may hold beyond it. It returns the counts announced and withdrawn.
func (a *announcer) syncAll(ctx context.Context, routes iter.Seq2[string, []bgp.Route]) (announced, withdrawn int, err error) {
	var announce []bgp.Route
	var withdraw []netip.Prefix
	seen := map[string]bool{}
	for key, rs := range routes {
		seen[key] = true
		ann, wd := a.table.Set(key, rs)
		announce, withdraw = append(announce, ann...), append(withdraw, wd...)
	}
	// Services gone from the cache while their delete event was queued.
	for _, key := range a.table.Keys() {
		if !seen[key] {
			ann, wd := a.table.Delete(key)
			announce, withdraw = append(announce, ann...), append(withdraw, wd...)
		}
	}
	if a.hasUncertain() {
		announce, withdraw = a.table.Routes(), a.beyondTable()
	}
	if err := a.apply(ctx, announce, withdraw); err != nil {
		return 0, 0, err
	}
	a.mu.Lock()
	clear(a.uncertain)
	a.mu.Unlock()
	return len(announce), len(withdraw), nil
}

// apply hands a change to BGP and remembers what is announced.
func (a *announcer) apply(ctx context.Context, announce []bgp.Route, withdraw []netip.Prefix) error {
	if len(announce) == 0 && len(withdraw) == 0 {
		return nil
	}
	if err := a.bgp.Apply(ctx, announce, withdraw); err != nil {
		// The route table already holds the change and BGP may hold part
		// of it: the next config sync re-applies the whole table.
		a.mu.Lock()
		for _, p := range withdraw {
			a.uncertain[p] = true
		}
		for _, r := range announce {
			a.uncertain[r.Prefix] = true
		}
		a.mu.Unlock()
		a.failed()
		return fmt.Errorf("announcing %d and withdrawing %d prefixes: %w", len(announce), len(withdraw), err)
	}
	a.mu.Lock()
	for _, p := range withdraw {
		delete(a.announced, p)
	}
	for _, r := range announce {
		a.announced[r.Prefix] = true
	}
	n := len(a.announced)
	a.mu.Unlock()
	a.metrics.setAnnounced(n)
	klog.FromContext(ctx).V(3).Info("Routes changed", "announced", len(announce), "withdrawn", len(withdraw), "total", n)
	return nil
}

func (a *announcer) hasUncertain() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.uncertain) > 0
}

// beyondTable returns the prefixes BGP has or may have that the route
// table does not want.
func (a *announcer) beyondTable() []netip.Prefix {
	want := map[netip.Prefix]bool{}
	for _, r := range a.table.Routes() {
		want[r.Prefix] = true
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []netip.Prefix
	for _, set := range []map[netip.Prefix]bool{a.announced, a.uncertain} {
		for p := range set {
			if !want[p] {
				want[p] = true // once
				out = append(out, p)
			}
		}
	}
	return out
}

// withdrawAll withdraws every announced prefix, keeping the sessions up.
func (a *announcer) withdrawAll(ctx context.Context) error {
	a.mu.Lock()
	prefixes := make([]netip.Prefix, 0, len(a.announced))
	for p := range a.announced {
		prefixes = append(prefixes, p)
	}
	a.mu.Unlock()
	if len(prefixes) == 0 {
		return nil
	}
	if err := a.bgp.Apply(ctx, nil, prefixes); err != nil {
		return fmt.Errorf("withdrawing %d prefixes: %w", len(prefixes), err)
	}
	a.mu.Lock()
	a.announced = map[netip.Prefix]bool{}
	a.mu.Unlock()
	a.metrics.setAnnounced(0)
	return nil
}
