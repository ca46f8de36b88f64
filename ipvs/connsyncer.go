package ipvs

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
)

// connSyncer is the connection sync a Dataplane runs (Options.ConnSync,
// connsync.go): its daemons and, with ConnSync.Relay, the relay
// (syncrelay.go) and the tier-1 virtual servers it lets connections name.
// A Dataplane that was asked for none (nil, or ConnSync.Off) has a nil
// connSyncer, which has no problem, peers, keys or statistics.
type connSyncer struct {
	// on is Options.ConnSync with its link resolved while the daemons
	// run; nil when they did not start, and err says why.
	on  *ConnSync
	err error
	// relay carries the daemons' messages with ConnSync.Relay (nil
	// without); targets are what it lets connections name, kept with the
	// Dataplane's in-memory state.
	relay   *relay
	targets syncTargets
}

// ConnSyncProblem is why the sync daemons Options.ConnSync asked for are
// not running (nil: they run, or none were asked for).
func (d *Dataplane) ConnSyncProblem() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.connSync == nil {
		return nil
	}
	return d.connSync.err
}

// setupConnSync starts or stops the IPVS sync daemons as c asks (nil:
// leaves them alone). Daemons that cannot start fail nothing: the
// Dataplane runs without them (ConnSyncProblem), since serving without
// connection sync beats serving nothing (only flows that ECMP moves after
// tier 1 changed are lost); a daemon that did start (the master, before
// the backup failed) is stopped.
func (d *Dataplane) setupConnSync(c *ConnSync) error {
	switch {
	case c == nil:
		return nil
	case c.Off:
		// The relay's veth pair of an earlier run with it goes too.
		return errors.Join(stopConnSyncID(c.ID), deleteLink(d.nl, SyncLink, "veth"))
	case c.Relay == nil:
		// Likewise when the daemons go back to a shared link.
		if err := deleteLink(d.nl, SyncLink, "veth"); err != nil {
			return fmt.Errorf("two-tier dataplane: %w", err)
		}
	}
	d.connSync = &connSyncer{}
	if err := d.runConnSync(d.connSync, *c); err != nil {
		d.connSync.err = errors.Join(err, stopConnSyncID(c.ID))
		d.tiers.connSyncFailed()
	}
	return nil
}

// runConnSync starts c's daemons, and its relay, as s.
func (d *Dataplane) runConnSync(s *connSyncer, c ConnSync) error {
	// The kernel starts no sync daemon while a real server of another
	// family than its virtual server exists: those of a run with
	// connection sync off go first (this run keeps IPv6 VIPs on one tier).
	if err := d.dropMixedDests(); err != nil {
		return fmt.Errorf("two-tier dataplane: %w", err)
	}
	if c.Relay == nil {
		on, err := ensureConnSync(d.nl, c)
		if err != nil {
			return fmt.Errorf("two-tier dataplane: %w", err)
		}
		s.on = &on
		return nil
	}
	peer, err := prepareSyncRelay(d.nl)
	if err != nil {
		return fmt.Errorf("two-tier dataplane: connection sync relay: %w", err)
	}
	c.Interface = SyncLink
	if err := startConnSync(c); err != nil {
		return fmt.Errorf("two-tier dataplane: %w", err)
	}
	if s.relay, err = startRelay(peer, c.ID, *c.Relay, &s.targets); err != nil {
		return fmt.Errorf("two-tier dataplane: %w", err)
	}
	s.on = &c
	return nil
}

// setTargets makes the relay's targets the tier-1 virtual servers of st.
func (s *connSyncer) setTargets(st State) {
	if s != nil && s.relay != nil {
		s.targets.reset(st)
	}
}

// updateTargets sets the relay's targets of keys from st.
func (s *connSyncer) updateTargets(st State, keys []Key) {
	if s != nil && s.relay != nil {
		s.targets.update(st, keys)
	}
}

// stop stops the relay.
func (s *connSyncer) stop() {
	if s != nil && s.relay != nil {
		s.relay.stop()
	}
}

// teardown stops the daemons that run with the sync ID and deletes the
// relay's veth pair (SyncPeer goes with SyncLink), for Teardown.
func (s *connSyncer) teardown(nh *netlink.Handle) error {
	if s == nil || s.on == nil {
		return nil
	}
	errs := []error{stopConnSyncID(s.on.ID)}
	if s.on.Relay != nil {
		errs = append(errs, deleteLink(nh, SyncLink, "veth"))
	}
	return errors.Join(errs...)
}

// SetSyncPeers replaces the other nodes' addresses the connection sync
// relay (ConnSync.Relay) sends to and accepts from; without a relay it
// does nothing.
func (d *Dataplane) SetSyncPeers(peers []netip.Addr) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.connSync != nil && d.connSync.relay != nil {
		d.connSync.relay.setPeers(peers)
	}
}

// SetSyncKeys replaces the keys the connection sync relay
// (ConnSync.Relay) signs its datagrams with and checks the other nodes'
// with (syncauth.go); the zero SyncKeys turns authentication off. Without
// a relay it does nothing.
func (d *Dataplane) SetSyncKeys(k SyncKeys) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.connSync != nil && d.connSync.relay != nil {
		d.connSync.relay.keys.Store(&k)
	}
}

// RelayStats counts what the connection sync relay did; ok is false
// without one.
func (d *Dataplane) RelayStats() (s RelayStats, ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.connSync == nil || d.connSync.relay == nil {
		return RelayStats{}, false
	}
	return d.connSync.relay.stats(), true
}

// ConnSync returns the connection synchronisation this Dataplane started
// (its link resolved), or nil.
func (d *Dataplane) ConnSync() *ConnSync {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.connSync == nil || d.connSync.on == nil {
		return nil
	}
	c := *d.connSync.on
	return &c
}
