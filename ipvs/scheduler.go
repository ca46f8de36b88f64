package ipvs

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// SchedulerAnnotation is the Service annotation that picks the IPVS
// scheduler of its virtual servers.
const SchedulerAnnotation = "vipcast.io/scheduler"

// DefaultScheduler is Maglev hashing ("mh") with DefaultSchedulerFlags.
//
// Why mh: the fabric spreads a VIP's packets over the announcing nodes with
// ECMP, and ECMP moves flows from one node to another whenever the set of
// next hops changes (a node starts or stops announcing, a link flaps). A
// node that receives the middle of a flow it has never seen has no IPVS
// connection entry for it and must schedule it afresh: with rr or wlc it
// picks whatever real server comes next, which is not the one the flow was
// talking to, and the connection is reset. Maglev hashing picks the real
// server from a hash of the packet's addresses and ports over a lookup
// table that depends only on the set of real servers, so every node picks
// the same real server for the same flow, and a change of real servers
// moves only a minimal share of flows. FlagMHPort hashes the source port
// too (otherwise all connections of one client would land on one real
// server); FlagMHFallback sends a flow whose hashed real server is
// unavailable (weight 0: draining) to another one instead of dropping it.
const DefaultScheduler = "mh"

// DefaultSchedulerFlags are the flags of DefaultScheduler: hash the source
// port, fall back when the hashed real server is unavailable.
const DefaultSchedulerFlags = FlagMHPort | FlagMHFallback

// Schedulers returns the IPVS schedulers of the Linux kernel
// (net/netfilter/ipvs, ip_vs_<name>.ko): round robin, weighted round robin,
// least connection, weighted least connection, locality-based least
// connection (with replication), destination hashing, source hashing,
// shortest expected delay, never queue, weighted failover, weighted
// overflow, Maglev hashing, weighted random twos choice.
func Schedulers() []string {
	return []string{"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "fo", "ovf", "mh", "twos"}
}

// ValidScheduler reports an error unless name is an IPVS scheduler of the
// kernel. The error names the annotation, the value and the allowed values.
func ValidScheduler(name string) error {
	all := Schedulers()
	if slices.Contains(all, name) {
		return nil
	}
	return fmt.Errorf("annotation %s: unknown IPVS scheduler %q (allowed: %s)",
		SchedulerAnnotation, name, strings.Join(all, ", "))
}

// ParseScheduler turns the value of the vipcast.io/scheduler annotation into
// a scheduler name and its flags: "" gives the default (mh with port hashing
// and fallback); "mh" gets the same flags; other schedulers get none.
// Surrounding spaces are ignored, case is not.
func ParseScheduler(value string) (name string, flags uint32, err error) {
	value = strings.TrimSpace(value)
	if value == "" {
		return DefaultScheduler, DefaultSchedulerFlags, nil
	}
	if err := ValidScheduler(value); err != nil {
		return "", 0, err
	}
	if value == "mh" {
		return value, DefaultSchedulerFlags, nil
	}
	return value, 0, nil
}

// ErrSchedulerUnavailable is wrapped by the error of a virtual server the
// kernel refused because it does not have its scheduler: the module
// ip_vs_<name> is not loaded and the kernel could not load it (no module
// for this kernel, or no modprobe, as in a container without the host's
// modules). The kernel says so with ENOENT, which adding or updating a
// virtual server returns for nothing else vipcast sets.
var ErrSchedulerUnavailable = errors.New("IPVS scheduler not available in this kernel")

// schedulerError classifies the error of adding or updating the virtual
// server s: ENOENT means the kernel lacks its scheduler.
func schedulerError(s Service, err error) error {
	if !errors.Is(err, unix.ENOENT) {
		return err
	}
	name := s.Scheduler
	if name == "" {
		name = DefaultScheduler
	}
	return fmt.Errorf("%w: %q (kernel module ip_vs_%s not loaded and not loadable): %w", ErrSchedulerUnavailable, name, name, err)
}
