package ccm

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"
)

// The BGPPeers' session counts come from the speakers' SpeakerStatuses.
// Those can be large (every prefix a node announces), so the CCM's cache
// keeps only what it counts: each status's sessions, peer and state.

// slimSpeakerStatus is the informer's transform: a SpeakerStatus reduced to
// its name and status.sessions[].{peer,state}.
func slimSpeakerStatus(obj any) (any, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return obj, nil // a DeletedFinalStateUnknown keeps its object
	}
	slim := &unstructured.Unstructured{}
	slim.SetAPIVersion(u.GetAPIVersion())
	slim.SetKind(u.GetKind())
	slim.SetName(u.GetName())
	slim.SetResourceVersion(u.GetResourceVersion())
	sessions, _, _ := unstructured.NestedSlice(u.Object, "status", "sessions")
	var keep []any
	for _, s := range sessions {
		m, ok := s.(map[string]any)
		if !ok {
			continue
		}
		keep = append(keep, map[string]any{"peer": m["peer"], "state": m["state"]})
	}
	if keep != nil {
		if err := unstructured.SetNestedSlice(slim.Object, keep, "status", "sessions"); err != nil {
			return nil, err
		}
	}
	return slim, nil
}

// peerSessions returns, by BGPPeer name, whether a cached SpeakerStatus's
// session with it is Established.
func peerSessions(obj any) map[string]bool {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil
	}
	sessions, _, _ := unstructured.NestedSlice(u.Object, "status", "sessions")
	out := make(map[string]bool, len(sessions))
	for _, s := range sessions {
		m, ok := s.(map[string]any)
		if !ok {
			continue
		}
		peer, _ := m["peer"].(string)
		state, _ := m["state"].(string)
		if peer != "" {
			out[peer] = state == "Established"
		}
	}
	return out
}

// changedPeers returns the BGPPeers whose session a SpeakerStatus update
// from old to cur added, removed or moved in or out of Established.
func changedPeers(old, cur map[string]bool) []string {
	var out []string
	for p, up := range cur {
		if was, ok := old[p]; !ok || was != up {
			out = append(out, p)
		}
	}
	for p := range old {
		if _, ok := cur[p]; !ok {
			out = append(out, p)
		}
	}
	return out
}

// nodeReady reports whether n's Ready condition is True.
func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// countSessions counts, for the BGPPeer called peer, the SpeakerStatuses of
// Ready nodes (ready) that list a session with it, and those Established.
func countSessions(statuses []any, ready func(node string) bool, peer string) (nodes, established int32) {
	for _, o := range statuses {
		m, ok := o.(metav1.Object)
		if !ok || !ready(m.GetName()) {
			continue
		}
		if up, ok := peerSessions(o)[peer]; ok {
			nodes++
			if up {
				established++
			}
		}
	}
	return nodes, established
}

// sessionsChanged requeues the BGPPeers whose counts a SpeakerStatus change
// may move.
func (pc *peerStatusController) sessionsChanged(old, cur any) {
	for _, p := range changedPeers(peerSessions(old), peerSessions(cur)) {
		pc.queue.Add(p) // cluster-scoped: the key is the name
	}
}

// enqueueAll queues every cached peer.
func (pc *peerStatusController) enqueueAll() {
	for _, key := range pc.informer.GetStore().ListKeys() {
		pc.queue.Add(key)
	}
}

// sessionCounts is countSessions over the cache, for peer.
func (pc *peerStatusController) sessionCounts(peer string) (nodes, established int32) {
	ready := func(name string) bool {
		if pc.nodes == nil {
			return true
		}
		obj, ok, err := pc.nodes.GetStore().GetByKey(name)
		n, isNode := obj.(*corev1.Node)
		return err == nil && ok && isNode && nodeReady(n)
	}
	return countSessions(pc.speakers.GetStore().List(), ready, peer)
}
