//go:build kernel

package ipvs

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	libipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vipcast/vipcast/test/vm"
)

// TestKernel runs the dataplane against Linux IPVS in a real kernel: one VM
// boot for all subtests. The root namespace of the VM is the director (the
// node); clients and backends are network namespaces wired to it with veth
// pairs. Each subtest uses its own dummy link, so that the VIPs (and hence
// the virtual servers) of one are foreign to the others.
func TestKernel(t *testing.T) {
	if !vm.InVM() {
		kernelSuite.Run(t)
		return
	}
	sysctl(t, "net/ipv4/ip_forward", "1")
	sysctl(t, "net/ipv6/conf/all/forwarding", "1")
	t.Run("MobyMasquerade", testMobyMasquerade)
	t.Run("SpreadRemoveDrain", testSpreadRemoveDrain)
	t.Run("Restart", testRestart)
	t.Run("DriftAndForeign", testDriftAndForeign)
	t.Run("UDPAndIPv6", testUDPAndIPv6)
	t.Run("SNAT", testSNAT)
	t.Run("RefusedScheduler", testRefusedScheduler)
	t.Run("Filter", testFilter)
	t.Run("SourceRanges", testSourceRanges)
	t.Run("LargeSync", testLargeSync)
	t.Run("Probe", testProbe)
	t.Run("FlushHeld", testFlushHeld) // flushes the root namespace: last
}

// testLargeSync: a Sync from empty of 5,000 Cluster-policy virtual servers
// puts 5,000 elements in each of the source NAT set and the VIP filter's
// two sets, more than one netlink message holds: it must go in batches
// that the kernel takes, not fall back to one transaction per element
// (which took minutes under emulation with 10,000 Services).
func testLargeSync(t *testing.T) {
	d := newDataplane(t, "vipcast-l")
	desired := NewState()
	for i := range 5000 {
		desired.Add(Service{VIP: netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}), Port: 80, Protocol: TCP, SNAT: true})
	}
	p := syncOK(t, d, desired)
	if len(p.AddSNAT) != 5000 || len(p.Filter.AddAllow) != 5000 || len(p.Filter.AddVIPs) != 5000 {
		t.Errorf("Sync from empty: %v, want 5000 of each set", p)
	}
	if d.nft.slowPaths != 0 {
		t.Errorf("%d nftables batches failed and were redone element by element, want none", d.nft.slowPaths)
	}
	f, err := d.ReadFilter()
	must(t, err)
	if want := FilterOf(desired); !reflect.DeepEqual(f, want) {
		t.Errorf("VIP filter reads back %d VIPs and %d ports, want %d and %d", len(f.VIPs), len(f.Allow), len(want.VIPs), len(want.Allow))
	}
	if p := syncOK(t, d, NewState()); p.Len() != 5*5000 {
		t.Errorf("Sync to empty: %v", p)
	}
}

// unloadedScheduler is an IPVS scheduler whose module the VM does not load
// (vm.DefaultModules) and cannot load (no modprobe in the guest).
const unloadedScheduler = "sed"

