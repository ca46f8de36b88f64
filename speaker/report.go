package speaker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/bgp"
	"github.com/vipcast/vipcast/ipvs"
)

// reporter tells users about problems and session changes: a log line and,
// where a user looks, an Event — once per change of a problem, not once
// per resync. The problem memories are used by the controller's single
// worker goroutine; session states come from the BGP engine's goroutine and
// are locked.
type reporter struct {
	recorder record.EventRecorder
	nodeName string

	node    string            // the last node configuration problem
	pools   string            // the last IPPool problems, joined
	peers   map[string]string // BGPPeer name → its last problem
	service map[string]string // Service key → its last dataplane problem
	refused map[string]string // Service key → why the kernel last refused it

	// manyPrefixes is whether the node last had more announced prefixes
	// than the warning's count (prefixCount).
	manyPrefixes bool

	mu        sync.Mutex
	sessionUp map[string]bool // last known Established state per peer
	bfdUp     map[string]bool // last known BFD Up state per peer
}

func newReporter(recorder record.EventRecorder, nodeName string) *reporter {
	return &reporter{
		recorder:  recorder,
		nodeName:  nodeName,
		peers:     map[string]string{},
		service:   map[string]string{},
		refused:   map[string]string{},
		sessionUp: map[string]bool{},
		bfdUp:     map[string]bool{},
	}
}

// nodeProblems reports the problems NodeFrom found with this node's
// configuration, with a Warning Event on the Node.
func (r *reporter) nodeProblems(ctx context.Context, node *v1.Node, errs []error) {
	msg := errors.Join(errs...)
	if msg == nil {
		r.node = ""
		return
	}
	if msg.Error() == r.node {
		return
	}
	klog.FromContext(ctx).Error(msg, "Node configuration problem", "node", r.nodeName)
	r.recorder.Eventf(node, v1.EventTypeWarning, "InvalidConfig", "%v", msg)
	r.node = msg.Error()
}

// maxLostLogged bounds the virtual servers a drift log line names: a
// flush takes them all, maybe thousands.
const maxLostLogged = 10

// dataplaneDrift reports that virtual servers the speaker programmed
// (lost) went missing from the kernel, with a Warning Event on the Node
// (nil: the log line only). The Event's message is the same every time, so
// that repeats count up on one Event; the log line names them and the sync
// that found them (foundBy: probe, resync, or a Service's key).
func (r *reporter) dataplaneDrift(ctx context.Context, node *v1.Node, lost []ipvs.Key, foundBy string) {
	const msg = "IPVS virtual servers vipcast programmed were removed by another program (kube-proxy flushes IPVS when it starts in nftables mode, as does kube-proxy --cleanup); the speaker programs them again"
	names := make([]string, 0, min(len(lost), maxLostLogged))
	for _, k := range lost[:min(len(lost), maxLostLogged)] {
		names = append(names, k.String())
	}
	klog.FromContext(ctx).Info("Dataplane drift: "+msg, "node", r.nodeName, "foundBy", foundBy, "lost", len(lost), "virtualServers", names)
	if node != nil {
		r.recorder.Eventf(node, v1.EventTypeWarning, "DataplaneDrift", "%s", msg)
	}
}

// poolProblems logs the IPPools this node cannot use for announcements.
// The CCM reports pool problems on the IPPool's status; each speaker only
// logs them.
func (r *reporter) poolProblems(ctx context.Context, errs []PoolError) {
	msgs := make([]string, 0, len(errs))
	for _, e := range errs {
		msgs = append(msgs, e.Error())
	}
	joined := strings.Join(msgs, "; ")
	if joined == r.pools {
		return
	}
	for _, e := range errs {
		klog.FromContext(ctx).Error(e, "IPPool not usable for announcements on this node", "pool", e.Pool, "reason", e.Reason)
	}
	r.pools = joined
}

// peerProblems records a Warning Event on each BGPPeer this node cannot
// use.
func (r *reporter) peerProblems(ctx context.Context, peers []*vipcastv1alpha1.BGPPeer, problems []PeerError) {
	byName := map[string]*vipcastv1alpha1.BGPPeer{}
	for _, p := range peers {
		byName[p.Name] = p
	}
	current := map[string]string{}
	for _, pe := range problems {
		msg := pe.Error()
		current[pe.Peer] = msg
		if r.peers[pe.Peer] == msg {
			continue
		}
		klog.FromContext(ctx).Error(pe, "BGPPeer not usable on this node", "peer", pe.Peer)
		if p := byName[pe.Peer]; p != nil {
			r.recorder.Eventf(p, v1.EventTypeWarning, pe.Reason, "node %s: %s", r.nodeName, msg)
		}
	}
	r.peers = current
}

