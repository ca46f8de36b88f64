// Package nodereport turns the API objects into the answers of the
// kubectl-vipcast plugin: for a Service, which node announces its VIPs
// and why the others do not — computed node by node with the speaker's
// own rules (speaker.Compile, speaker.ServiceRoutes), with what only a
// node knows (its sessions, its kernel's refusals) from its
// SpeakerStatus; for the cluster, the matrix of BGP sessions, nodes by
// peers. It is pure: the plugin reads the objects and prints the rows.
package nodereport

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/lbclass"
	"github.com/vipcast/vipcast/speaker"
)

// NodeAnswer is one node's answer for one Service.
type NodeAnswer struct {
	// Node is the node's name.
	Node string
	// Announced are the prefixes the node announces for the Service's
	// VIPs.
	Announced []string
	// NextHops are the node's addresses the routers forward the VIPs to
	// (its InternalIP of each announced VIP's family, else ExternalIP).
	NextHops []string
	// Why says why the node announces no route for some VIP, or why what
	// it announces reaches no router; "" when it announces them all.
	Why string
}

// Objects are what the answers are computed from, as the API server has
// them: the Service, its EndpointSlices, every IPPool, BGPPeer and Node,
// and the SpeakerStatuses.
type Objects struct {
	Service  *v1.Service
	Slices   []*discoveryv1.EndpointSlice
	Pools    []*vipcastv1alpha1.IPPool
	Peers    []*vipcastv1alpha1.BGPPeer
	Nodes    []v1.Node
	Statuses []vipcastv1alpha1.SpeakerStatus
}

// Why answers, node by node (sorted by name), whether each node announces
// the Service's VIPs and why not: what the node's speaker decides from
// these objects (speaker.ServiceRoutes over the node's speaker.Compile),
// unless its SpeakerStatus says the speaker stopped or its kernel refused
// the Service; a node without a SpeakerStatus runs no speaker.
func Why(o Objects) []NodeAnswer {
	key := speaker.ServiceKey(o.Service)
	byName := make(map[string]*vipcastv1alpha1.SpeakerStatus, len(o.Statuses))
	for i := range o.Statuses {
		byName[o.Statuses[i].Name] = &o.Statuses[i]
	}
	out := make([]NodeAnswer, 0, len(o.Nodes))
	for i := range o.Nodes {
		node := &o.Nodes[i]
		a := NodeAnswer{Node: node.Name}
		st := byName[node.Name]
		var refused string
		if st != nil {
			refused = refusal(&st.Status, key)
		}
		switch {
		case st == nil:
			a.Why = "no SpeakerStatus: no vipcast-speaker has run on this node"
		case stopped(&st.Status):
			a.Why = speaker.StoppedReason
		case refused != "":
			a.Why = "dataplane refused it: " + refused
		default:
			a = decide(o, node, &st.Status)
		}
		out = append(out, a)
	}
	slices.SortFunc(out, func(a, b NodeAnswer) int { return cmp.Compare(a.Node, b.Node) })
	return out
}

// decide is the node's speaker's decision for the Service, and whether
// its routes reach a router.
func decide(o Objects, node *v1.Node, st *vipcastv1alpha1.SpeakerStatusStatus) NodeAnswer {
	n, _ := speaker.NodeFrom(node) // a bad local-ASN annotation changes no route
	view, _ := speaker.Compile(o.Pools, o.Peers, n)
	view.Classes = classes(st)
	routes, why := speaker.ServiceRoutes(o.Service, o.Slices, view)
	a := NodeAnswer{Node: node.Name, Why: why}
	for _, r := range routes {
		a.Announced = append(a.Announced, r.Prefix.String())
		if hop := r.NextHop.String(); !slices.Contains(a.NextHops, hop) {
			a.NextHops = append(a.NextHops, hop)
		}
	}
	var reach string
	switch {
	case len(routes) == 0:
	case st.SessionsConfigured == 0:
		reach = "announced to no router: no BGPPeer gives this node a session"
	case st.SessionsEstablished == 0:
		reach = fmt.Sprintf("announced to no router: none of its %d BGP sessions is Established (kubectl vipcast peers)", st.SessionsConfigured)
	case int(st.RefusedCount) > len(st.Refused):
		reach = fmt.Sprintf("announced unless the node's kernel refused it: it refused %d Services, its SpeakerStatus names %d (see the Service's DataplaneRefused Events)",
			st.RefusedCount, len(st.Refused))
	}
	if reach != "" {
		a.Why = strings.Join(slices.DeleteFunc([]string{why, reach}, func(s string) bool { return s == "" }), "; ")
	}
	return a
}