// testRefusedScheduler: a Sync where the kernel refuses one virtual server
// (its scheduler is not available) programs the others, connections to
// them work, and the error names that virtual server only, as
// ErrSchedulerUnavailable. Once the Service asks for an available
// scheduler, the next Sync adds it and leaves the others alone.
func testRefusedScheduler(t *testing.T) {
	d := newDataplane(t, "vipcast-r")
	cl := newClient(t)
	b1 := newBackend(t, "r1", true)
	good1 := Service{VIP: ip("192.0.2.50"), Port: 80, Protocol: TCP, Backends: backends(1, b1)}
	good2 := Service{VIP: ip("192.0.2.51"), Port: 80, Protocol: TCP, SNAT: true, Backends: backends(1, b1)}
	bad := Service{VIP: ip("192.0.2.52"), Port: 80, Protocol: TCP, Scheduler: unloadedScheduler, Backends: backends(1, b1)}
	p, err := d.Sync(state(good1, good2, bad))
	t.Logf("Sync: %v: %v", p, err)
	var se *SyncErrors
	if !errors.As(err, &se) {
		t.Fatalf("Sync with an unavailable scheduler: error %v, want a *SyncErrors", err)
	}
	if len(se.Services) != 1 || se.Services[bad.Key()] == nil || se.Other != nil {
		t.Fatalf("SyncErrors %+v, want virtual server %s only", se, bad.Key())
	}
	if !errors.Is(se.Services[bad.Key()], ErrSchedulerUnavailable) || !errors.Is(err, unix.ENOENT) {
		t.Errorf("error %v: want ErrSchedulerUnavailable wrapping ENOENT", se.Services[bad.Key()])
	}
	if msg := se.Services[bad.Key()].Error(); strings.Contains(msg, "real server") {
		t.Errorf("error %q: the real servers of a refused virtual server are not tried, want no error about them", msg)
	}
	st, err := d.Read()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []Service{good1, good2} {
		if got := st.Services[s.Key()]; len(got.Backends) != 1 {
			t.Errorf("virtual server %s = %+v after the partial Sync, want it with its real server", s.Key(), got)
		}
		if got := cl.spread(t, netip.AddrPortFrom(s.VIP, s.Port), 2); got["r1"] != 2 {
			t.Errorf("connections to %s reached %v, want r1", s.Key(), got)
		}
	}
	if _, ok := st.Services[bad.Key()]; ok {
		t.Errorf("refused virtual server %s is in the kernel", bad.Key())
	}

	bad.Scheduler = "rr"
	p = syncOK(t, d, state(good1, good2, bad))
	if keys := planServiceKeys(p); len(keys) != 1 || !keys[bad.Key()] {
		t.Errorf("the fixing Sync touched virtual servers %v, want %s only", keys, bad.Key())
	}
	syncOK(t, d, NewState())
}

// planServiceKeys returns the virtual servers whose IPVS entries a plan
// adds, changes or deletes.
func planServiceKeys(p Plan) map[Key]bool {
	keys := map[Key]bool{}
	for _, s := range append(slices.Clone(p.AddServices), p.UpdateServices...) {
		keys[s.Key()] = true
	}
	for _, c := range slices.Concat(p.AddBackends, p.UpdateBackends, p.LowerBackends, p.DelBackends) {
		keys[c.Key] = true
	}
	for _, k := range p.DelServices {
		keys[k] = true
	}
	return keys
}

