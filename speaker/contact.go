package speaker

import (
	"context"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// contactTimeout bounds one probe of the API server.
const contactTimeout = 5 * time.Second

// contact watches whether the API server answers. The speaker keeps its
// sessions, routes and virtual servers as they are while it does not — the
// informers' caches keep the last state — and contact only says so: a log
// line when contact is lost and one when it returns (once per outage, not
// per failed request), and the time of the last answer in a metric.
type contact struct {
	client   kubernetes.Interface
	interval time.Duration
	metrics  *Metrics
	now      func() time.Time
	// lost and back, when set, are called when contact is lost after
	// the first answer, and when it returns from such a loss.
	lost, back func()
	// state, owned by run's goroutine: when the last answer came (zero
	// before the first), and since when the server has not answered.
	last, lostSince time.Time
}

// run probes the API server every interval until ctx ends.
func (c *contact) run(ctx context.Context) {
	t := time.NewTicker(c.interval)
	defer t.Stop()
	for {
		c.probe(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// probe asks the API server's /readyz once and records the outcome.
func (c *contact) probe(ctx context.Context) {
	rc := c.client.Discovery().RESTClient()
	if rc == nil { // a fake clientset: nothing to probe
		return
	}
	pctx, cancel := context.WithTimeout(ctx, contactTimeout)
	defer cancel()
	_, err := rc.Get().AbsPath("/readyz").Do(pctx).Raw()
	if ctx.Err() != nil {
		return
	}
	c.record(klog.FromContext(ctx), err)
}

// record updates the state with one probe's outcome, logging the start and
// end of an outage.
func (c *contact) record(logger klog.Logger, err error) {
	now := c.now()
	switch {
	case err == nil && !c.lostSince.IsZero():
		logger.Info("API server reachable again; resuming from the informers' caches",
			"unreachableFor", now.Sub(c.lostSince).Round(time.Second))
		c.lostSince = time.Time{}
		// An outage after an answer (lost was called), not at start.
		if !c.last.IsZero() && c.back != nil {
			c.back()
		}
	case err != nil && c.lostSince.IsZero() && c.last.IsZero():
		c.lostSince = now
		logger.Error(err, "API server unreachable at start: nothing is announced until the speaker has read the Services, EndpointSlices, Node, IPPools and BGPPeers")
	case err != nil && c.lostSince.IsZero():
		c.lostSince = now
		logger.Error(err, "API server unreachable: keeping BGP sessions, routes and IPVS exactly as they are until it answers again",
			"lastContact", c.last.UTC().Format(time.RFC3339))
		if c.lost != nil {
			c.lost()
		}
	}
	if err == nil {
		c.last = now
		c.metrics.contacted(now)
	}
}
