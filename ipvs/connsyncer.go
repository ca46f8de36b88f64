package ipvs

import (
	"errors"
	"fmt"
	"net/netip"
)

// ConnSyncProblem is why the sync daemons Options.ConnSync asked for are
// not running (nil: they run, or none were asked for).
func (d *Dataplane) ConnSyncProblem() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.connSyncErr
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
	if err := d.runConnSync(*c); err != nil {
		d.connSyncErr = errors.Join(err, stopConnSyncID(c.ID))
		d.tiers.connSyncFailed()
	}
	return nil
}

// runConnSync starts c's daemons.
func (d *Dataplane) runConnSync(c ConnSync) error {
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
		d.connSync = &on
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
	if d.relay, err = startRelay(peer, c.ID, *c.Relay, &d.targets); err != nil {
		return fmt.Errorf("two-tier dataplane: %w", err)
	}
	d.connSync = &c
	return nil
}

// SetSyncPeers replaces the other nodes' addresses the connection sync
// relay (ConnSync.Relay) sends to and accepts from; without a relay it
// does nothing.
func (d *Dataplane) SetSyncPeers(peers []netip.Addr) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.relay != nil {
		d.relay.setPeers(peers)
	}
}

// SetSyncKeys replaces the keys the connection sync relay
// (ConnSync.Relay) signs its datagrams with and checks the other nodes'
// with (syncauth.go); the zero SyncKeys turns authentication off. Without
// a relay it does nothing.
func (d *Dataplane) SetSyncKeys(k SyncKeys) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.relay != nil {
		d.relay.keys.Store(&k)
	}
}

// RelayStats counts what the connection sync relay did; ok is false
// without one.
func (d *Dataplane) RelayStats() (s RelayStats, ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.relay == nil {
		return RelayStats{}, false
	}
	return d.relay.stats(), true
}

// ConnSync returns the connection synchronisation this Dataplane started
// (its link resolved), or nil.
func (d *Dataplane) ConnSync() *ConnSync {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.connSync == nil {
		return nil
	}
	c := *d.connSync
	return &c
}