func newDataplane(t *testing.T, link string) *Dataplane {
	t.Helper()
	d, err := New(Options{LinkName: link})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func syncOK(t *testing.T, d *Dataplane, desired State) Plan {
	t.Helper()
	p, err := d.Sync(desired)
	if err != nil {
		t.Fatalf("Sync: %v", err)
	}
	t.Logf("Sync: %v", p)
	return p
}

func backends(w int, bs ...*backend) []Backend {
	var out []Backend
	for _, b := range bs {
		out = append(out, Backend{Addr: b.v4(), Port: backendPort, Weight: w})
	}
	return out
}

// testSpreadRemoveDrain: connections to the VIP spread over the ready
// backends (default scheduler: mh, port hashing, fallback); a backend
// removed by Sync gets no new connections; a backend drained (weight 0, via
// the incremental SyncService) keeps its established connection and gets no
// new ones.
func testSpreadRemoveDrain(t *testing.T) {
	d := newDataplane(t, "vipcast-a")
	cl := newClient(t)
	b1, b2, b3 := newBackend(t, "b1", true), newBackend(t, "b2", true), newBackend(t, "b3", true)
	vip := netip.AddrPortFrom(ip("192.0.2.10"), 80)
	s := Service{VIP: vip.Addr(), Port: vip.Port(), Protocol: TCP, Backends: backends(1, b1, b2, b3)}
	p := syncOK(t, d, state(s))
	if len(p.AddServices) != 1 || len(p.AddBackends) != 3 || len(p.AddVIPs) != 1 {
		t.Fatalf("first Sync: %v", p)
	}
	got := cl.spread(t, vip, 60)
	t.Logf("3 backends, 60 connections: %v", got)
	for _, b := range []string{"b1", "b2", "b3"} {
		if got[b] == 0 {
			t.Errorf("backend %s got no connection: %v", b, got)
		}
	}

	// Remove b3.
	s.Backends = backends(1, b1, b2)
	if p := syncOK(t, d, state(s)); p.Len() != 1 || len(p.DelBackends) != 1 {
		t.Fatalf("remove b3: %v", p)
	}
	got = cl.spread(t, vip, 30)
	t.Logf("b3 removed, 30 connections: %v", got)
	if got["b3"] != 0 || got["b1"] == 0 || got["b2"] == 0 {
		t.Errorf("after removing b3: %v", got)
	}

	// Hold a connection, drain its backend.
	held, err := cl.dial(t, vip)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	drained, other := b1, b2
	if held.backend == "b2" {
		drained, other = b2, b1
	}
	s.Backends = append(backends(0, drained), backends(1, other)...)
	p, err = d.SyncService(s.Key(), &s)
	if err != nil {
		t.Fatalf("SyncService: %v", err)
	}
	if p.Len() != 1 || len(p.LowerBackends) != 1 || p.LowerBackends[0].Backend.Weight != 0 {
		t.Fatalf("drain %s: %v", drained.name, p)
	}
	got = cl.spread(t, vip, 30)
	t.Logf("%s drained, 30 connections: %v", drained.name, got)
	if got[drained.name] != 0 || got[other.name] != 30 {
		t.Errorf("a drained backend got new connections: %v", got)
	}
	ans, err := held.ask("still there?")
	if err != nil || ans != drained.name+" still there?" {
		t.Errorf("established connection to the drained %s: %q, %v", drained.name, ans, err)
	}
	// The kernel agrees with the in-memory state.
	st, err := d.Read()
	if err != nil {
		t.Fatal(err)
	}
	if want := s.Normalize(); !reflect.DeepEqual(st.Services[s.Key()], want) {
		t.Errorf("kernel: %+v\nwant    %+v", st.Services[s.Key()], want)
	}
	syncOK(t, d, NewState())
}

// testRestart: a restarted speaker is a new process on the same kernel.
// The test binary is run again (dataplaneSyncHelper, a separate
// process inside the VM) with the same desired state: its fresh Dataplane
// reads the kernel and its Sync changes nothing, the kernel table is
// unchanged, an established connection survives and still exchanges data,
// and this process's Dataplane (the "old" speaker) still sees nothing to
// change, incrementally or with a full read.
func testRestart(t *testing.T) {
	cl := newClient(t)
	b1, b2 := newBackend(t, "r1", true), newBackend(t, "r2", true)
	desired := NewState()
	vip := netip.AddrPortFrom(ip("192.0.2.20"), 443)
	desired.Add(Service{VIP: vip.Addr(), Port: vip.Port(), Protocol: TCP, Backends: append(backends(1, b1), backends(0, b2)...)})
	desired.Add(Service{VIP: vip.Addr(), Port: 8443, Protocol: TCP, Scheduler: "rr", Persistent: 600, Backends: backends(3, b1, b2)})
	desired.Add(Service{VIP: ip("192.0.2.21"), Port: 80, Protocol: TCP, SNAT: true, Backends: backends(1, b1)})
	desired.Add(Service{VIP: ip("2001:db8::20"), Port: 443, Protocol: TCP, Scheduler: "wlc", Backends: []Backend{{Addr: b1.v6(), Port: backendPort, Weight: 2}}})

	d1 := newDataplane(t, "vipcast-b")
	if p := syncOK(t, d1, desired); p.Empty() {
		t.Fatal("first Sync changed nothing")
	}
	held, err := cl.dial(t, vip)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if ans, err := held.ask("before"); err != nil || ans != "r1 before" {
		t.Fatalf("established connection before the restart: %q, %v", ans, err)
	}
	before, err := d1.Read()
	if err != nil {
		t.Fatal(err)
	}

	res := runSyncHelper(t, "vipcast-b", desired)
	if res.Services != len(desired.Services) {
		t.Fatalf("the helper synced %d virtual servers, want %d", res.Services, len(desired.Services))
	}
	if res.Len != 0 || !res.Plan.Empty() {
		t.Errorf("Sync in a new process: %d changes (%s) %+v, want none", res.Len, res.String, res.Plan)
	}
	if after, err := d1.Read(); err != nil {
		t.Fatal(err)
	} else if !reflect.DeepEqual(after, before) {
		t.Errorf("kernel changed by the restarted reconciler:\n%+v\n%+v", before, after)
	}
	if ans, err := held.ask("after restart"); err != nil || ans != "r1 after restart" {
		t.Errorf("established connection after the restart: %q, %v", ans, err)
	}
	// The parent's own reconciler: nothing to do, incrementally (from its
	// in-memory state) or with a kernel read.
	for _, s := range desired.Services {
		if p, err := d1.SyncService(s.Key(), &s); err != nil || !p.Empty() {
			t.Errorf("SyncService(%s) after the restart: %v, %v", s.Key(), p, err)
		}
	}
	if p := syncOK(t, d1, desired); !p.Empty() {
		t.Errorf("Sync after the restart: %v %+v, want no changes", p, p)
	}
	if ans, err := held.ask("ping"); err != nil || ans != "r1 ping" {
		t.Errorf("established connection at the end: %q, %v", ans, err)
	}
	syncOK(t, d1, NewState())
}

// envSyncHelper names the directory through which dataplaneSyncHelper
// talks to its parent: it reads desired.json (a syncRequest) and writes
// result.json (a syncResult).
const envSyncHelper = "VIPCAST_TEST_SYNC_HELPER"

type syncRequest struct {
	Link     string
	Services []Service
	VIPs     []netip.Addr
}

type syncResult struct {
	PID, PPID int
	Services  int // virtual servers in the desired state
	Len       int
	String    string
	Plan      Plan
	Error     string
}

// runSyncHelper runs Sync of desired on link in a new process (this test
// binary, dataplaneSyncHelper through TestMain) and returns what it did.
func runSyncHelper(t *testing.T, link string, desired State) syncResult {
	t.Helper()
	dir := t.TempDir()
	req := syncRequest{Link: link}
	for _, k := range desired.keys() {
		req.Services = append(req.Services, desired.Services[k])
	}
	for a := range desired.VIPs {
		req.VIPs = append(req.VIPs, a)
	}
	b, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	must(t, os.WriteFile(filepath.Join(dir, "desired.json"), b, 0o644))
	start := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0]) //nolint:gosec // this test binary, as the helper process
	cmd.Env = append(os.Environ(), envSyncHelper+"="+dir)
	out, err := cmd.CombinedOutput()
	t.Logf("helper process (%s):\n%s", time.Since(start).Round(time.Millisecond), strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("helper process: %v", err)
	}
	b, err = os.ReadFile(filepath.Join(dir, "result.json"))
	if err != nil {
		t.Fatal(err)
	}
	var res syncResult
	must(t, json.Unmarshal(b, &res))
	if res.Error != "" {
		t.Fatalf("helper process: %s", res.Error)
	}
	if res.PID == os.Getpid() || res.PPID != os.Getpid() {
		t.Fatalf("helper ran as pid %d (parent %d), want a child of %d", res.PID, res.PPID, os.Getpid())
	}
	return res
}

