package speaker

import (
	"sync"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

// DefaultOutageSettle is how long after an API-server outage the speaker
// keeps reading as ready the endpoints that were ready when the outage
// began (Options.OutageSettle).
const DefaultOutageSettle = 2 * time.Minute

// outageHold carries the speaker's fail-static through the control
// plane's catch-up after an API-server outage. While the API server is
// away no kubelet renews its Lease; when it returns, kube-controller-
// manager's node monitor finds every Lease older than its grace period
// (--node-monitor-grace-period, 50 s by default) before the kubelets
// have renewed them, marks those nodes Unknown and their pods not ready,
// and the EndpointSlices follow, until the kubelets report again and
// their pods are ready once more, tens of seconds later. Read as they
// come, those not-ready endpoints would withdraw Local routes, take the
// endpoints out of every node's IPVS (breaking their established
// connections) and, when every node was marked, withdraw the VIP
// altogether: the whole outage passed without a change, and its end would
// break the traffic.
//
// So, when the speaker loses the API server (contact), it notes which
// endpoints are ready in its caches, the state it keeps serving
// throughout; from then until settle after the API server answers again,
// an endpoint of that set that the EndpointSlices call neither ready nor
// terminating is read as ready. Anything else is read as it comes: an
// endpoint that terminates or goes away, a new endpoint, one that was not
// ready before the outage. After settle the slices are read as they are
// (kube-proxy's rules: a not-ready endpoint gets no traffic), and a full
// recompute applies whatever is still not ready then.
//
// A pod that really stopped being ready during the outage, or a node
// that really died, is served as before for the outage and settle more:
// the speaker cannot tell the node monitor's catch-up from a real failure
// through the API, and keeps what works rather than break what may.
type outageHold struct {
	settle time.Duration
	now    func() time.Time

	mu sync.Mutex
	// ready is the set of endpoints ready when the outage began (nil: no
	// hold); back is when the API server answered again (zero while the
	// outage lasts).
	ready map[endpointRef]struct{}
	back  time.Time
}

// endpointRef names one endpoint: its EndpointSlice (namespace/name) and
// its first address.
type endpointRef struct {
	slice, addr string
}

// begin starts a hold from the EndpointSlices in the speaker's caches, as
// the outage begins. An outage that begins while the last one's hold lasts
// keeps that hold's set, taken before the first: the caches may hold the
// node monitor's marks by now.
func (h *outageHold) begin(slices []*discoveryv1.EndpointSlice) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ready != nil && (h.back.IsZero() || h.now().Before(h.back.Add(h.settle))) {
		h.back = time.Time{}
		return
	}
	ready := map[endpointRef]struct{}{}
	for _, s := range slices {
		key, _ := cache.MetaNamespaceKeyFunc(s)
		for i := range s.Endpoints {
			e := &s.Endpoints[i]
			if len(e.Addresses) > 0 && stateOf(e) == epReady {
				ready[endpointRef{key, e.Addresses[0]}] = struct{}{}
			}
		}
	}
	h.ready, h.back = ready, time.Time{}
}

// end notes that the API server answers again: the hold lasts settle
// more. It reports whether this ends an outage under hold.
func (h *outageHold) end() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ready == nil || !h.back.IsZero() {
		return false
	}
	h.back = h.now()
	return true
}

// active returns the held set, or nil when no hold lasts (and drops an
// expired one).
func (h *outageHold) active() map[endpointRef]struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ready != nil && !h.back.IsZero() && !h.now().Before(h.back.Add(h.settle)) {
		h.ready = nil
	}
	return h.ready
}

// apply returns slices as the hold reads them: the held endpoints that are
// neither ready nor terminating marked ready (in copies: the caches'
// objects are shared), and how many it marked.
func (h *outageHold) apply(slices []*discoveryv1.EndpointSlice) ([]*discoveryv1.EndpointSlice, int) {
	ready := h.active()
	if ready == nil {
		return slices, 0
	}
	return holdReady(slices, ready)
}

// holdReady marks ready, in copies of slices, their endpoints in ready
// that are neither ready nor terminating; it returns the slices (the same
// objects where nothing changed) and how many endpoints it marked.
func holdReady(slices []*discoveryv1.EndpointSlice, ready map[endpointRef]struct{}) ([]*discoveryv1.EndpointSlice, int) {
	out := slices
	marked := 0
	for i, s := range slices {
		key, _ := cache.MetaNamespaceKeyFunc(s)
		var cp *discoveryv1.EndpointSlice
		for j := range s.Endpoints {
			e := &s.Endpoints[j]
			if len(e.Addresses) == 0 || stateOf(e) != epExcluded {
				continue
			}
			if _, ok := ready[endpointRef{key, e.Addresses[0]}]; !ok {
				continue
			}
			if cp == nil {
				cp = s.DeepCopy()
				if marked == 0 {
					out = append([]*discoveryv1.EndpointSlice(nil), slices...)
				}
				out[i] = cp
			}
			cp.Endpoints[j].Conditions.Ready = ptr.To(true)
			cp.Endpoints[j].Conditions.Serving = ptr.To(true)
			marked++
		}
	}
	return out, marked
}
