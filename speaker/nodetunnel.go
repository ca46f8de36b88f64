package speaker

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/klog/v2"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
)

// The two-tier dataplane learns the other nodes from their NodeTunnels,
// which each node's speaker publishes, rather than from their Nodes: a
// Node changes at every status heartbeat of its kubelet, and every
// speaker watching every Node would receive N of them per heartbeat
// period; a NodeTunnel changes only when what it says does.

// tunnelNode is one node's NodeTunnel, decoded: what the two-tier
// dataplane needs of another node.
type tunnelNode struct {
	Name string
	// IPv4 and IPv6 are the node's addresses (invalid: none).
	IPv4, IPv6 netip.Addr
	// Announces is true when the node announces VIPs.
	Announces bool
}

// tunnelNodeFrom decodes a NodeTunnel. An address that is not one of its
// field's family (the CRD's validation refuses those, so only an object
// written around it holds one) is left out, with an error naming the
// field.
func tunnelNodeFrom(t *vipcastv1alpha1.NodeTunnel) (tunnelNode, []error) {
	out := tunnelNode{Name: t.Name, Announces: t.Spec.Announces}
	var errs []error
	parse := func(field, s string, is4 bool) netip.Addr {
		if s == "" {
			return netip.Addr{}
		}
		a, err := netip.ParseAddr(s)
		if err != nil || a.Is4() != is4 || a.Is4In6() || a.Zone() != "" {
			errs = append(errs, fmt.Errorf("NodeTunnel %s: spec.%s %q is not an %s address; the node's tunnel address of that family is left out until its speaker rewrites the object", t.Name, field, s, map[bool]string{true: "IPv4", false: "IPv6"}[is4]))
			return netip.Addr{}
		}
		return a
	}
	out.IPv4 = parse("ipv4", t.Spec.IPv4, true)
	out.IPv6 = parse("ipv6", t.Spec.IPv6, false)
	return out, errs
}

// announces reports whether node n announces VIPs: it is not excluded
// from external load balancers and a usable BGPPeer (one that passes its
// Check) selects it, as PeersForNode decides.
func announces(n Node, peers []*vipcastv1alpha1.BGPPeer) bool {
	if n.Excluded {
		return false
	}
	for _, p := range peers {
		if p.Spec.Check() == nil && p.Spec.NodeSelectorOrAll().Matches(n.Labels) {
			return true
		}
	}
	return false
}

// nodeTunnelSpec is what node n publishes with these peers.
func nodeTunnelSpec(n Node, peers []*vipcastv1alpha1.BGPPeer) vipcastv1alpha1.NodeTunnelSpec {
	s := vipcastv1alpha1.NodeTunnelSpec{Announces: announces(n, peers)}
	if n.IPv4.IsValid() {
		s.IPv4 = n.IPv4.String()
	}
	if n.IPv6.IsValid() {
		s.IPv6 = n.IPv6.String()
	}
	return s
}

