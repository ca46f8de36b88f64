package ipvs

import (
	"errors"
	"net/netip"
	"slices"

	"golang.org/x/sys/unix"
)

// applyPlan is apply, returning the failures by what they concern.
func (d *Dataplane) applyPlan(p Plan) *failures {
	f := newFailures()
	// An endpoint that can take its own connections through the VIP is
	// in the hairpin set before its first flow (hairpin.go), and leaves
	// it after its last.
	next := d.hairpinNext(p)
	if grow := d.hairpin.missing(next); len(grow) > 0 {
		d.syncHairpin(append(d.hairpin.all(), grow...), f)
	}
	unguarded := d.filterVIPs(p.Filter.AddVIPs, f)
	d.bindVIPs(p.AddVIPs, unguarded, f)
	d.startSNAT(p.AddSNAT, f)
	d.applyServices(p, f)
	d.restrict(p.Filter, f)
	d.allow(p.Filter.AddAllow, f)
	d.tier2.apply(d.nft, p.Tier2, f)
	d.cluster.apply(d.nft, p.InCluster, f)
	d.ct.clear(p.StaleFlows, f)
	d.applyBackends(p, f)
	d.disallow(p.Filter.DelAllow, f)
	d.unrestrict(p.Filter, f)
	d.deleteServices(p.DelServices, f)
	d.stopSNAT(p.DelSNAT, f)
	d.unbindVIPs(p.DelVIPs, f)
	d.unfilterVIPs(p.Filter.DelVIPs, f)
	if len(f.all) > 0 {
		d.stale = true
		return f
	}
	p.ApplyTo(&d.cache)
	p.Filter.ApplyTo(&d.filter)
	p.Tier2.ApplyTo(d.tier2.have)
	p.InCluster.ApplyTo(d.cluster.have)
	d.connSync.updateTargets(d.cache, p.serviceKeys())
	changed := false
	for k, addrs := range next {
		if d.hairpin.set(k, addrs) {
			changed = true
		}
	}
	if changed {
		d.syncHairpin(d.hairpin.all(), f)
	}
	return f
}

// bindVIPs adds the VIPs to the dummy link; one already there is fine. A
// VIP in unguarded is not bound: the filter failed to take it, and bound it
// would answer on every port of the node.
func (d *Dataplane) bindVIPs(vips []netip.Addr, unguarded map[netip.Addr]bool, f *failures) {
	for _, a := range vips {
		if unguarded[a] {
			f.addVIP(a, "bind VIP "+a.String(), errors.New("not bound: the VIP filter does not have it"))
			continue
		}
		if err := d.nl.AddrAdd(d.link, vipAddr(a)); err != nil && !errors.Is(err, unix.EEXIST) {
			f.addVIP(a, "bind VIP "+a.String(), err)
		}
	}
}

// startSNAT masquerades the connections of the virtual servers keys.
func (d *Dataplane) startSNAT(keys []Key, f *failures) {
	if len(keys) == 0 {
		return
	}
	if !d.snat {
		f.add("source NAT", errors.New("disabled (NoSNAT)"))
	} else if err := d.nft.update(d.nft.snat, keyElems(keys), nil); err != nil {
		f.add("start source NAT", err)
	}
}

// applyServices adds p's new virtual servers (updating one that exists)
// and updates its changed ones.
func (d *Dataplane) applyServices(p Plan, f *failures) {
	for _, s := range p.AddServices {
		ks := kernelService(s)
		err := d.ipvs.NewService(ks)
		if errors.Is(err, unix.EEXIST) {
			err = d.ipvs.UpdateService(ks)
		}
		if err != nil {
			f.addKey(s.Key(), "add virtual server "+s.Key().String(), schedulerError(s, err))
			f.absent[s.Key()] = true
		}
	}
	for _, s := range p.UpdateServices {
		if err := d.ipvs.UpdateService(kernelService(s)); err != nil {
			f.addKey(s.Key(), "update virtual server "+s.Key().String(), schedulerError(s, err))
		}
	}
}

// applyBackends changes p's real servers in the order of backendOps:
// adding one that is present updates it, deleting one that is absent is
// fine.
func (d *Dataplane) applyBackends(p Plan, f *failures) {
	for _, op := range p.backendOps() {
		c := op.BackendChange
		var err error
		what := "add real server "
		switch {
		case op.cmd == ipvsCmdNewDest && f.absent[c.Key]:
			continue // its virtual server was refused: that is the failure
		case op.cmd == ipvsCmdNewDest && c.Again:
			err, what = d.againDest(c.Key, c.Backend), "add real server again "
		case op.cmd == ipvsCmdNewDest:
			err = d.destCmd(ipvsCmdNewDest, c.Key, c.Backend)
			if errors.Is(err, unix.EEXIST) {
				err = d.destCmd(ipvsCmdSetDest, c.Key, c.Backend)
			}
		case op.cmd == ipvsCmdSetDest:
			err, what = d.destCmd(ipvsCmdSetDest, c.Key, c.Backend), "update real server "
		default:
			what = "delete real server "
			if err = d.destCmd(ipvsCmdDelDest, c.Key, c.Backend); isNotFound(err) {
				err = nil
			}
		}
		if err != nil {
			f.addKey(c.Key, what+c.String(), err)
		}
	}
}

