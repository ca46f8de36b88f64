package speaker

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/vipcast/vipcast/ipvs"
)

// fakeDataplane is the speakers tests' Dataplane: it records every call
// and answers as configured. By itself it is an in-memory kernel that
// programs whatever it is given and reports no problem; with wrapped set it
// passes every call on to that dataplane (the VM's kernel) and records
// the plans it answers. The configuration may change while a controller
// runs, under mu.
type fakeDataplane struct {
	mu sync.Mutex

	// wrapped, when set, answers every call.
	wrapped *ipvs.Dataplane
	// failSyncs: Sync fails this many times first.
	failSyncs int
	// drifted is what Probe reports until the next Sync (a kernel read
	// that repairs the drift) clears it; that Sync's plan has every
	// desired virtual server Lost, as after a flush.
	drifted bool
	// lostOnService is the Lost of the next SyncService's plan, as when
	// that call's second kernel read found these gone.
	lostOnService []ipvs.Key
	// refuse is a scheduler the kernel lacks: it refuses the virtual
	// servers that ask for it, as a kernel without its module does.
	refuse string
	// twoTierIPv6 and no6 are TwoTierIPv6's answer, connSyncProblem
	// ConnSyncProblem's.
	twoTierIPv6     bool
	no6             error
	connSyncProblem error
	// beforeSync and beforeService, when set, run first in each Sync and
	// SyncService, without mu: the tests' hold on the controller's timing.
	beforeSync    func(desired ipvs.State)
	beforeService func(key ipvs.Key, desired *ipvs.Service)

	// calls are the Sync and SyncService calls, in order, with their
	// answers.
	calls []dataplaneCall
	// syncs are the desired states of the Syncs that did not fail.
	syncs []ipvs.State
	// service and deletes are the keys of the SyncService calls with a
	// desired virtual server and with nil, in order; desired is the last
	// desired virtual server by key.
	service, deletes []ipvs.Key
	desired          map[ipvs.Key]ipvs.Service
	// probes counts Probe calls.
	probes int
	// kernel holds the virtual servers programmed (without wrapped).
	kernel map[ipvs.Key]ipvs.Service
	// routes are the SetTunnelRoutes calls; sources, peers, bfd and keys
	// what SetTunnelSources, SetSyncPeers, SetBFDPeers and SetSyncKeys
	// gave last, and keySets how many SetSyncKeys calls there were.
	routes  []map[netip.Addr]netip.Addr
	sources []netip.Addr
	peers   []netip.Addr
	bfd     []netip.Addr
	keys    ipvs.SyncKeys
	keySets int
}

// dataplaneCall is a Sync (full) or SyncService call and its answer.
type dataplaneCall struct {
	full bool
	key  ipvs.Key // SyncService
	del  bool     // SyncService(key, nil)
	plan ipvs.Plan
	err  error
}

func (c dataplaneCall) String() string {
	switch {
	case c.full:
		return fmt.Sprintf("Sync: %v (err %v)", c.plan, c.err)
	case c.del:
		return fmt.Sprintf("SyncService(%s, nil): %v (err %v)", c.key, c.plan, c.err)
	}
	return fmt.Sprintf("SyncService(%s): %v (err %v)", c.key, c.plan, c.err)
}

