package ipvs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
)

// PrepareNodeCommand is the vipcast-speaker subcommand that runs
// PrepareNode, named in the errors of a speaker that finds the node
// unprepared.
const PrepareNodeCommand = "prepare-node"

// ipvsConntrack is the sysctl that makes IPVS keep conntrack entries (see
// snat.go); it exists once the ip_vs module is loaded.
const ipvsConntrack = "/proc/sys/net/ipv4/vs/conntrack"

// ipvsExpireNodest is the sysctl that makes IPVS expire a connection whose
// real server was deleted, at its next packet (and, since Linux 5.9, all
// of them one jiffy after the deletion), so that the packet is scheduled
// afresh: a UDP or SCTP flow whose pod went away reaches another pod at
// once instead of being dropped until its entry times out (300 s for
// UDP). kube-proxy's IPVS mode sets it too.
const ipvsExpireNodest = "net/ipv4/vs/expire_nodest_conn"

// PrepareNode readies this node's kernel for a speaker that runs without
// privilege: it makes sure the ip_vs module is loaded, so that the sysctls
// net.ipv4.vs.conntrack and expire_nodest_conn exist, and sets them to 1. It needs write
// access to /proc/sys, which container runtimes grant to privileged
// containers only: it is the work of the chart's short privileged init
// container (vipcast-speaker prepare-node), and the long-running speaker
// then finds the sysctl already set.
func PrepareNode() error {
	if err := loadIPVS(); err != nil {
		return err
	}
	for _, set := range []func() error{enableIPVSConntrack, enableExpireNodest} {
		if err := set(); err != nil {
			return fmt.Errorf("%w (prepare-node must run privileged, or as root outside a container: /proc/sys is read-only otherwise)", err)
		}
	}
	return nil
}

// enableExpireNodest sets net.ipv4.vs.expire_nodest_conn=1 unless it
// already is (see ipvsExpireNodest).
func enableExpireNodest() error { return setSysctl(ipvsExpireNodest, "1") }

// loadIPVS asks the kernel for the IPVS generic netlink family. When ip_vs
// is not loaded the kernel loads it itself on this request (request_module
// of the alias net-pf-16-proto-16-family-IPVS, run by the host's
// modprobe), so neither a modprobe binary nor /lib/modules is needed in the
// container.
func loadIPVS() error {
	if _, err := netlink.GenlFamilyGet("IPVS"); err != nil {
		return fmt.Errorf("IPVS generic netlink family (module ip_vs): %w; the kernel loads ip_vs on this request unless module autoloading is off or the kernel lacks IPVS: then load ip_vs at boot (/etc/modules-load.d)", err)
	}
	return nil
}

// enableIPVSConntrack sets net.ipv4.vs.conntrack=1 unless it already is:
// a speaker on a prepared node (PrepareNode, or the node's sysctl.d) needs
// no write access to /proc/sys, which the kubelet mounts read-only in
// unprivileged containers. The callers add what to do when it fails.
func enableIPVSConntrack() error {
	return setSysctl(strings.TrimPrefix(ipvsConntrack, "/proc/sys/"), "1")
}

// setSysctl sets the sysctl name (its path under /proc/sys, e.g.
// net/ipv4/vs/conntrack) to value unless it already has it, so that a
// prepared node needs no write access to /proc/sys.
func setSysctl(name, value string) error {
	path := "/proc/sys/" + name
	dotted := strings.ReplaceAll(name, "/", ".")
	v, err := os.ReadFile(path) //nolint:gosec // G304: a sysctl this package names
	switch {
	case err == nil && strings.TrimSpace(string(v)) == value:
		return nil
	case errors.Is(err, fs.ErrNotExist) && strings.HasPrefix(name, "net/ipv4/vs/"):
		return fmt.Errorf("sysctl %s does not exist: the ip_vs module is not loaded: %w", dotted, err)
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("sysctl %s does not exist: %w", dotted, err)
	}
	// The mode only applies to a file WriteFile creates; sysctls exist.
	if err := os.WriteFile(path, []byte(value), 0o644); err != nil { //nolint:gosec // G306: see above
		return fmt.Errorf("setting sysctl %s=%s: %w", dotted, value, err)
	}
	return nil
}

// readSysctlInt reads the integer sysctl name (its path under /proc/sys).
func readSysctlInt(name string) (int, error) {
	v, err := os.ReadFile("/proc/sys/" + name) //nolint:gosec // G304: a sysctl this package names
	if err != nil {
		return 0, fmt.Errorf("sysctl %s: %w", strings.ReplaceAll(name, "/", "."), err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(v)))
	if err != nil {
		return 0, fmt.Errorf("sysctl %s: %w", strings.ReplaceAll(name, "/", "."), err)
	}
	return n, nil
}

// exemptFromRPFilter turns reverse-path filtering off on links and leaves
// every other interface's effective setting as it was.
//
// The loop's packets come from a local address and tunl0's from clients
// the node reaches through the fabric, and neither link has an address:
// the kernel's reverse-path check rejects them in strict mode and, on a
// link without address, in loose mode too. A link's effective setting is
// the larger of its own and net.ipv4.conf.all's, so links can only be
// exempt with "all" at 0 (Cilium sets it to 0 as well). When "all" is
// not 0, every interface (and "default", for those to come) whose own
// setting is lower is first raised to it, so that none is filtered less
// than before.
func exemptFromRPFilter(links ...string) error {
	const conf = "net/ipv4/conf/"
	all, err := readSysctlInt(conf + "all/rp_filter")
	if err != nil {
		return err
	}
	if all != 0 {
		dirs, err := os.ReadDir("/proc/sys/" + conf)
		if err != nil {
			return fmt.Errorf("list %s: %w", conf, err)
		}
		for _, d := range dirs {
			name := d.Name()
			if name == "all" || slices.Contains(links, name) {
				continue
			}
			v, err := readSysctlInt(conf + name + "/rp_filter")
			if err != nil {
				continue // an interface gone meanwhile
			}
			if v < all {
				if err := setSysctl(conf+name+"/rp_filter", strconv.Itoa(all)); err != nil {
					return err
				}
			}
		}
		if err := setSysctl(conf+"all/rp_filter", "0"); err != nil {
			return err
		}
	}
	for _, l := range links {
		if err := setSysctl(conf+l+"/rp_filter", "0"); err != nil {
			return err
		}
	}
	return nil
}