// TestMain runs dataplaneSyncHelper instead of the tests when
// envSyncHelper names a directory: runSyncHelper starts this binary again
// that way, as a restarted speaker.
func TestMain(m *testing.M) {
	if dir := os.Getenv(envSyncHelper); dir != "" {
		if err := dataplaneSyncHelper(dir); err != nil {
			fmt.Fprintf(os.Stderr, "helper process: %v\n", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// dataplaneSyncHelper is the helper process: it opens a new Dataplane on
// the link of the request in dir, runs one Sync and writes what it did to
// dir/result.json (a Sync's error included).
func dataplaneSyncHelper(dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, "desired.json"))
	if err != nil {
		return err
	}
	var req syncRequest
	if err := json.Unmarshal(b, &req); err != nil {
		return err
	}
	desired := NewState()
	for _, s := range req.Services {
		desired.Add(s)
	}
	for _, a := range req.VIPs {
		desired.AddVIP(a)
	}
	res := syncResult{PID: os.Getpid(), PPID: os.Getppid(), Services: len(desired.Services)}
	d, err := New(Options{LinkName: req.Link})
	if err == nil {
		res.Plan, err = d.Sync(desired)
		d.Close()
	}
	if err != nil {
		res.Error = err.Error()
	}
	res.Len, res.String = res.Plan.Len(), res.Plan.String()
	fmt.Printf("helper pid %d: Sync of %d virtual servers on %s: %d changes (%s)\n", res.PID, res.Services, req.Link, res.Len, res.String)
	if b, err = json.Marshal(res); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "result.json"), b, 0o644) //nolint:gosec // a test's temporary file
}

