package ipvs

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
)

// dumpAttempts bounds how often dump asks the kernel for one list.
const dumpAttempts = 5

// dump returns the list a netlink dump (list) reads, such as a link's
// addresses, a table's routes or the routing rules. The kernel marks a dump
// NLM_F_DUMP_INTR when the state it lists changes while it answers (an
// address, route or link of the namespace comes or goes: DHCP, the kubelet,
// the CNI); netlink then returns what it read, which may miss entries or
// hold stale ones, with netlink.ErrDumpInterrupted. dump throws such an
// answer away and asks again, up to dumpAttempts times, and returns the
// first complete one. Every netlink dump of this package goes through it.
//
// what names the list in errors ("addresses of vipcast0"): every error is
// wrapped with it, and when every attempt is interrupted the error says the
// list kept changing and still matches netlink.ErrDumpInterrupted.
func dump[T any](what string, list func() ([]T, error)) ([]T, error) {
	for attempt := 1; ; attempt++ {
		got, err := list()
		switch {
		case err == nil:
			return got, nil
		case !errors.Is(err, netlink.ErrDumpInterrupted):
			return nil, fmt.Errorf("%s: %w", what, err)
		case attempt == dumpAttempts:
			return nil, fmt.Errorf("%s: kept changing during each of %d dumps: %w", what, dumpAttempts, err)
		}
	}
}
