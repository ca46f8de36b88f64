// Package poolspec owns pool admission, the one rule that says which
// IPPools are usable, which pool owns each address and why a pool is
// refused. vipcast-ccm allocates VIPs from the pools it admits and
// vipcast-speaker announces them; both call Admit, so the two binaries
// cannot disagree about which pool a VIP belongs to.
//
// The rule (Admit): pools are taken oldest first (v1alpha1.OlderFirst:
// creationTimestamp, then name). A pool is refused, for the first of
// these that applies, when its spec.addresses do not parse, when its
// spec.allocation selectors do not parse, when its spec.bgp cannot be
// announced (an aggregation length whose prefix covers addresses outside
// the pool, a community that does not decode, a selector that does not
// parse), or when it overlaps an older admitted pool (the allocator's own
// rule, ipam.Allocator.SetPools). A refused pool owns no address; every
// address of an admitted pool is owned by that pool alone.
//
// Admit also decodes what both binaries need from an admitted pool: the
// allocator's ipam.Pool, the parsed ranges and the decoded spec.bgp.
// What depends on the node a speaker runs on (whether spec.bgp.nodeSelector
// selects it, which of its BGPPeers spec.bgp.peerSelector selects) is left
// to the speaker. Pure logic: no Kubernetes client.
package poolspec
