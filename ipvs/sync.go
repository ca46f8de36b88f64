package ipvs

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
)

// Sync makes the kernel match desired with a full read: Read, Diff, Apply.
// It returns the plan it applied (empty when nothing differed), also when
// Apply failed part way. It refreshes the in-memory state SyncService
// works from, so a periodic Sync repairs drift (a virtual server deleted by
// hand, a real server changed by someone else); the plan's Lost names the
// virtual servers it had programmed and found gone.
//
// One virtual server the kernel refuses (a scheduler it does not have, an
// IPv6 VIP with IPv6 off) does not stop the others: Sync applies the whole
// plan, going on past failures, and returns a *SyncErrors naming the
// virtual servers refused and why. A failure to read the kernel, or a
// desired state that does not validate, is a plain error and nothing is
// applied.
func (d *Dataplane) Sync(desired State) (Plan, error) {
	if err := d.validate(desired); err != nil {
		return Plan{}, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	want := desired.allVIPs()
	kern, err := d.read(func(k Key, linkVIPs map[netip.Addr]struct{}) bool {
		if _, ok := want[k.VIP]; ok {
			return true
		}
		_, ok := linkVIPs[k.VIP]
		return ok
	})
	if err != nil {
		d.stale = true
		return Plan{}, err
	}
	actual := kern.st
	p := Diff(desired, actual)
	if !d.stale {
		p.Lost = lost(d.cache, actual, func(k Key) bool {
			_, want := desired.Services[k]
			return want // the read skipped other VIPs: nothing is known of them
		})
	}
	for _, k := range kern.orphans {
		if s, ok := desired.Services[k]; ok && s.SNAT {
			// The element outlived its virtual server (deleted by hand),
			// which comes back wanting it: keep it, or the recreated
			// virtual server would forward unmasqueraded connections
			// until the next Sync.
			p.AddSNAT = slices.DeleteFunc(p.AddSNAT, func(x Key) bool { return x == k })
			continue
		}
		p.DelSNAT = append(p.DelSNAT, k)
	}
	if d.guard {
		// The filter's sets are vipcast's alone: repaired whole, like the
		// source NAT set.
		p.Filter = DiffFilter(FilterOf(desired), kern.filter)
	}
	p.Tier2 = d.tier2.diff(desired, kern.tier2)
	p.InCluster = d.cluster.diff(desired, kern.cluster)
	p.StaleFlows = d.ct.staleOfSync(p, desired)
	wasStale := d.stale
	d.cache, d.filter, d.tier2.have, d.cluster.have, d.stale = actual, kern.filter, kern.tier2, kern.cluster, false
	d.connSync.setTargets(d.cache)
	// The hairpin sets are vipcast's alone: read and repaired whole, before
	// the plan gives any endpoint its first flow.
	d.hairpin = hairpinsOf(desired)
	if d.nft != nil {
		d.nft.hairpinHave = [2]map[netip.Addr]struct{}{}
	}
	hf := newFailures()
	d.syncHairpin(d.hairpin.all(), hf)
	f := d.applySynced(p, desired, wasStale)
	f.all = append(f.all, hf.all...)
	return p, f.syncErrors(desired)
}

// applySynced applies p, the plan of a Sync to desired, and has the tiers
// repair the node's side of them (two tiers: the tunnels). After a stale
// Sync (wasStale), one walk of the conntrack table clears the flows p
// names and those no plan named (clearUnserved), in place of clear's own
// walk.
func (d *Dataplane) applySynced(p Plan, desired State, wasStale bool) *failures {
	stale := p.StaleFlows
	if wasStale {
		p.StaleFlows = nil // a copy: the Sync's plan keeps them
	}
	f := d.applyPlan(p)
	if wasStale && !d.ct.clearUnserved(desired, stale, f) {
		d.stale = true // the next Sync walks the table again
	}
	if err := d.tiers.repair(d.nl); err != nil {
		f.add("the two-tier dataplane's setup on the node", err)
	}
	return f
}

func (d *Dataplane) validate(desired State) error {
	if err := desired.Validate(); err != nil {
		return err
	}
	for _, k := range desired.keys() {
		if err := d.check(desired.Services[k]); err != nil {
			return err
		}
	}
	return nil
}

// check refuses what svc needs and the dataplane's options turn off.
func (d *Dataplane) check(svc Service) error {
	switch {
	case svc.SNAT && !d.snat:
		return fmt.Errorf("virtual server %s: source NAT wanted, but the dataplane runs with NoSNAT", svc.Key())
	case svc.Restricted && !d.guard:
		return fmt.Errorf("virtual server %s: source ranges wanted, but the dataplane runs with NoFilter, which enforces them", svc.Key())
	}
	return d.tiers.check(svc)
}

// SyncService makes one virtual server match desired (nil: delete it) using
// the in-memory state of the last Sync and the changes applied since: no
// kernel read, kernel work only for that service. When the kernel refuses a
// change (it drifted from the in-memory state), SyncService reads the
// kernel again and redoes the service once; the plan returned is the one of
// the last attempt, whose Lost then names every virtual server of the
// in-memory state that read found gone (only key's is restored: the
// caller runs Sync for the others).
func (d *Dataplane) SyncService(key Key, desired *Service) (Plan, error) {
	if desired != nil {
		if err := desired.Validate(); err != nil {
			return Plan{}, err
		}
		if err := d.check(*desired); err != nil {
			return Plan{}, err
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.refresh(); err != nil {
		return Plan{}, err
	}
	p := d.diffService(key, desired)
	err := d.apply(p)
	if err == nil {
		return p, nil
	}
	// The kernel was not what the in-memory state said (a virtual server
	// deleted by hand, say): read it again and redo this service once.
	before := d.cache
	if rerr := d.refresh(); rerr != nil {
		return p, errors.Join(err, rerr)
	}
	deleted := p.DelServices // the failed apply may have done these
	p = d.diffService(key, desired)
	// Every virtual server found gone, not only this one: the read
	// replaced the in-memory state, so neither Probe nor a later Sync
	// would know them as lost.
	p.Lost = lost(before, d.cache, func(k Key) bool { return !slices.Contains(deleted, k) })
	return p, d.apply(p)
}

// lost returns, sorted, the virtual servers of before (the in-memory
// state) that the kernel read after lacks, among those keep accepts.
func lost(before, after State, keep func(Key) bool) []Key {
	var out []Key
	for k := range before.Services {
		if _, ok := after.Services[k]; !ok && keep(k) {
			out = append(out, k)
		}
	}
	slices.SortFunc(out, Key.compare)
	return out
}

// diffService is DiffService against the in-memory state, with the filter
// changes that go with it.
func (d *Dataplane) diffService(key Key, desired *Service) Plan {
	p := DiffService(key, desired, d.cache)
	if d.guard {
		p.Filter = filterStep(key, desired, p, d.filter)
	}
	p.Tier2 = d.tier2.step(key, desired)
	p.InCluster = d.cluster.step(key, desired)
	p.StaleFlows = d.ct.staleOfService(p, key, desired)
	return p
}

// Probe asks the kernel for one virtual server of the in-memory state
// whose VIP is on the link (vipcast's own: any one, as a flush takes them
// all) and reports whether it is gone: another program flushed (or
// deleted) virtual servers. kube-proxy flushes every IPVS virtual
// server of the node when it starts in nftables mode (its clean-up of the
// other modes' leftovers), and so does `kube-proxy --cleanup`. A probe is
// one netlink request, so a caller can probe every few seconds and run
// Sync, a full kernel read, only when it finds drift. With nothing applied
// yet, or the in-memory state unknown, Probe reports no drift: the next
// Sync reads the kernel anyway.
func (d *Dataplane) Probe() (drifted bool, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed || d.stale {
		return false, nil
	}
	for k := range d.cache.Services {
		if _, own := d.cache.VIPs[k.VIP]; !own {
			continue
		}
		_, err := d.ipvs.GetService(keyService(k))
		switch {
		case err == nil:
			return false, nil
		case isNotFound(err):
			return true, nil
		default:
			return false, fmt.Errorf("probe virtual server %s: %w", k, err)
		}
	}
	return false, nil
}

// State returns a copy of the in-memory state (the kernel as Dataplane
// believes it is), reading the kernel first when that is unknown.
func (d *Dataplane) State() (State, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.refresh(); err != nil {
		return State{}, err
	}
	return d.cache.Clone(), nil
}

func (d *Dataplane) refresh() error {
	if !d.stale {
		return nil
	}
	k, err := d.read(nil)
	if err != nil {
		return err
	}
	d.cache, d.filter, d.tier2.have, d.cluster.have, d.stale = k.st, k.filter, k.tier2, k.cluster, false
	d.connSync.setTargets(d.cache)
	return nil
}

// Apply performs p on the kernel, in the order documented on Plan. It
// tolerates a kernel that is already there (an add of something present
// becomes an update, a delete of something absent is skipped), goes on past
// other errors and returns them all.
func (d *Dataplane) Apply(p Plan) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.refresh(); err != nil {
		return err
	}
	return d.apply(p)
}

// apply performs p on the kernel (see Apply) and, when every step
// succeeded, on the in-memory state; a failure marks that stale.
func (d *Dataplane) apply(p Plan) error {
	return d.applyPlan(p).err()
}
