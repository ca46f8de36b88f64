//go:build kernel

package ipvs

import (
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	libipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vipcast/vipcast/test/vm"
)

// BenchmarkKernelDataplane measures the dataplane in the VM's kernel, once
// (b.N is ignored: the figures are reported as metrics):
//
//   - sync-s: Dataplane.Sync of 10,000 virtual servers × 10 real servers
//     (and 10,000 VIPs) from an empty kernel;
//   - floor-s: the same 10,000 × 10 created by a bare loop of moby/ipvs
//     calls plus a bare loop of netlink AddrAdd (floor-ipvs-s: the IPVS
//     part alone), and sync/floor, the dataplane's overhead;
//   - resync-s: a full Sync (read the whole table, diff) that changes
//     nothing, the cost of the periodic drift repair;
//   - incr-us: SyncService of one endpoint change (a real server replaced)
//     with the 10,000 present;
//   - vip-conn/s, direct-conn/s, vip/direct: new TCP connections per second
//     (connect, read a greeting, close) through a VIP and straight to the
//     backend, same VM, same run. TCG figures say nothing about real speed;
//     the ratios do.
//
// Run: go test -run '^$' -bench BenchmarkKernelDataplane ./ipvs/
func BenchmarkKernelDataplane(b *testing.B) {
	if !vm.InVM() {
		benchInVM(b)
		return
	}
	nSvc, nRS := 10000, 10
	if v, err := strconv.Atoi(os.Getenv("VIPCAST_BENCH_SERVICES")); err == nil && v > 0 && v <= 65536 {
		nSvc = v
	}
	// Progress goes to the console at once (b.Logf is printed at the end).
	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
	}
	sysctl(b, "net/ipv4/ip_forward", "1")
	vipOf := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}) }
	rsOf := func(i, j int) netip.Addr {
		k := (i*7 + j*131) % 5000
		return netip.AddrFrom4([4]byte{10, 244, byte(k / 250), byte(k%250 + 1)})
	}
	desired := NewState()
	for i := 0; i < nSvc; i++ {
		s := Service{VIP: vipOf(i), Port: 80, Protocol: TCP}
		for j := 0; j < nRS; j++ {
			s.Backends = append(s.Backends, Backend{Addr: rsOf(i, j), Port: 8080, Weight: 1})
		}
		desired.Add(s)
	}

	d, err := New(Options{})
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	p, err := d.Sync(desired)
	if err != nil {
		b.Fatal(err)
	}
	syncDur := time.Since(start)
	logf("Sync from empty: %v in %s", p, syncDur.Round(time.Millisecond))
	// Per Service: its VIP, its virtual server, its real servers, and the
	// VIP filter's two set elements (the VIP, and VIP . protocol . port).
	if want := 4*nSvc + nSvc*nRS; p.Len() != want {
		b.Fatalf("Sync from empty: %d changes, want %d", p.Len(), want)
	}

	start = time.Now()
	p, err = d.Sync(desired)
	if err != nil {
		b.Fatal(err)
	}
	resync := time.Since(start)
	logf("Sync, no change: %v in %s", p, resync.Round(time.Millisecond))
	if !p.Empty() {
		b.Fatalf("second Sync: %v", p)
	}

	const changes = 200
	start = time.Now()
	for c := 0; c < changes; c++ {
		s := desired.Services[Key{VIP: vipOf(c * 37 % nSvc), Port: 80, Protocol: TCP}]
		s.Backends = append([]Backend{{Addr: netip.AddrFrom4([4]byte{10, 245, byte(c >> 8), byte(c)}), Port: 8080, Weight: 1}}, s.Backends[1:]...)
		p, err := d.SyncService(s.Key(), &s)
		if err != nil {
			b.Fatal(err)
		}
		if p.Len() != 2 {
			b.Fatalf("endpoint change: %v", p)
		}
		desired.Add(s)
	}
	incr := time.Since(start) / changes
	logf("SyncService, one endpoint replaced: %s each (%d changes)", incr, changes)
	if p, err := d.Sync(desired); err != nil || !p.Empty() {
		b.Fatalf("Sync after the incremental changes: %v, %v", p, err)
	}

	// Throughput through a VIP with the 10,000 present, vs direct to an
	// identical backend (not the VIP's own: IPVS would take the direct
	// connections' replies for those of earlier VIP connections from the
	// same client port).
	cl := newClient(b)
	be, be2 := newBackend(b, "bench", true), newBackend(b, "direct", true)
	vip := netip.AddrPortFrom(ip("192.0.2.99"), 80)
	s := Service{VIP: vip.Addr(), Port: 80, Protocol: TCP, Backends: backends(1, be)}
	if _, err := d.SyncService(s.Key(), &s); err != nil {
		b.Fatal(err)
	}
	direct := netip.AddrPortFrom(be2.v4(), backendPort)
	connRate(b, cl.ns, vip) // warm up
	// Alternate, to spread the noise of a shared TCG host over both.
	var vipRate, directRate float64
	for range 3 {
		vipRate += connRate(b, cl.ns, vip) / 3
		directRate += connRate(b, cl.ns, direct) / 3
	}
	logf("connections/s: through the VIP %.0f, direct %.0f", vipRate, directRate)

	// Floor: the same changes in the same order as Apply (addresses,
	// virtual servers, real servers) by bare netlink and moby/ipvs loops,
	// in a fresh network namespace: IPVS state is per namespace, and
	// deleted real servers linger for minutes in the namespace's "trash"
	// list, which every new real server is looked up in (a floor measured
	// after a flush of the same table pays for that scan). The root
	// namespace's table is flushed first: the kernel's virtual server hash
	// table (256 buckets) is shared by all namespaces.
	d.Close()
	h0, err := libipvs.New("")
	if err != nil {
		b.Fatal(err)
	}
	must(b, h0.Flush())
	h0.Close()
	fns := newNS(b)
	h, err := libipvs.New(fmt.Sprintf("/proc/self/fd/%d", int(fns)))
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	nh, err := netlink.NewHandleAt(fns, unix.NETLINK_ROUTE)
	if err != nil {
		b.Fatal(err)
	}
	defer nh.Close()
	must(b, nh.LinkAdd(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: "floor0"}}))
	dummy, err := nh.LinkByName("floor0")
	if err != nil {
		b.Fatal(err)
	}
	keys := desired.keys()
	start = time.Now()
	for _, k := range keys {
		if err := nh.AddrAdd(dummy, vipAddr(k.VIP)); err != nil {
			b.Fatal(err)
		}
	}
	floorAddr := time.Since(start)
	start = time.Now()
	for _, k := range keys {
		if err := h.NewService(kernelService(desired.Services[k])); err != nil {
			b.Fatal(err)
		}
	}
	for _, k := range keys {
		s := desired.Services[k]
		ks := kernelService(s)
		for _, be := range s.Backends {
			if err := h.NewDestination(ks, kernelDest(be)); err != nil {
				b.Fatal(err)
			}
		}
	}
	floorIPVS := time.Since(start)
	logf("floor: %d addresses %s, %d virtual + %d real servers %s", nSvc, floorAddr.Round(time.Millisecond),
		nSvc, nSvc*nRS, floorIPVS.Round(time.Millisecond))

	floor := floorIPVS + floorAddr
	b.ReportMetric(syncDur.Seconds(), "sync-s")
	b.ReportMetric(floor.Seconds(), "floor-s")
	b.ReportMetric(floorIPVS.Seconds(), "floor-ipvs-s")
	b.ReportMetric(syncDur.Seconds()/floor.Seconds(), "sync/floor")
	b.ReportMetric(resync.Seconds(), "resync-s")
	b.ReportMetric(float64(incr.Microseconds()), "incr-us")
	b.ReportMetric(vipRate, "vip-conn/s")
	b.ReportMetric(directRate, "direct-conn/s")
	b.ReportMetric(vipRate/directRate, "vip/direct")
}