// testDriftAndForeign: a virtual server deleted by hand and a weight
// changed by hand are repaired by the next full Sync; a foreign virtual
// server (a VIP that is not vipcast's) is never touched, even by a Sync of
// an empty state.
func testDriftAndForeign(t *testing.T) {
	d := newDataplane(t, "vipcast-c")
	cl := newClient(t)
	b1 := newBackend(t, "d1", true)
	h, err := libipvs.New("")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	foreign := &libipvs.Service{Address: net.ParseIP("198.51.100.7"), Protocol: unix.IPPROTO_TCP, Port: 80,
		AddressFamily: unix.AF_INET, SchedName: "rr", Netmask: 0xffffffff}
	must(t, h.NewService(foreign))
	must(t, h.NewDestination(foreign, &libipvs.Destination{Address: b1.v4().AsSlice(), Port: backendPort, Weight: 5, AddressFamily: unix.AF_INET}))
	defer func() { _ = h.DelService(foreign) }()
	readForeign := func() string {
		st, err := d.Read()
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("%+v", st.Services[Key{VIP: ip("198.51.100.7"), Port: 80, Protocol: TCP}])
	}
	before := readForeign()

	a := Service{VIP: ip("192.0.2.30"), Port: 80, Protocol: TCP, Backends: backends(1, b1)}
	b := Service{VIP: ip("192.0.2.31"), Port: 80, Protocol: TCP, Backends: backends(1, b1)}
	desired := state(a, b)
	if p := syncOK(t, d, desired); len(p.Lost) != 0 {
		t.Errorf("first Sync of a new Dataplane (nothing programmed yet) reports lost virtual servers: %v", p.Lost)
	}

	// Drift: a deleted by hand, b's weight changed by hand.
	must(t, h.DelService(kernelService(a)))
	must(t, h.UpdateDestination(kernelService(b), kernelDest(Backend{Addr: b1.v4(), Port: backendPort, Weight: 9})))
	if _, err := cl.dial(t, netip.AddrPortFrom(a.VIP, 80)); err == nil {
		t.Fatal("the deleted virtual server still answers")
	}
	p := syncOK(t, d, desired)
	if len(p.AddServices) != 1 || p.AddServices[0].Key() != a.Key() || len(p.AddBackends) != 1 ||
		len(p.LowerBackends) != 1 || p.Len() != 3 {
		t.Errorf("repair: %+v", p)
	}
	if !slices.Equal(p.Lost, []Key{a.Key()}) {
		t.Errorf("repair: Lost = %v, want [%s] (the virtual server deleted by hand; a changed weight is not lost)", p.Lost, a.Key())
	}
	if cn, err := cl.dial(t, netip.AddrPortFrom(a.VIP, 80)); err != nil {
		t.Errorf("repaired virtual server: %v", err)
	} else {
		cn.Close()
	}
	if p := syncOK(t, d, desired); !p.Empty() || len(p.Lost) != 0 {
		t.Errorf("second Sync: %v, lost %v", p, p.Lost)
	}
	if after := readForeign(); after != before {
		t.Errorf("foreign virtual server changed:\n%s\n%s", before, after)
	}

	// A virtual server deleted by hand while a read is under way, after
	// the list and before its real servers: the kernel dumps no real
	// servers for it, and the read leaves it out rather than planning
	// real servers for nothing.
	listed, err := d.ipvs.GetServices()
	must(t, err)
	must(t, h.DelService(kernelService(a)))
	mid := NewState()
	must(t, d.readListed(mid, listed, nil))
	if s, ok := mid.Services[a.Key()]; ok {
		t.Errorf("read of a virtual server deleted after the list: %+v, want it left out", s)
	}
	if s := mid.Services[b.Key()]; len(s.Backends) != 1 {
		t.Errorf("read of the virtual server listed with it: %+v, want its real server", s)
	}
	if p := syncOK(t, d, desired); !slices.Equal(p.Lost, []Key{a.Key()}) || len(p.AddServices) != 1 {
		t.Errorf("Sync after the deletion: %v, lost %v; want a back and lost", p, p.Lost)
	}

	// The incremental path does not read the kernel: a change to a virtual
	// server deleted by hand fails, SyncService reads the kernel again and
	// repairs the service. Its Lost names b too, deleted by hand as well:
	// the read replaced the in-memory state, so nothing else would know b
	// as lost; the next Sync puts b back.
	must(t, h.DelService(kernelService(a)))
	must(t, h.DelService(kernelService(b)))
	a.Backends[0].Weight = 2
	p, err = d.SyncService(a.Key(), &a)
	if err != nil || len(p.AddServices) != 1 || len(p.AddBackends) != 1 || p.Len() != 2 {
		t.Errorf("SyncService on a virtual server deleted by hand: %+v, %v", p, err)
	}
	if !slices.Equal(p.Lost, []Key{a.Key(), b.Key()}) {
		t.Errorf("SyncService on a virtual server deleted by hand: Lost = %v, want [%s %s]", p.Lost, a.Key(), b.Key())
	}
	if cn, err := cl.dial(t, netip.AddrPortFrom(a.VIP, 80)); err != nil {
		t.Errorf("virtual server repaired by SyncService: %v", err)
	} else {
		cn.Close()
	}
	if drifted, err := d.Probe(); err != nil || drifted {
		t.Errorf("Probe after SyncService's read: %v, %v (b is no longer in the in-memory state; SyncService's Lost reported it)", drifted, err)
	}
	desired.Add(a)
	if p := syncOK(t, d, desired); len(p.AddServices) != 1 || p.AddServices[0].Key() != b.Key() || p.Len() != 2 || len(p.Lost) != 0 {
		t.Errorf("Sync after SyncService repair: %v, lost %v; want b back (+svc 1, +rs 1) and nothing lost", p, p.Lost)
	}
	if p := syncOK(t, d, desired); !p.Empty() {
		t.Errorf("Sync after the repairs: %v", p)
	}

	// A restarted speaker that wants nothing removes only its own.
	d2 := newDataplane(t, "vipcast-c")
	p = syncOK(t, d2, NewState())
	if len(p.DelServices) != 2 || len(p.DelVIPs) != 2 || len(p.Filter.DelAllow) != 2 || len(p.Filter.DelVIPs) != 2 || p.Len() != 8 {
		t.Errorf("Sync(empty): %+v", p)
	}
	if after := readForeign(); after != before {
		t.Errorf("foreign virtual server changed by Sync(empty):\n%s\n%s", before, after)
	}
}

