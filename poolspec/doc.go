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
// A pool being deleted (its IPPool has a deletionTimestamp; the CCM's
// finalizer, Finalizer, keeps it while Services hold its addresses) is
// admitted like any other, so it still owns its addresses, but is closed
// to new allocations (ipam.Pool.Terminating).
//
// The holding rule (Admission.Holder) says which pool holds a VIP already
// published in a Service's status: the admitted pool that owns it; else
// the pool the Service's vipcast.io/pool annotation names, if it exists
// (a pool narrowed, or refused, since it handed out the VIP); else the
// oldest refused pool whose addresses contain it. A held VIP stays
// published (the CCM never renumbers it) and announced (every speaker,
// as a host route with what still decodes of the holding pool's spec.bgp,
// Admission.HeldBGP) until its Service lets it go; new VIPs come only from
// admitted pools' spec.addresses. A pool's holders (Admission.Holdings)
// are what its status reports and what its deletion waits for.
//
// Admit also decodes what both binaries need from an admitted pool: the
// allocator's ipam.Pool, the parsed ranges and the decoded spec.bgp.
// What depends on the node a speaker runs on (whether spec.bgp.nodeSelector
// selects it, which of its BGPPeers spec.bgp.peerSelector selects) is left
// to the speaker. Pure logic: no Kubernetes client.
package poolspec