// destCmd adds (ipvsCmdNewDest), updates (SetDest) or deletes (DelDest)
// the real server b of virtual server k: through moby/ipvs, or mixedDest
// when b is of another family.
func (d *Dataplane) destCmd(cmd uint8, k Key, b Backend) error {
	if mixedFamily(k, b) {
		return d.mixedDest(cmd, k, b)
	}
	ks, kd := keyService(k), kernelDest(b)
	switch cmd {
	case ipvsCmdNewDest:
		return d.ipvs.NewDestination(ks, kd)
	case ipvsCmdSetDest:
		return d.ipvs.UpdateDestination(ks, kd)
	default:
		return d.ipvs.DelDestination(ks, kd)
	}
}

// deleteServices deletes the virtual servers keys with their real servers;
// an absent one is skipped.
func (d *Dataplane) deleteServices(keys []Key, f *failures) {
	for _, k := range keys {
		if err := d.ipvs.DelService(keyService(k)); err != nil && !isNotFound(err) {
			f.addKey(k, "delete virtual server "+k.String(), err)
		}
	}
}

// stopSNAT stops masquerading the connections of the virtual servers keys
// (nothing to do with NoSNAT).
func (d *Dataplane) stopSNAT(keys []Key, f *failures) {
	if len(keys) == 0 || !d.snat {
		return
	}
	if err := d.nft.update(d.nft.snat, nil, keyElems(keys)); err != nil {
		f.add("stop source NAT", err)
	}
}

// unbindVIPs removes the VIPs from the dummy link; one already gone is
// fine.
func (d *Dataplane) unbindVIPs(vips []netip.Addr, f *failures) {
	for _, a := range vips {
		if err := d.nl.AddrDel(d.link, vipAddr(a)); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			f.addVIP(a, "unbind VIP "+a.String(), err)
		}
	}
}

// filterVIPs puts the VIPs in the VIP filter before they are bound. When
// that fails it returns them all: they are not bound.
func (d *Dataplane) filterVIPs(vips []netip.Addr, f *failures) (failed map[netip.Addr]bool) {
	if len(vips) == 0 || !d.guard {
		return nil
	}
	err := d.nft.update(d.nft.vips, vipElems(vips), nil)
	if err == nil {
		return nil
	}
	failed = make(map[netip.Addr]bool, len(vips))
	for _, a := range vips {
		f.addVIP(a, "filter VIP "+a.String(), err)
		failed[a] = true
	}
	return failed
}

// allow lets the virtual servers keys through the VIP filter, except those
// the kernel refused to add and those restrict could not restrict: their
// port stays closed.
func (d *Dataplane) allow(keys []Key, f *failures) {
	if len(keys) == 0 || !d.guard {
		return
	}
	ok := make([]Key, 0, len(keys))
	for _, k := range keys {
		if !f.absent[k] && !f.unrestricted[k] {
			ok = append(ok, k)
		}
	}
	if err := d.nft.update(d.nft.allow, keyElems(ok), nil); err != nil {
		for _, k := range ok {
			f.addKey(k, "let "+k.String()+" through the VIP filter", err)
		}
	}
}

// restrict puts in place, before any port is let through, the source
// ranges that p adds and the restrictions it adds, and takes out the ranges
// of the virtual servers that stay restricted, in one transaction with the
// additions (sources.go). A failure counts against each virtual server
// concerned; one that could not be restricted is not let through (its port
// stays closed rather than open to everyone) until a later apply succeeds.
func (d *Dataplane) restrict(p FilterPlan, f *failures) {
	if !d.guard || len(p.AddSources)+len(p.AddRestricted)+len(p.DelSources) == 0 {
		return
	}
	narrowed, _ := p.splitDelSources()
	if err := d.nft.update(d.nft.sources, sourceElems(p.AddSources), sourceElems(narrowed)); err != nil {
		for _, r := range append(slices.Clone(p.AddSources), narrowed...) {
			f.addKey(r.Key, "source range "+r.String(), err)
		}
	}
	if err := d.nft.update(d.nft.restricted, keyElems(p.AddRestricted), nil); err != nil {
		for _, k := range p.AddRestricted {
			f.addKey(k, "restrict "+k.String()+" to its source ranges", err)
			f.unrestricted[k] = true
		}
	}
}

// unrestrict lifts, after the ports going are closed, the restrictions p
// deletes, then deletes their ranges.
func (d *Dataplane) unrestrict(p FilterPlan, f *failures) {
	if !d.guard || len(p.DelRestricted) == 0 {
		return
	}
	_, rs := p.splitDelSources()
	if err := d.nft.update(d.nft.restricted, nil, keyElems(p.DelRestricted)); err != nil {
		f.add("lift source-range restrictions", err)
		return
	}
	if err := d.nft.update(d.nft.sources, nil, sourceElems(rs)); err != nil {
		f.add("delete source ranges", err)
	}
}

// disallow stops letting the virtual servers keys through the VIP filter.
func (d *Dataplane) disallow(keys []Key, f *failures) {
	if len(keys) == 0 || !d.guard {
		return
	}
	if err := d.nft.update(d.nft.allow, nil, keyElems(keys)); err != nil {
		f.add("close ports of the VIP filter", err)
	}
}

// unfilterVIPs takes the VIPs, unbound by now, out of the VIP filter.
func (d *Dataplane) unfilterVIPs(vips []netip.Addr, f *failures) {
	if len(vips) == 0 || !d.guard {
		return
	}
	if err := d.nft.update(d.nft.vips, nil, vipElems(vips)); err != nil {
		f.add("take VIPs out of the VIP filter", err)
	}
}