// testUDPAndIPv6: UDP through an IPv4 VIP, TCP and UDP through an IPv6 VIP
// (bound without DAD, usable at once).
func testUDPAndIPv6(t *testing.T) {
	d := newDataplane(t, "vipcast-d")
	cl := newClient(t)
	b1, b2 := newBackend(t, "u1", true), newBackend(t, "u2", true)
	v6 := func(bs ...*backend) []Backend {
		var out []Backend
		for _, b := range bs {
			out = append(out, Backend{Addr: b.v6(), Port: backendPort, Weight: 1})
		}
		return out
	}
	desired := state(
		Service{VIP: ip("192.0.2.40"), Port: 53, Protocol: UDP, Backends: backends(1, b1, b2)},
		Service{VIP: ip("2001:db8::40"), Port: 80, Protocol: TCP, Backends: v6(b1, b2)},
		Service{VIP: ip("2001:db8::40"), Port: 53, Protocol: UDP, Backends: v6(b1, b2)},
	)
	syncOK(t, d, desired)
	for _, to := range []netip.AddrPort{netip.MustParseAddrPort("192.0.2.40:53"), netip.MustParseAddrPort("[2001:db8::40]:53")} {
		got := map[string]int{}
		for i := 0; i < 20; i++ {
			name, src, err := cl.udp(t, to)
			if err != nil {
				t.Fatalf("UDP %s: %v", to, err)
			}
			if !strings.HasPrefix(src, "10.100.") && !strings.HasPrefix(src, "fd00:100:") {
				t.Errorf("UDP %s: backend saw source %s, want the client's", to, src)
			}
			got[name]++
		}
		t.Logf("UDP %s, 20 sockets: %v", to, got)
		if got["u1"] == 0 || got["u2"] == 0 {
			t.Errorf("UDP %s did not spread: %v", to, got)
		}
	}
	got := cl.spread(t, netip.MustParseAddrPort("[2001:db8::40]:80"), 20)
	t.Logf("TCP over IPv6, 20 connections: %v", got)
	if got["u1"] == 0 || got["u2"] == 0 {
		t.Errorf("IPv6 TCP did not spread: %v", got)
	}
	syncOK(t, d, NewState())
}

