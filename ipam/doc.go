// Package ipam allocates LoadBalancer VIPs from IP pools.
//
// It is a pure library: it knows nothing about the Kubernetes API beyond
// label selectors. The controller translates Services into Requests and IP
// pool objects into Pools, and an Allocator keeps track of which owner holds
// which address.
//
// Cost model: every pool range is an index space [0, n) addressed with
// 128-bit arithmetic. The allocated indexes of a range are kept as merged
// runs in a B-tree, so the lowest free address is found from the first run
// and a release splits at most one run, both in O(log runs). Per-address
// state (holders, sharing) lives in a map keyed by address. Memory is
// therefore proportional to the addresses in use, never to the size of a
// pool: an IPv6 /48 costs no more than an IPv4 /24 with the same number of
// Services. With avoidBuggyIPs an IPv4 range uses a closed-form bijection
// that skips the .0 and .255 addresses, so they never fragment the runs.
//
// Allocation is deterministic: the lowest free address of the first eligible
// pool (pools ordered by Priority, then Name; ranges in the order given) is
// handed out, unless the Service can share an address under its sharing key.
package ipam
