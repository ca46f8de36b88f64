package speaker

import (
	"context"
	"maps"
	"slices"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
)

// The watch of every node's NodeTunnel, with two tiers: which nodes'
// tunnel addresses changed, and the Services with endpoints on them.

// sameTunnelAddress reports whether a NodeTunnel update leaves the
// node's addresses, those its tunnel addresses derive from, as they were
// (an object that does not decode counts as changed).
func sameTunnelAddress(old, cur any) bool {
	a, ok1 := tunnelNodeOf(old)
	b, ok2 := tunnelNodeOf(cur)
	return ok1 && ok2 && a.IPv4 == b.IPv4 && a.IPv6 == b.IPv6
}

// sameAnnounces reports whether a NodeTunnel update leaves whether the
// node announces (the relay's peers, relayPeers) as it was.
func sameAnnounces(old, cur any) bool {
	a, ok1 := tunnelNodeOf(old)
	b, ok2 := tunnelNodeOf(cur)
	return ok1 && ok2 && a.Announces == b.Announces
}

// tunnelNodeOf decodes an informer's NodeTunnel (or its tombstone).
func tunnelNodeOf(obj any) (tunnelNode, bool) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	t := &vipcastv1alpha1.NodeTunnel{}
	if !decode(context.Background(), obj, t) {
		return tunnelNode{}, false
	}
	n, _ := tunnelNodeFrom(t)
	return n, true
}

// tunnelsHandler notes which nodes' NodeTunnels come, go or change their
// addresses and queues keyNodes for them (once for many): the worker
// updates the tunnel addresses and the relay's peers, and recomputes only
// the Services with endpoints on those nodes (syncNodes), not every
// Service. A change of Announces alone queues keyNodes noting no node:
// the relay's peers follow, no Service is recomputed. This node's own
// NodeTunnel, which its speaker writes from its Node, only wakes the
// writer (ownTunnel): it is put back if someone else changed or deleted
// it. The NodeTunnels of the first list are the first full sync's.
func (w *watched) tunnelsHandler(q workqueue.TypedRateLimitingInterface[string]) cache.ResourceEventHandler {
	own := func(obj any) bool {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		m, err := meta.Accessor(obj)
		if err != nil || m.GetName() != w.nodeName {
			return false
		}
		if w.ownTunnel != nil {
			w.ownTunnel()
		}
		return true
	}
	changed := func(obj any) {
		if own(obj) {
			return
		}
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		m, err := meta.Accessor(obj)
		if err != nil {
			q.Add(keyConfig)
			return
		}
		w.nodesMu.Lock()
		if w.changedNodes == nil {
			w.changedNodes = map[string]bool{}
		}
		w.changedNodes[m.GetName()] = true
		w.nodesMu.Unlock()
		q.Add(keyNodes)
	}
	return cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj any, initial bool) {
			if !initial {
				changed(obj)
			}
		},
		UpdateFunc: func(old, cur any) {
			switch {
			case own(cur):
			case !sameTunnelAddress(old, cur):
				changed(cur)
			case !sameAnnounces(old, cur):
				// Only which nodes announce changed, which no Service's
				// virtual servers read: the relay's peers follow.
				q.Add(keyNodes)
			}
		},
		DeleteFunc: changed,
	}
}

// takeChangedNodes returns the nodes nodesHandler noted, and forgets them.
func (w *watched) takeChangedNodes() []string {
	w.nodesMu.Lock()
	defer w.nodesMu.Unlock()
	out := slices.Sorted(maps.Keys(w.changedNodes))
	w.changedNodes = nil
	return out
}

// sliceNodes is the sliceNodeIndex function: the nodes of a slice's
// endpoints.
func sliceNodes(obj any) ([]string, error) {
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return nil, nil
	}
	var out []string
	for _, e := range s.Endpoints {
		if e.NodeName != nil && *e.NodeName != "" && !slices.Contains(out, *e.NodeName) {
			out = append(out, *e.NodeName)
		}
	}
	return out, nil
}

// servicesOnNodes returns the keys of the Services with an endpoint on
// one of nodes, sorted.
func (w *watched) servicesOnNodes(nodes []string) []string {
	keys := map[string]bool{}
	for _, n := range nodes {
		objs, _ := w.slices.GetIndexer().ByIndex(sliceNodeIndex, n)
		for _, o := range objs {
			ks, _ := sliceServiceKey(o)
			for _, k := range ks {
				keys[k] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(keys))
}

// tunnelNodes returns every node's NodeTunnel from the cache, decoded,
// and the problems with those that hold a malformed address; nil without
// that watch (one tier).
func (w *watched) tunnelNodes(ctx context.Context) ([]tunnelNode, []string) {
	if w.tunnels == nil {
		return nil, nil
	}
	ts := decodeAll[vipcastv1alpha1.NodeTunnel](ctx, w.tunnels)
	out := make([]tunnelNode, 0, len(ts))
	var problems []string
	for _, t := range ts {
		n, errs := tunnelNodeFrom(t)
		for _, err := range errs {
			problems = append(problems, err.Error())
		}
		out = append(out, n)
	}
	return out, problems
}

// ownTunnelCached returns this node's NodeTunnel from the cache, if any.
func (w *watched) ownTunnelCached() (*vipcastv1alpha1.NodeTunnel, bool) {
	if w.tunnels == nil {
		return nil, false
	}
	obj, exists, err := w.tunnels.GetStore().GetByKey(w.nodeName)
	if err != nil || !exists {
		return nil, false
	}
	t := &vipcastv1alpha1.NodeTunnel{}
	return t, decode(context.Background(), obj, t)
}
