//go:build kernel

package ipvs

import (
	"errors"
	"io/fs"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vipcast/vipcast/test/vm"
)

// TestKernelPrepareNode boots a VM in which ip_vs is not loaded (it is in
// the initramfs, for the kernel's module autoloading to find through the
// guest's modprobe) and checks what the chart's init container and the
// unprivileged speaker do: PrepareNode loads ip_vs by asking for its
// generic netlink family and sets net.ipv4.vs.conntrack=1 and
// expire_nodest_conn=1; New then needs no write to a read-only /proc/sys
// (as in an unprivileged container), refuses with a message naming
// prepare-node when conntrack is 0, and serves, saying so
// (StaleFlowsProblem), when expire_nodest_conn is 0.
func TestKernelPrepareNode(t *testing.T) {
	if !vm.InVM() {
		var boot []string
		for _, m := range vm.DefaultModules {
			if !strings.HasPrefix(m, "ip_vs") {
				boot = append(boot, m)
			}
		}
		vm.RunTest(t, vm.Options{Timeout: 3 * time.Minute, Modules: boot, OnDemandModules: []string{"ip_vs", "ipip", "sit", "ip6_tunnel"}})
		return
	}
	if _, err := os.Stat("/sys/module/ip_vs"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("ip_vs is loaded before the test (stat: %v); the test needs a VM without it", err)
	}
	if _, err := os.Stat(ipvsConntrack); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("%s exists before ip_vs is loaded: %v", ipvsConntrack, err)
	}
	if err := enableIPVSConntrack(); err == nil || !strings.Contains(err.Error(), "ip_vs module is not loaded") {
		t.Errorf("enableIPVSConntrack without ip_vs: %v, want an error saying ip_vs is not loaded", err)
	}

	if err := PrepareNode(); err != nil {
		t.Fatalf("PrepareNode: %v", err)
	}
	if _, err := os.Stat("/sys/module/ip_vs"); err != nil {
		t.Errorf("ip_vs not loaded after PrepareNode: %v", err)
	}
	wantConntrack(t, "1")
	if v, err := os.ReadFile("/proc/sys/" + ipvsExpireNodest); err != nil || strings.TrimSpace(string(v)) != "1" {
		t.Errorf("%s after PrepareNode: %q (%v), want 1", ipvsExpireNodest, v, err)
	}
	if err := PrepareNode(); err != nil {
		t.Errorf("PrepareNode on a prepared node: %v", err)
	}

	t.Run("read-only /proc/sys, sysctl set", func(t *testing.T) {
		readOnlyProcSys(t)
		d, err := New(Options{LinkName: "vipcast-p"})
		if err != nil {
			t.Fatalf("New on a prepared node with /proc/sys read-only: %v", err)
		}
		if p := d.StaleFlowsProblem(); p != nil {
			t.Errorf("StaleFlowsProblem() on a prepared node: %v, want nil", p)
		}
		d.Close()
	})
	t.Run("read-only /proc/sys, expire_nodest_conn 0", func(t *testing.T) {
		sysctl(t, ipvsExpireNodest, "0")
		t.Cleanup(func() { sysctl(t, ipvsExpireNodest, "1") })
		readOnlyProcSys(t)
		d, err := New(Options{LinkName: "vipcast-p"})
		if err != nil {
			t.Fatalf("New with expire_nodest_conn=0: %v, want it to serve and say so", err)
		}
		defer d.Close()
		p := d.StaleFlowsProblem()
		for _, w := range []string{"net.ipv4.vs.expire_nodest_conn", "vipcast-speaker " + PrepareNodeCommand} {
			if p == nil || !strings.Contains(p.Error(), w) {
				t.Errorf("StaleFlowsProblem() = %v, want one that says %q", p, w)
			}
		}
	})
	t.Run("read-only /proc/sys, sysctl 0", func(t *testing.T) {
		sysctl(t, "net/ipv4/vs/conntrack", "0")
		t.Cleanup(func() { sysctl(t, "net/ipv4/vs/conntrack", "1") })
		readOnlyProcSys(t)
		d, err := New(Options{LinkName: "vipcast-p"})
		if err == nil {
			d.Close()
			t.Fatal("New with net.ipv4.vs.conntrack=0 and /proc/sys read-only succeeded; want a refusal")
		}
		t.Logf("New: %v", err)
		for _, w := range []string{"net.ipv4.vs.conntrack", "vipcast-speaker " + PrepareNodeCommand, "privileged init container", "read-only file system"} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error does not say %q: %v", w, err)
			}
		}
		wantConntrack(t, "0")
	})
	t.Run("prepare-node --tunnel, then read-only /proc/sys", func(t *testing.T) {
		if _, err := os.Stat("/sys/module/ipip"); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("ipip is loaded before PrepareTunnel (stat: %v)", err)
		}
		no6, err := PrepareTunnel()
		if err != nil {
			t.Fatalf("PrepareTunnel: %v", err)
		}
		if no6 != nil {
			t.Errorf("PrepareTunnel says IPv6 VIPs keep one tier (%v), want sit0 readied", no6)
		}
		if _, err := os.Stat("/sys/class/net/" + Tunnel6Link); err != nil {
			t.Errorf("no %s after PrepareTunnel (sit loaded by the kernel on request): %v", Tunnel6Link, err)
		}
		if _, err := os.Stat("/sys/class/net/" + TunnelLink); err != nil {
			t.Errorf("no %s after PrepareTunnel (ipip loaded by the kernel on request): %v", TunnelLink, err)
		}
		if _, err := os.Stat("/sys/module/ip6_tunnel"); err != nil {
			t.Errorf("ip6_tunnel not loaded after PrepareTunnel (for IPv6 tunnel addresses): %v", err)
		}
		readOnlyProcSys(t)
		// With an IPv6 tunnel address too: the unprivileged speaker's part
		// (its ip6tnl link, address and routes) needs no sysctl write.
		d, err := New(Options{LinkName: "vipcast-p", Tunnel: &Tunnel{Self: netip.MustParseAddr("10.52.0.1"), Self6: netip.MustParseAddr("fd00:52::1")}})
		if err != nil {
			t.Fatalf("New with Tunnel on a node prepared with --tunnel, /proc/sys read-only: %v", err)
		}
		if on, why := d.TwoTierIPv6(); !on {
			t.Errorf("TwoTierIPv6() = false (%v) with an IPv6 tunnel address on a prepared node, want true", why)
		}
		d.Close()
		// A node the speaker gives no IPv6 tunnel address (OneTier6):
		// IPv6 VIPs keep one tier, saying why.
		d, err = New(Options{LinkName: "vipcast-p", Tunnel: &Tunnel{Self: netip.MustParseAddr("10.52.0.1"), OneTier6: "no IPv6 InternalIP"}})
		if err != nil {
			t.Fatalf("New with OneTier6: %v", err)
		}
		if on, why := d.TwoTierIPv6(); on || why == nil || why.Error() != "no IPv6 InternalIP" {
			t.Errorf("TwoTierIPv6() = %v, %v with OneTier6, want false and its reason", on, why)
		}
		d.Close()
	})
	t.Run("unprivileged prepare-node", func(t *testing.T) {
		sysctl(t, "net/ipv4/vs/conntrack", "0")
		t.Cleanup(func() { sysctl(t, "net/ipv4/vs/conntrack", "1") })
		readOnlyProcSys(t)
		err := PrepareNode()
		if err == nil || !strings.Contains(err.Error(), "must run privileged") {
			t.Errorf("PrepareNode with /proc/sys read-only: %v, want an error saying it must run privileged", err)
		}
	})
}

