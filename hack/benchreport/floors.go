package main

// floorPair is a metric of a benchmark and its floor: the same work done
// by the bare tool, or the path without vipcast, measured in the same
// run. The page gives value, floor and value/floor.
//
// A unit may hold {N}, which stands for a number (BenchmarkScale reports
// one metric per number of nodes, such as watch-B/s/node-N10): the pair
// then holds for every number the benchmark reported.
type floorPair struct {
	bench string // the benchmark, such as BenchmarkCCMAllocation
	sub   string // its sub-benchmark, "" for the benchmark itself
	what  string // what value measures, for the summary
	value string // the unit of the metric measured
	floor string // the unit of its floor
}

// floorPairs are the benchmarks' floors, in the page's order.
func floorPairs() []floorPair {
	return []floorPair{
		{bench: "BenchmarkCCMAllocation", what: "every Service has its VIP; floor: client-go writes the status", value: "s-total", floor: "s-floor"},
		{bench: "BenchmarkAnnounce10k", what: "Apply returns; floor: bare gobgp AddPath calls", value: "apply-s", floor: "bare-addpath-s"},
		{bench: "BenchmarkAnnounce10k", what: "FRR holds every route; floor: bare gobgp AddPath", value: "announce-s", floor: "bare-announce-s"},
		{bench: "BenchmarkAnnounce10k", what: "FRR holds none after the withdrawal; floor: bare gobgp DeletePath", value: "withdraw-s", floor: "bare-withdraw-s"},
		{bench: "BenchmarkSpeakerAnnounce", what: "node eligible → FRR holds every VIP; floor: bare gobgp AddPath", value: "s-announce", floor: "s-floor"},
		{bench: "BenchmarkSpeakerAnnounce", what: "node excluded → FRR holds none; floor: bare gobgp DeletePath", value: "s-withdraw", floor: "s-floor-withdraw"},
		{bench: "BenchmarkScale", what: "watch bytes a second per node, N={N}; floor: kube-proxy's", value: "watch-B/s/node-N{N}", floor: "kube-proxy-B/s/node-N{N}"},
		{bench: "BenchmarkKernelDataplane", what: "Sync from empty; floor: bare moby/ipvs and netlink loops", value: "sync-s", floor: "floor-s"},
		{bench: "BenchmarkKernelDataplane", what: "new connections a second through a VIP; floor: straight to a backend", value: "vip-conn/s", floor: "direct-conn/s"},
		{bench: "BenchmarkTwoTier", what: "new connections a second, one tier; floor: the pod's own address", value: "onetier-conn/s", floor: "direct-conn/s"},
		{bench: "BenchmarkTwoTier", what: "new connections a second, two tiers; floor: the pod's own address", value: "twotier-conn/s", floor: "direct-conn/s"},
		{bench: "BenchmarkTwoTier", what: "new connections a second, two tiers with connection sync; floor: the pod's own address", value: "twotiersync-conn/s", floor: "direct-conn/s"},
		{bench: "BenchmarkTwoTier", what: "new connections a second to an IPv6 VIP, two tiers (6in4); floor: the pod's own IPv6 address", value: "twotier6-conn/s", floor: "direct6-conn/s"},
		{bench: "BenchmarkTwoTier", what: "new connections a second to an IPv6 VIP, two tiers (ip6ip6, sync); floor: the pod's own IPv6 address", value: "ip6ip6-conn/s", floor: "direct6-conn/s"},
		{bench: "BenchmarkTwoTier", what: "median round trip, one tier; floor: the pod's own address", value: "onetier-rtt-us", floor: "direct-rtt-us"},
		{bench: "BenchmarkTwoTier", what: "median round trip, two tiers; floor: the pod's own address", value: "twotier-rtt-us", floor: "direct-rtt-us"},
		{bench: "BenchmarkTwoTier", what: "median round trip, two tiers with connection sync; floor: the pod's own address", value: "twotiersync-rtt-us", floor: "direct-rtt-us"},
		{bench: "BenchmarkTwoTier", what: "median round trip to an IPv6 VIP, two tiers (6in4); floor: the pod's own IPv6 address", value: "twotier6-rtt-us", floor: "direct6-rtt-us"},
		{bench: "BenchmarkTwoTier", what: "median round trip to an IPv6 VIP, two tiers (ip6ip6, sync); floor: the pod's own IPv6 address", value: "ip6ip6-rtt-us", floor: "direct6-rtt-us"},
	}
}
