// Package nodeapi is the small HTTP interface between the lab (on the
// host) and a lab node (test/lab/node or test/lab/kubenode, inside its VM),
// and the node side's shared parts.
package nodeapi

// Port is the control server's port on the node's address.
const Port = "9000"

// BackendPort is the port every pod's HTTP server listens on.
const BackendPort = 8080

// State is what GET /state returns: the node's IPVS table and the VIPs on
// vipcast's dummy link, read with vipcast's own ipvs package (the
// `ipvsadm -Ln` of the lab), its nftables tables ("family name") and its
// network links.
type State struct {
	Services []Service `json:"services"`
	VIPs     []string  `json:"vips"`
	Tables   []string  `json:"tables"`
	Links    []string  `json:"links"`
	// SyncDaemons are the IPVS sync daemons running, as
	// ipvs.SyncDaemon.String gives them ("master on eth0, sync ID 96").
	SyncDaemons []string `json:"syncDaemons"`
	// GuardDrops is the sum of the packet counters of the drop rules of
	// vipcast's tunnel guard (chain tunnel-guard of table ip vipcast: the
	// rules that look the source up in the set of tunnel sources), -1
	// when the chain has none. Read through netlink: Debian bookworm's nft
	// prints nothing for vipcast's tables.
	GuardDrops int64 `json:"guardDrops"`
}

// Service is one IPVS virtual server.
type Service struct {
	// Key is VIP:port/protocol.
	Key       string `json:"key"`
	Scheduler string `json:"scheduler"`
	// Backends are "address:port wWEIGHT", sorted.
	Backends []string `json:"backends"`
}
