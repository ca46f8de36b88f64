// Package nodereport turns what the speakers report in their
// SpeakerStatuses into the answers of the kubectl-vipcast plugin: for a
// Service, which node announces its VIPs and why the others do not; for
// the cluster, the matrix of BGP sessions, nodes by peers. It is pure: the
// plugin reads the objects and prints the rows.
package nodereport

import (
	"cmp"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"text/tabwriter"

	v1 "k8s.io/api/core/v1"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
)

// NodeAnswer is one node's answer for one Service.
type NodeAnswer struct {
	// Node is the node's name.
	Node string
	// Announced are the prefixes the node announces that cover the
	// Service's VIPs.
	Announced []string
	// NextHops are the node's addresses the routers forward the VIPs to
	// (its InternalIP of each announced VIP's family, else ExternalIP).
	NextHops []string
	// Why says why the node announces no route for some VIP; "" when it
	// announces them all.
	Why string
}

// Why answers, node by node (sorted by name), whether each node announces
// the VIPs of svc and why not, from the nodes' SpeakerStatuses; nodes
// (for the next hops and the nodes without a speaker) may be nil.
func Why(svc *v1.Service, statuses []vipcastv1alpha1.SpeakerStatus, nodes []v1.Node) []NodeAnswer {
	key := svc.Namespace + "/" + svc.Name
	vips := serviceVIPs(svc)
	byNode := map[string]*v1.Node{}
	for i := range nodes {
		byNode[nodes[i].Name] = &nodes[i]
	}
	var out []NodeAnswer
	seen := map[string]bool{}
	for _, s := range statuses {
		seen[s.Name] = true
		a := NodeAnswer{Node: s.Name}
		if why, listed := notAnnounced(s.Status, key); listed {
			a.Why = why
		}
		var missing []string
		for _, vip := range vips {
			p, ok := covering(s.Status.Announced, vip)
			if !ok {
				missing = append(missing, vip.String())
				continue
			}
			a.Announced = append(a.Announced, p)
			if hop := nextHop(byNode[s.Name], vip); hop != "" && !slices.Contains(a.NextHops, hop) {
				a.NextHops = append(a.NextHops, hop)
			}
		}
		switch {
		case len(vips) == 0:
			a.Why = "the Service has no VIP in its status"
		case a.Why == "" && len(missing) > 0 && int(s.Status.AnnouncedCount) > len(s.Status.Announced):
			a.Why = fmt.Sprintf("not in the node's list of announced prefixes, which stops at %d of %d", len(s.Status.Announced), s.Status.AnnouncedCount)
		case a.Why == "" && len(missing) > 0 && s.Status.SessionsEstablished == 0 && len(s.Status.Sessions) > 0 && s.Status.Sessions[0].LastError == "vipcast-speaker stopped":
			a.Why = "vipcast-speaker stopped"
		case a.Why == "" && len(missing) > 0:
			a.Why = "no route for " + strings.Join(missing, ", ") + " (the Service is not one this node's vipcast serves, or the speaker has not synced it yet)"
		}
		out = append(out, a)
	}
	for _, n := range nodes {
		if !seen[n.Name] {
			out = append(out, NodeAnswer{Node: n.Name, Why: "no SpeakerStatus: no vipcast-speaker has run on this node"})
		}
	}
	slices.SortFunc(out, func(a, b NodeAnswer) int { return cmp.Compare(a.Node, b.Node) })
	return out
}

// serviceVIPs returns the addresses of svc's status.
func serviceVIPs(svc *v1.Service) []netip.Addr {
	var out []netip.Addr
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		if a, err := netip.ParseAddr(ing.IP); err == nil {
			out = append(out, a.Unmap())
		}
	}
	return out
}

// notAnnounced returns the reason st lists key under, if it does.
func notAnnounced(st vipcastv1alpha1.SpeakerStatusStatus, key string) (string, bool) {
	for _, g := range st.NotAnnounced {
		if slices.Contains(g.Services, key) {
			return g.Reason, true
		}
	}
	return "", false
}

// covering returns the announced prefix that contains vip, the longest.
func covering(announced []string, vip netip.Addr) (string, bool) {
	best, bits := "", -1
	for _, s := range announced {
		p, err := netip.ParsePrefix(s)
		if err == nil && p.Contains(vip) && p.Bits() > bits {
			best, bits = s, p.Bits()
		}
	}
	return best, bits >= 0
}

// nextHop returns node's address of vip's family the speakers announce as
// next hop: an InternalIP, else an ExternalIP; "" when unknown.
func nextHop(node *v1.Node, vip netip.Addr) string {
	if node == nil {
		return ""
	}
	for _, typ := range []v1.NodeAddressType{v1.NodeInternalIP, v1.NodeExternalIP} {
		for _, a := range node.Status.Addresses {
			if ip, err := netip.ParseAddr(a.Address); err == nil && a.Type == typ && ip.Is4() == vip.Is4() {
				return a.Address
			}
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