func benchEnv() []string {
	if v := os.Getenv("VIPCAST_BENCH_SERVICES"); v != "" {
		return []string{"VIPCAST_BENCH_SERVICES=" + v}
	}
	return nil
}

// benchInVM runs the benchmark in a VM and reports the guest's metrics;
// opts change the VM's options (modules).
func benchInVM(b *testing.B, opts ...func(vm.Options) vm.Options) {
	ctx := b.Context()
	bin, err := vm.TestBinary(ctx)
	if err != nil {
		b.Fatalf("vm: build test binary: %v", err)
	}
	name := b.Name()
	o := vm.Options{
		TestBinary: bin,
		Args: []string{"-test.run", "^$", "-test.bench", "^" + name + "$", "-test.benchtime", "1x",
			"-test.v", "-test.timeout", "12m"},
		Env:      benchEnv(),
		Timeout:  14 * time.Minute,
		MemoryMB: 2048,
		// Live progress: the benchmark's own log comes only at its end.
		Logf: func(format string, args ...any) { fmt.Fprintf(os.Stderr, "vm| "+format+"\n", args...) },
	}
	for _, f := range opts {
		o = f(o)
	}
	res := vm.Run(b, o)
	if res.ExitCode != 0 {
		b.Fatalf("vm: guest benchmark exited %d", res.ExitCode)
	}
	// "BenchmarkX   1   123 ns/op   12.3 sync-s   ..."
	for _, line := range strings.Split(res.Output, "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(f[0], name) {
			continue
		}
		if _, err := strconv.Atoi(f[1]); err != nil {
			continue
		}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil || f[i+1] == "ns/op" {
				continue
			}
			b.ReportMetric(v, f[i+1])
		}
		return
	}
	b.Fatal(fmt.Errorf("vm: no benchmark result line for %s in the guest output", name))
}