// prefixCount warns, with a Warning Event on the Node, when the node comes
// to announce more than limit prefixes (limit 0: never); it warns again
// only after the count has gone back under nine tenths of limit, so a
// count that hovers at the limit is one Event.
func (r *reporter) prefixCount(ctx context.Context, node *v1.Node, n, limit int) {
	switch {
	case limit <= 0 || (r.manyPrefixes && n > limit*9/10):
		return
	case n <= limit:
		r.manyPrefixes = false
		return
	}
	r.manyPrefixes = true
	msg := fmt.Sprintf("node %s announces %d prefixes, more than --announced-prefixes-warning=%d: routers hold a bounded number of routes and ECMP groups (see docs/routers.md, Fabric limits); aggregate with the pools' spec.bgp.aggregationLength under externalTrafficPolicy Cluster, or raise the warning if the routers hold more",
		r.nodeName, n, limit)
	klog.FromContext(ctx).Info("Many prefixes announced", "node", r.nodeName, "prefixes", n, "warning", limit)
	r.recorder.Event(node, v1.EventTypeWarning, "PrefixCountHigh", msg)
}

// dataplaneProblems logs a changed problem with a Service's annotations or
// ports (ServiceDataplane's problems). It puts no Event on the Service: the
// Service's own problems are the same on every node, and vipcast-ccm
// reports them once (InvalidDataplaneConfig); an Event from each speaker
// would be one per node.
func (r *reporter) dataplaneProblems(ctx context.Context, svc *v1.Service, problems []string) {
	key := ServiceKey(svc)
	msg := strings.Join(problems, "; ")
	if msg == r.service[key] {
		return
	}
	if msg == "" {
		delete(r.service, key)
		return
	}
	klog.FromContext(ctx).Info("Service has a dataplane problem", "service", key, "problem", msg)
	r.service[key] = msg
}

// dataplaneRefused reports a changed refusal of a Service's virtual
// servers by this node's kernel (err nil: none), with a Warning Event on
// the Service naming the node and the kernel's reason; the end of a
// refusal is logged.
func (r *reporter) dataplaneRefused(ctx context.Context, svc *v1.Service, err error) {
	key := ServiceKey(svc)
	if err == nil {
		if _, was := r.refused[key]; was {
			klog.FromContext(ctx).Info("Service programmed after the kernel refused it", "service", key)
			delete(r.refused, key)
		}
		return
	}
	msg := strings.ReplaceAll(err.Error(), "\n", "; ")
	if msg == r.refused[key] {
		return
	}
	klog.FromContext(ctx).Error(err, "Kernel refused the Service's virtual servers; not announcing it from this node", "service", key)
	r.recorder.Eventf(svc, v1.EventTypeWarning, "DataplaneRefused",
		"node %s: the kernel refused the Service's virtual servers, so this node does not announce it: %s", r.nodeName, msg)
	r.refused[key] = msg
}

// forgetService drops what was reported about a deleted Service.
func (r *reporter) forgetService(key string) {
	delete(r.service, key)
	delete(r.refused, key)
}

// sessionChanged logs every session state change and records an Event on
// the BGPPeer (found by peer, nil when unknown) when the session or its
// BFD session comes up or goes down, not for each retry in between.
func (r *reporter) sessionChanged(ctx context.Context, s bgp.SessionState, peer func(string) *vipcastv1alpha1.BGPPeer) {
	klog.FromContext(ctx).Info("BGP session state changed", "peer", s.Peer, "address", s.Address, "state", s.State, "reason", s.Reason, "bfd", s.BFD, "bfdDiag", s.BFDDiag)
	r.mu.Lock()
	wasUp := r.sessionUp[s.Peer]
	r.sessionUp[s.Peer] = s.Established()
	bfdWasUp := r.bfdUp[s.Peer]
	r.bfdUp[s.Peer] = s.BFD == "Up"
	r.mu.Unlock()
	bfdChanged := s.BFD != "" && bfdWasUp != (s.BFD == "Up")
	if wasUp == s.Established() && !bfdChanged {
		return
	}
	p := peer(s.Peer)
	if p == nil {
		return
	}
	if bfdChanged {
		if s.BFD == "Up" {
			r.recorder.Eventf(p, v1.EventTypeNormal, "BFDUp", "node %s: BFD session with %s up", r.nodeName, s.Address)
		} else {
			r.recorder.Eventf(p, v1.EventTypeWarning, "BFDDown", "node %s: BFD session with %s went %s: %s", r.nodeName, s.Address, s.BFD, orNone(s.BFDDiag))
		}
		if wasUp == s.Established() {
			return
		}
	}
	if s.Established() {
		r.recorder.Eventf(p, v1.EventTypeNormal, "SessionEstablished", "node %s: session with %s established", r.nodeName, s.Address)
		return
	}
	r.recorder.Eventf(p, v1.EventTypeWarning, "SessionDown", "node %s: session with %s went down (%s): %s", r.nodeName, s.Address, s.State, orNone(s.Reason))
}

// orNone is reason, or "no reason given" when empty.
func orNone(reason string) string {
	if reason == "" {
		return "no reason given"
	}
	return reason
}
