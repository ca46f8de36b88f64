// Package speaker holds the routing decisions of vipcast-speaker as pure
// functions: given the API objects the speaker watches (this node, the
// IPPools and BGPPeers, one Service and its EndpointSlices) they compute the
// BGP sessions this node opens and the routes it announces. Nothing here
// talks to the API server, the kernel or a BGP engine; the informer wiring
// calls these functions and hands the results to package bgp.
//
// The work is split so that an event costs work for the object it is about:
//
//   - NodeFrom and Compile turn this node, the IPPools and the BGPPeers into
//     a View, once per change of any of them (pools are parsed, selectors
//     evaluated and BGP attributes decoded there, not per Service).
//   - PeersForNode turns the BGPPeers into the sessions of this node.
//   - ServiceRoutes computes the routes of one Service against a View; it
//     looks at that Service and its EndpointSlices only.
//   - RouteTable merges the per-Service routes into the distinct prefixes
//     this node announces and returns the minimal announce/withdraw
//     difference for one Service's change.
package speaker