// testMobyMasquerade is the bare moby/ipvs recipe the dataplane builds on:
// a VIP on a dummy link, a virtual server VIP:80 (rr, masquerade) with two
// real servers in two backend namespaces, and a client namespace routed
// through the root namespace. Connections reach both backends, in
// round-robin order.
func testMobyMasquerade(t *testing.T) {
	const (
		vip   = "10.96.0.10"
		port  = 80
		conns = 10
	)
	dummy := &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: "moby0"}}
	must(t, netlink.LinkAdd(dummy))
	defer func() { _ = netlink.LinkDel(dummy) }()
	must(t, netlink.AddrAdd(dummy, addr(t, vip+"/32")))
	must(t, netlink.LinkSetUp(dummy))

	client := newNS(t)
	wire(t, client, "mc", "10.0.0.1", "10.0.0.2")
	backends := map[string]string{"b1": "10.0.1.2", "b2": "10.0.2.2"}
	for i, name := range []string{"b1", "b2"} {
		ns := newNS(t)
		wire(t, ns, "m"+name, fmt.Sprintf("10.0.%d.1", i+1), backends[name])
		serve(t, ns, backends[name], 8080, name)
	}

	// The modules are loaded by the VM's init: moby/ipvs would try to run
	// modprobe, and it resolves the IPVS netlink family once per process.
	h, err := libipvs.New("")
	if err != nil {
		t.Fatalf("ipvs.New: %v", err)
	}
	defer h.Close()
	svc := &libipvs.Service{
		Address:       net.ParseIP(vip),
		Protocol:      unix.IPPROTO_TCP,
		Port:          port,
		AddressFamily: unix.AF_INET,
		SchedName:     "rr",
		Netmask:       0xffffffff,
	}
	if err := h.NewService(svc); err != nil {
		t.Fatalf("NewService: %v", err)
	}
	defer func() { _ = h.DelService(svc) }()
	for _, name := range []string{"b1", "b2"} {
		d := &libipvs.Destination{
			Address:         net.ParseIP(backends[name]),
			Port:            8080,
			Weight:          1,
			ConnectionFlags: libipvs.ConnectionFlagMasq,
			AddressFamily:   unix.AF_INET,
		}
		if err := h.NewDestination(svc, d); err != nil {
			t.Fatalf("NewDestination %s: %v", name, err)
		}
	}

	got := map[string]int{}
	var order []string
	for i := 0; i < conns; i++ {
		var c net.Conn
		err := inNS(t, client, func() (err error) {
			c, err = net.DialTimeout("tcp4", net.JoinHostPort(vip, fmt.Sprint(port)), 10*time.Second)
			return err
		})
		if err != nil {
			t.Fatalf("connection %d to the VIP: %v", i, err)
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		c.Close()
		if err != nil {
			t.Fatalf("connection %d: read: %v", i, err)
		}
		name := strings.TrimSpace(line)
		got[name]++
		order = append(order, name)
	}
	t.Logf("backends in connection order: %v", order)
	if got["b1"] != conns/2 || got["b2"] != conns/2 {
		t.Errorf("rr over %d connections: got %v, want %d each", conns, got, conns/2)
	}

	dests, err := h.GetDestinations(svc)
	if err != nil {
		t.Fatalf("GetDestinations: %v", err)
	}
	for _, d := range dests {
		t.Logf("real server %s:%d active %d inactive %d", d.Address, d.Port, d.ActiveConnections, d.InactiveConnections)
		if n := d.ActiveConnections + d.InactiveConnections; n != conns/2 {
			t.Errorf("real server %s: IPVS counts %d connections, want %d", d.Address, n, conns/2)
		}
	}
}