func wantConntrack(t *testing.T, want string) {
	t.Helper()
	v, err := os.ReadFile(ipvsConntrack)
	if err != nil || strings.TrimSpace(string(v)) != want {
		t.Errorf("net.ipv4.vs.conntrack = %q (%v), want %s", v, err, want)
	}
}

// readOnlyProcSys bind-mounts /proc/sys read-only over itself until the test
// ends, as container runtimes do in unprivileged containers.
func readOnlyProcSys(t *testing.T) {
	t.Helper()
	if err := unix.Mount("/proc/sys", "/proc/sys", "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		t.Fatalf("bind /proc/sys: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount("/proc/sys", 0); err != nil {
			t.Errorf("unmount /proc/sys: %v", err)
		}
	})
	if err := unix.Mount("", "/proc/sys", "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
		t.Fatalf("remount /proc/sys read-only: %v", err)
	}
	if err := os.WriteFile(ipvsConntrack, []byte("1"), 0o644); !errors.Is(err, unix.EROFS) {
		t.Fatalf("write to the read-only /proc/sys: %v, want EROFS", err)
	}
}

// TestKernelInClusterOff boots a VM without nft_numgen and nft_hash (the
// guest cannot load them on demand), where the in-cluster map's chains
// cannot be made: New serves without the map, saying so
// (InClusterProblem), and a virtual server with in-cluster endpoints is
// programmed, without them.
func TestKernelInClusterOff(t *testing.T) {
	if !vm.InVM() {
		optional := slices.DeleteFunc(slices.Clone(vm.OptionalModules), func(m string) bool { return m == "nft_numgen" || m == "nft_hash" })
		vm.RunTest(t, vm.Options{Timeout: 2 * time.Minute, OptionalModules: optional})
		return
	}
	d, err := New(Options{LinkName: "vipcast-p"})
	if err != nil {
		t.Fatalf("New on a kernel without nft_numgen: %v, want a Dataplane that serves without the in-cluster map", err)
	}
	defer d.Close()
	if p := d.InClusterProblem(); p == nil || !strings.Contains(p.Error(), "nft_numgen") {
		t.Errorf("InClusterProblem() = %v, want one naming nft_numgen", p)
	}
	ep := Backend{Addr: ip("10.61.1.2"), Port: 8080, Weight: 1}
	svc := Service{VIP: ip("192.0.2.90"), Port: 80, Protocol: TCP, Backends: []Backend{ep}, Cluster: []Backend{ep}}
	if _, err := d.Sync(state(svc)); err != nil {
		t.Fatalf("Sync of a virtual server with in-cluster endpoints: %v, want it programmed without them", err)
	}
	st, err := d.Read()
	if got, ok := st.Services[svc.Key()]; err != nil || !ok || len(got.Backends) != 1 {
		t.Errorf("virtual server after Sync: %+v (%v), want it with its real server", got, err)
	}
	if m, err := d.ReadInCluster(); err != nil || len(m) != 0 {
		t.Errorf("ReadInCluster: %v (%v), want nothing", m, err)
	}
	if _, err := d.Sync(NewState()); err != nil {
		t.Errorf("Sync to nothing: %v", err)
	}
}