// classes is the Services the node's speaker serves, as its status says;
// a status that says none (written by a speaker older than the field)
// stands for the default, the class-less Services.
func classes(st *vipcastv1alpha1.SpeakerStatusStatus) lbclass.Selector {
	s := lbclass.Selector{Class: st.LoadBalancerClass, NoClassless: !st.ServesClassless}
	if s.Validate() != nil {
		return lbclass.Selector{}
	}
	return s
}

// stopped reports whether st is the status a speaker writes when it stops.
func stopped(st *vipcastv1alpha1.SpeakerStatusStatus) bool {
	return st.SessionsEstablished == 0 && len(st.Sessions) > 0 && st.Sessions[0].LastError == speaker.StoppedReason
}

// refusal returns why the node's kernel refused the Service key, if the
// status lists it.
func refusal(st *vipcastv1alpha1.SpeakerStatusStatus, key string) string {
	for _, r := range st.Refused {
		if r.Service == key {
			return r.Message
		}
	}
	return ""
}

// PrintWhy writes answers as a table: node, announced prefixes, next hops,
// why not.
func PrintWhy(w io.Writer, svc *v1.Service, answers []NodeAnswer) error {
	vips := make([]string, 0, len(svc.Status.LoadBalancer.Ingress))
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		vips = append(vips, ing.IP)
	}
	policy := string(svc.Spec.ExternalTrafficPolicy)
	if policy == "" {
		policy = string(v1.ServiceExternalTrafficPolicyCluster)
	}
	tw := &table{w: tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)}
	tw.row(fmt.Sprintf("Service %s/%s: VIPs %s, externalTrafficPolicy %s", svc.Namespace, svc.Name, orDash(strings.Join(vips, ", ")), policy))
	tw.row("NODE", "ANNOUNCED", "NEXT HOP", "WHY NOT")
	for _, a := range answers {
		tw.row(a.Node, orDash(strings.Join(a.Announced, ",")), orDash(strings.Join(a.NextHops, ",")), orDash(a.Why))
	}
	return tw.flush()
}

// table writes tab-separated rows through a tabwriter, keeping the first
// error.
type table struct {
	w   *tabwriter.Writer
	err error
}

func (t *table) row(cells ...string) {
	if t.err == nil {
		_, t.err = fmt.Fprintln(t.w, strings.Join(cells, "\t"))
	}
}

func (t *table) flush() error {
	if t.err == nil {
		t.err = t.w.Flush()
	}
	if t.err != nil {
		return fmt.Errorf("writing the table: %w", t.err)
	}
	return nil
}

// PrintPeers writes the session matrix: a row per node, a column per peer,
// each cell the session's state (and its last error when not
// Established), then its BFD session's state when the peer has BFD
// ("BFD Down: <diagnostic>" when not Up); "-" where the node has no session
// with the peer.
func PrintPeers(w io.Writer, statuses []vipcastv1alpha1.SpeakerStatus) error {
	var peers []string
	for _, s := range statuses {
		for _, ss := range s.Status.Sessions {
			if !slices.Contains(peers, ss.Peer) {
				peers = append(peers, ss.Peer)
			}
		}
	}
	slices.Sort(peers)
	statuses = slices.Clone(statuses)
	slices.SortFunc(statuses, func(a, b vipcastv1alpha1.SpeakerStatus) int { return cmp.Compare(a.Name, b.Name) })
	tw := &table{w: tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)}
	tw.row(append([]string{"NODE"}, peers...)...)
	for _, s := range statuses {
		cells := []string{s.Name}
		for _, p := range peers {
			cell := "-"
			for _, ss := range s.Status.Sessions {
				if ss.Peer != p {
					continue
				}
				cell = ss.State
				if ss.State != "Established" && ss.LastError != "" {
					cell += " (" + ss.LastError + ")"
				}
				switch {
				case ss.BFD == "":
				case ss.BFD != "Up" && ss.BFDDiagnostic != "":
					cell += ", BFD " + ss.BFD + ": " + ss.BFDDiagnostic
				default:
					cell += ", BFD " + ss.BFD
				}
			}
			cells = append(cells, cell)
		}
		tw.row(cells...)
	}
	return tw.flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
