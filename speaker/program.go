package speaker

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/klog/v2"

	"github.com/vipcast/vipcast/ipvs"
)

// Dataplane is what the speaker needs from the kernel dataplane;
// *ipvs.Dataplane implements it.
type Dataplane interface {
	// Sync makes the kernel match desired with a full read (start-up and
	// drift repair), leaving foreign virtual servers alone.
	Sync(desired ipvs.State) (ipvs.Plan, error)
	// SyncService makes one virtual server match desired (nil: delete it)
	// without reading the kernel.
	SyncService(key ipvs.Key, desired *ipvs.Service) (ipvs.Plan, error)
}

// programmer keeps what the speaker asked the dataplane for, per Service,
// so that a change of one Service costs kernel work for that Service only.
// It is used by the controller's single worker goroutine.
type programmer struct {
	dp Dataplane
	// programmed are the virtual servers last applied, by Service key.
	programmed map[string][]ipvs.Service
	// owner is the Service key of each virtual server.
	owner map[ipvs.Key]string
	// problems are the last reported dataplane problems, by Service key.
	problems map[string]string
}

func newProgrammer(dp Dataplane) *programmer {
	return &programmer{dp: dp, programmed: map[string][]ipvs.Service{}, owner: map[ipvs.Key]string{}, problems: map[string]string{}}
}

// desiredFor computes one Service's virtual servers (none without a
// dataplane) and reports a changed problem with its annotations or ports.
func (c *Controller) desiredFor(ctx context.Context, svc *v1.Service, slices []*discoveryv1.EndpointSlice) []ipvs.Service {
	if c.prog == nil {
		return nil
	}
	services, problems := ServiceDataplane(svc, slices, c.view)
	key := ServiceKey(svc)
	msg := strings.Join(problems, "; ")
	if msg != c.prog.problems[key] {
		if msg != "" {
			klog.FromContext(ctx).Info("Service has a dataplane problem", "service", key, "problem", msg)
			c.recorder.Eventf(svc, v1.EventTypeWarning, "InvalidDataplaneConfig", "node %s: %s", c.opts.NodeName, msg)
			c.prog.problems[key] = msg
		} else {
			delete(c.prog.problems, key)
		}
	}
	return services
}

// program applies one Service's desired virtual servers (nil: the Service
// is gone) through SyncService, touching only what changed.
func (c *Controller) program(ctx context.Context, key string, desired []ipvs.Service) error {
	if c.prog == nil {
		return nil
	}
	p := c.prog
	old := map[ipvs.Key]ipvs.Service{}
	for _, s := range p.programmed[key] {
		old[s.Key()] = s
	}
	var errs []error
	applied := make([]ipvs.Service, 0, len(desired))
	for i := range desired {
		d := desired[i]
		k := d.Key()
		if o, ok := old[k]; ok && reflect.DeepEqual(o, d) {
			applied = append(applied, d)
			delete(old, k)
			continue
		}
		if other, taken := p.owner[k]; taken && other != key {
			errs = append(errs, fmt.Errorf("virtual server %s is already programmed for Service %s", k, other))
			continue
		}
		plan, err := p.dp.SyncService(k, &d)
		c.opts.Metrics.kernelChanges(plan.Len())
		if err != nil {
			errs = append(errs, fmt.Errorf("programming %s: %w", k, err))
			if o, ok := old[k]; ok {
				applied = append(applied, o) // what may still be there
				delete(old, k)
			}
			continue
		}
		p.owner[k] = key
		applied = append(applied, d)
		delete(old, k)
	}
	for k, o := range old {
		plan, err := p.dp.SyncService(k, nil)
		c.opts.Metrics.kernelChanges(plan.Len())
		if err != nil {
			errs = append(errs, fmt.Errorf("removing %s: %w", k, err))
			applied = append(applied, o)
			continue
		}
		delete(p.owner, k)
	}
	if len(applied) == 0 {
		delete(p.programmed, key)
	} else {
		p.programmed[key] = applied
	}
	c.opts.Metrics.setVirtualServers(len(p.owner))
	return errors.Join(errs...)
}

// resyncDataplane computes every Service's virtual servers and has the
// dataplane compare the whole kernel table with them: it repairs drift
// (a virtual server deleted by hand) and, at start-up, takes over what a
// previous speaker programmed without touching established connections.
func (c *Controller) resyncDataplane(ctx context.Context) error {
	if c.prog == nil {
		return nil
	}
	start := time.Now()
	desired := ipvs.NewState()
	programmed := map[string][]ipvs.Service{}
	owner := map[ipvs.Key]string{}
	for _, obj := range c.services.GetStore().List() {
		svc, ok := obj.(*v1.Service)
		if !ok {
			continue
		}
		key := ServiceKey(svc)
		for _, s := range c.desiredFor(ctx, svc, c.slicesOf(svc)) {
			if other, taken := owner[s.Key()]; taken {
				klog.FromContext(ctx).Info("Virtual server wanted by two Services; the first keeps it", "key", s.Key(), "service", key, "holder", other)
				continue
			}
			owner[s.Key()] = key
			programmed[key] = append(programmed[key], s)
			desired.Add(s)
		}
	}
	plan, err := c.prog.dp.Sync(desired)
	c.opts.Metrics.kernelChanges(plan.Len())
	if err != nil {
		return fmt.Errorf("dataplane resync: %w", err)
	}
	c.prog.programmed, c.prog.owner = programmed, owner
	c.opts.Metrics.setVirtualServers(len(owner))
	c.opts.Metrics.observeSync("dataplane-resync", start)
	if !plan.Empty() {
		klog.FromContext(ctx).Info("Dataplane resynced", "changes", plan.String(), "virtualServers", len(owner), "duration", time.Since(start))
	}
	return nil
}