// relayPeers returns the connection sync relay's peers, sorted: when this
// node (self, whose entry nodes must hold) announces, the IPv4 addresses
// of the other nodes that announce; when it does not, none. Only the
// nodes the fabric sends a VIP's flows to can receive a flow that ECMP
// moves, so only they need each other's connections; a node that
// announces nothing serves only flows of its own clients, which never
// move. This bounds what the relay sends and what each node's kernel
// holds by the number of announcing nodes, which BGPPeer nodeSelectors
// choose, not by the cluster's size.
func relayPeers(self string, nodes []tunnelNode) []netip.Addr {
	i := slices.IndexFunc(nodes, func(n tunnelNode) bool { return n.Name == self })
	if i < 0 || !nodes[i].Announces {
		return nil
	}
	own := nodes[i].IPv4
	var out []netip.Addr
	for _, n := range nodes {
		if n.Name != self && n.Announces && n.IPv4.IsValid() && n.IPv4 != own {
			out = append(out, n.IPv4)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// tunnelPublisher writes this node's NodeTunnel, owned by its Node, when
// what it should say differs from what the API server holds. It runs in
// a goroutine of its own, so that a slow or absent API server never
// holds up the dataplane; a failed write is retried, waiting statusRetry
// at first and doubling up to statusRetryMax.
type tunnelPublisher struct {
	client dynamic.ResourceInterface
	name   string
	// cached returns the node's NodeTunnel from the informer's cache, if
	// there is one: when it already says what is wanted, nothing is sent
	// (a restart writes nothing).
	cached func() (*vipcastv1alpha1.NodeTunnel, bool)

	mu   sync.Mutex
	want *vipcastv1alpha1.NodeTunnel
	// wake is poked (capacity 1) by set and poke.
	wake chan struct{}
}

func newTunnelPublisher(dyn dynamic.Interface, name string, cached func() (*vipcastv1alpha1.NodeTunnel, bool)) *tunnelPublisher {
	return &tunnelPublisher{client: dyn.Resource(vipcastv1alpha1.NodeTunnelsResource), name: name, cached: cached, wake: make(chan struct{}, 1)}
}

// set makes spec, owned by the Node with uid, what the node's NodeTunnel
// should say. Without the Node's uid nothing is published: an object
// without its owner would outlive a deleted node.
func (p *tunnelPublisher) set(uid types.UID, spec vipcastv1alpha1.NodeTunnelSpec) {
	if uid == "" {
		return
	}
	want := &vipcastv1alpha1.NodeTunnel{
		TypeMeta: metav1.TypeMeta{APIVersion: vipcastv1alpha1.SchemeGroupVersion.String(), Kind: "NodeTunnel"},
		ObjectMeta: metav1.ObjectMeta{Name: p.name, OwnerReferences: []metav1.OwnerReference{
			{APIVersion: "v1", Kind: "Node", Name: p.name, UID: uid},
		}},
		Spec: spec,
	}
	p.mu.Lock()
	p.want = want
	p.mu.Unlock()
	p.poke()
}

// poke has the writer compare again (the object changed or went).
func (p *tunnelPublisher) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// says reports whether t already says what want does.
func says(t, want *vipcastv1alpha1.NodeTunnel) bool {
	return t.Spec == want.Spec && slices.Equal(t.OwnerReferences, want.OwnerReferences)
}

// run writes until ctx ends.
func (p *tunnelPublisher) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		}
		for wait := statusRetry; ; wait = min(2*wait, statusRetryMax) {
			err := p.write(ctx)
			if err == nil {
				break
			}
			klog.FromContext(ctx).Error(err, "Writing this node's NodeTunnel; retrying", "after", wait)
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
	}
}

// write makes the node's NodeTunnel say what is wanted: nothing when the
// cache's copy says so, else after reading the object from the API server
// (the cache may not have seen the last write yet), a create or an update.
func (p *tunnelPublisher) write(ctx context.Context) error {
	p.mu.Lock()
	want := p.want
	p.mu.Unlock()
	if want == nil {
		return nil
	}
	if t, ok := p.cached(); ok && says(t, want) {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, statusCallTimeout)
	defer cancel()
	u, err := p.client.Get(ctx, p.name, metav1.GetOptions{})
	found := err == nil
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("reading NodeTunnel %s: %w", p.name, err)
	}
	next := want.DeepCopy()
	if found {
		cur := &vipcastv1alpha1.NodeTunnel{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, cur); err == nil && says(cur, want) {
			return nil
		}
		next.ResourceVersion = u.GetResourceVersion()
		next.Labels, next.Annotations = u.GetLabels(), u.GetAnnotations()
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(next)
	if err != nil {
		return fmt.Errorf("NodeTunnel %s: %w", p.name, err)
	}
	if !found {
		if _, err := p.client.Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating NodeTunnel %s: %w", p.name, err)
		}
		klog.FromContext(ctx).V(2).Info("Created this node's NodeTunnel", "spec", want.Spec)
		return nil
	}
	if _, err := p.client.Update(ctx, &unstructured.Unstructured{Object: obj}, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("updating NodeTunnel %s: %w", p.name, err)
	}
	klog.FromContext(ctx).V(2).Info("Updated this node's NodeTunnel", "spec", want.Spec)
	return nil
}