// testSNAT: externalTrafficPolicy Local keeps the client's address;
// Cluster (SNAT) masquerades to the node's address, which is what lets a
// backend without a route back to the client (on another node) answer, for
// TCP and UDP, IPv4 and IPv6. Without SNAT that backend cannot answer. The
// source NAT state survives a restart (no changes) and goes with its
// virtual server.
func testSNAT(t *testing.T) {
	d := newDataplane(t, "vipcast-e")
	cl := newClient(t)
	local := newBackend(t, "local", true)
	remote := newBackend(t, "remote", false) // no route to the client
	remoteV6 := []Backend{{Addr: remote.v6(), Port: backendPort, Weight: 1}}
	desired := state(
		Service{VIP: ip("192.0.2.50"), Port: 80, Protocol: TCP, Backends: backends(1, local)},
		Service{VIP: ip("192.0.2.51"), Port: 80, Protocol: TCP, SNAT: true, Backends: backends(1, remote)},
		Service{VIP: ip("192.0.2.51"), Port: 53, Protocol: UDP, SNAT: true, Backends: backends(1, remote)},
		Service{VIP: ip("192.0.2.52"), Port: 80, Protocol: TCP, Backends: backends(1, remote)},
		Service{VIP: ip("2001:db8::51"), Port: 80, Protocol: TCP, SNAT: true, Backends: remoteV6},
	)
	p := syncOK(t, d, desired)
	if len(p.AddSNAT) != 3 {
		t.Fatalf("first Sync: %+v", p)
	}
	nodeV4, nodeV6 := remote.v4().Prev().String(), remote.v6().Prev().String() // the root side, .1 / ::1

	cn, err := cl.dial(t, netip.MustParseAddrPort("192.0.2.50:80"))
	if err != nil {
		t.Fatalf("Local: %v", err)
	}
	cn.Close()
	if cn.source != cl.addrs[0].String() {
		t.Errorf("Local: backend saw source %s, want the client's %s", cn.source, cl.addrs[0])
	}
	for _, to := range []string{"192.0.2.51:80", "[2001:db8::51]:80"} {
		cn, err := cl.dial(t, netip.MustParseAddrPort(to))
		if err != nil {
			t.Fatalf("Cluster %s to a remote backend: %v", to, err)
		}
		if cn.source != nodeV4 && cn.source != nodeV6 {
			t.Errorf("Cluster %s: backend saw source %s, want the node's (%s or %s)", to, cn.source, nodeV4, nodeV6)
		}
		if ans, err := cn.ask("hi"); err != nil || ans != "remote hi" {
			t.Errorf("Cluster %s: %q, %v", to, ans, err)
		}
		cn.Close()
	}
	if name, src, err := cl.udp(t, netip.MustParseAddrPort("192.0.2.51:53")); err != nil || name != "remote" || src != nodeV4 {
		t.Errorf("Cluster UDP: %s %s %v, want remote %s", name, src, err, nodeV4)
	}
	// Without SNAT the remote backend's replies have no way back.
	var nc net.Conn
	_ = inNS(t, cl.ns, func() (err error) {
		nc, err = net.DialTimeout("tcp", "192.0.2.52:80", 1500*time.Millisecond)
		return err
	})
	if nc != nil {
		nc.Close()
		t.Errorf("a remote backend answered without source NAT: the test topology does not test SNAT")
	}

	// Restart: the source NAT set is read back, nothing changes.
	d2 := newDataplane(t, "vipcast-e")
	if p := syncOK(t, d2, desired); !p.Empty() {
		t.Errorf("Sync after restart: %+v", p)
	}
	// Cluster -> Local on 192.0.2.51:80: the remote backend becomes
	// unreachable (as it should), the element goes.
	s := desired.Services[Key{VIP: ip("192.0.2.51"), Port: 80, Protocol: TCP}]
	s.SNAT = false
	p, err = d2.SyncService(s.Key(), &s)
	if err != nil || p.Len() != 1 || len(p.DelSNAT) != 1 {
		t.Errorf("SNAT off: %+v, %v", p, err)
	}
	desired.Add(s)
	if p := syncOK(t, d2, desired); !p.Empty() {
		t.Errorf("Sync after SNAT off: %+v", p)
	}
	p = syncOK(t, d2, NewState())
	if len(p.DelSNAT) != 2 || len(p.DelServices) != 5 {
		t.Errorf("Sync(empty): %+v", p)
	}
	if p := syncOK(t, d2, NewState()); !p.Empty() {
		t.Errorf("second Sync(empty): %+v", p)
	}
}
