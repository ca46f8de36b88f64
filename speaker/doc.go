// Package speaker is vipcast-speaker's reconciler. Its decisions are pure
// functions: given the API objects the speaker watches (this node, the
// IPPools and BGPPeers, one Service and its EndpointSlices) they compute the
// BGP sessions this node opens, the routes it announces and the IPVS
// virtual servers it programs. The Controller (informers, one workqueue)
// calls them and hands the results to package bgp and, through the
// Dataplane interface, to package ipvs.
//
// The work is split so that an event costs work for the object it is about:
//
//   - NodeFrom and Compile turn this node, the IPPools and the BGPPeers into
//     a View, once per change of any of them (pools are parsed, selectors
//     evaluated and BGP attributes decoded there, not per Service).
//   - PeersForNode turns the BGPPeers into the sessions of this node.
//   - ServiceRoutes computes the routes of one Service against a View; it
//     looks at that Service and its EndpointSlices only.
//   - ServiceDataplane computes the virtual servers of one Service, also
//     against a View.
//   - RouteTable merges the per-Service routes into the distinct prefixes
//     this node announces and returns the minimal announce/withdraw
//     difference for one Service's change.
//
// The Controller is split by concern, one file each: informers.go (the
// informers, decoding, the cache reads), sync.go (the sync steps: view →
// dataplane → routes → sessions, and one Service's sync), announcer.go
// (what BGP has been told, repaired after a failed Apply), program.go (what
// the dataplane has been told), report.go (Events and problem logs, once
// per change) and service.go (the reading of a Service and its
// EndpointSlices that the routes and the dataplane share). dataplaneapi.go
// declares all the speaker asks of the dataplane, the two-tier and
// connection-sync queries included.
package speaker