func (d *fakeDataplane) Sync(desired ipvs.State) (ipvs.Plan, error) {
	if d.beforeSync != nil {
		d.beforeSync(desired)
	}
	if d.wrapped != nil {
		p, err := d.wrapped.Sync(desired)
		d.record(dataplaneCall{full: true, plan: p, err: err})
		return p, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	p, err := d.sync(desired)
	d.calls = append(d.calls, dataplaneCall{full: true, plan: p, err: err})
	return p, err
}

// sync is Sync in memory.
func (d *fakeDataplane) sync(desired ipvs.State) (p ipvs.Plan, err error) {
	if d.failSyncs > 0 {
		d.failSyncs--
		return ipvs.Plan{}, errors.New("injected dataplane failure")
	}
	d.syncs = append(d.syncs, desired.Clone())
	if d.drifted {
		p.Lost = slices.SortedFunc(maps.Keys(desired.Services), func(a, b ipvs.Key) int { return strings.Compare(a.String(), b.String()) })
	}
	d.drifted = false
	d.kernel = map[ipvs.Key]ipvs.Service{}
	refused := map[ipvs.Key]error{}
	for k, s := range desired.Services {
		if err := d.refusal(s); err != nil {
			refused[k] = err
			continue
		}
		d.kernel[k] = s
	}
	if len(refused) > 0 {
		return p, &ipvs.SyncErrors{Services: refused}
	}
	return p, nil
}

func (d *fakeDataplane) SyncService(key ipvs.Key, desired *ipvs.Service) (ipvs.Plan, error) {
	if d.beforeService != nil {
		d.beforeService(key, desired)
	}
	if d.wrapped != nil {
		p, err := d.wrapped.SyncService(key, desired)
		d.record(dataplaneCall{key: key, del: desired == nil, plan: p, err: err})
		return p, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	p, err := d.syncService(key, desired)
	d.calls = append(d.calls, dataplaneCall{key: key, del: desired == nil, plan: p, err: err})
	return p, err
}

// record adds c to the calls.
func (d *fakeDataplane) record(c dataplaneCall) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls = append(d.calls, c)
}

// syncService is SyncService in memory.
func (d *fakeDataplane) syncService(key ipvs.Key, desired *ipvs.Service) (ipvs.Plan, error) {
	if d.kernel == nil {
		d.kernel = map[ipvs.Key]ipvs.Service{}
	}
	if desired == nil {
		d.deletes = append(d.deletes, key)
		delete(d.kernel, key)
	} else {
		d.service = append(d.service, key)
		if d.desired == nil {
			d.desired = map[ipvs.Key]ipvs.Service{}
		}
		d.desired[key] = *desired
		if err := d.refusal(*desired); err != nil {
			return ipvs.Plan{}, err
		}
		d.kernel[key] = *desired
	}
	p := ipvs.Plan{Lost: d.lostOnService}
	d.lostOnService = nil
	return p, nil
}

// refusal is the error of a kernel without the scheduler refuse.
func (d *fakeDataplane) refusal(s ipvs.Service) error {
	if d.refuse != "" && s.Scheduler == d.refuse {
		return fmt.Errorf("add virtual server %s: %w: %q", s.Key(), ipvs.ErrSchedulerUnavailable, s.Scheduler)
	}
	return nil
}

func (d *fakeDataplane) Probe() (bool, error) {
	d.mu.Lock()
	d.probes++
	w, drifted := d.wrapped, d.drifted
	d.mu.Unlock()
	if w != nil {
		return w.Probe()
	}
	return drifted, nil
}

func (d *fakeDataplane) SetBFDPeers(peers []netip.Addr) error {
	d.mu.Lock()
	d.bfd = slices.Clone(peers)
	w := d.wrapped
	d.mu.Unlock()
	if w != nil {
		return w.SetBFDPeers(peers)
	}
	return nil
}

func (d *fakeDataplane) TwoTierIPv6() (bool, error) {
	d.mu.Lock()
	w, on, why := d.wrapped, d.twoTierIPv6, d.no6
	d.mu.Unlock()
	if w != nil {
		return w.TwoTierIPv6()
	}
	return on, why
}

func (d *fakeDataplane) SetTunnelRoutes(routes map[netip.Addr]netip.Addr) error {
	d.mu.Lock()
	d.routes = append(d.routes, maps.Clone(routes))
	w := d.wrapped
	d.mu.Unlock()
	if w != nil {
		return w.SetTunnelRoutes(routes)
	}
	return nil
}

func (d *fakeDataplane) SetTunnelSources(addrs []netip.Addr) error {
	d.mu.Lock()
	d.sources = slices.Clone(addrs)
	w := d.wrapped
	d.mu.Unlock()
	if w != nil {
		return w.SetTunnelSources(addrs)
	}
	return nil
}

func (d *fakeDataplane) ConnSyncProblem() error {
	d.mu.Lock()
	w, problem := d.wrapped, d.connSyncProblem
	d.mu.Unlock()
	if w != nil {
		return w.ConnSyncProblem()
	}
	return problem
}

func (d *fakeDataplane) SetSyncPeers(peers []netip.Addr) {
	d.mu.Lock()
	d.peers = slices.Clone(peers)
	w := d.wrapped
	d.mu.Unlock()
	if w != nil {
		w.SetSyncPeers(peers)
	}
}

// SetSyncKeys makes fakeDataplane a SyncKeySetter.
func (d *fakeDataplane) SetSyncKeys(k ipvs.SyncKeys) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.keys = k
	d.keySets++
}

// counts returns the count of Syncs that did not fail and of SyncService
// calls with and without a desired virtual server.
func (d *fakeDataplane) counts() (syncs, services, deletes int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.syncs), len(d.service), len(d.deletes)
}

// since returns the calls from index i on, and the current count.
func (d *fakeDataplane) since(i int) ([]dataplaneCall, int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.calls[i:]), len(d.calls)
}

// count returns the count of Sync and SyncService calls.
func (d *fakeDataplane) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.calls)
}

// fullSyncs returns the count of Sync calls.
func (d *fakeDataplane) fullSyncs() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, c := range d.calls {
		if c.full {
			n++
		}
	}
	return n
}

// has reports whether the kernel holds the virtual server vip:80/TCP.
func (d *fakeDataplane) has(vip string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, ok := d.kernel[ipvs.Key{VIP: netip.MustParseAddr(vip), Port: 80, Protocol: ipvs.TCP}]
	return ok
}

// last returns the desired state of the last Sync and the last tunnel
// routes.
func (d *fakeDataplane) last() (ipvs.State, map[netip.Addr]netip.Addr) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var st ipvs.State
	if len(d.syncs) > 0 {
		st = d.syncs[len(d.syncs)-1]
	}
	var r map[netip.Addr]netip.Addr
	if len(d.routes) > 0 {
		r = d.routes[len(d.routes)-1]
	}
	return st, r
}

// syncPeers returns the last SetSyncPeers' addresses, printed.
func (d *fakeDataplane) syncPeers() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return fmt.Sprint(d.peers)
}

// guarded returns the last SetBFDPeers' addresses.
func (d *fakeDataplane) guarded() []netip.Addr {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.bfd)
}

// lastKeys returns the last SetSyncKeys' keys and the count of calls.
func (d *fakeDataplane) lastKeys() (ipvs.SyncKeys, int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.keys, d.keySets
}
