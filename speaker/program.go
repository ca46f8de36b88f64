package speaker

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

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
	dp      Dataplane
	metrics *Metrics
	// programmed are the virtual servers last applied, by Service key.
	programmed map[string][]ipvs.Service
	// owner is the Service key of each virtual server.
	owner map[ipvs.Key]string
}

func newProgrammer(dp Dataplane, m *Metrics) *programmer {
	return &programmer{dp: dp, metrics: m, programmed: map[string][]ipvs.Service{}, owner: map[ipvs.Key]string{}}
}

// serviceServers is one Service's desired virtual servers.
type serviceServers struct {
	key      string
	services []ipvs.Service
}

// program applies one Service's desired virtual servers (nil: the Service
// is gone) through SyncService, touching only what changed.
func (p *programmer) program(key string, desired []ipvs.Service) error {
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
		if err := p.syncOne(k, &d); err != nil {
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
		if err := p.syncOne(k, nil); err != nil {
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
	p.metrics.setVirtualServers(len(p.owner))
	return errors.Join(errs...)
}

// syncOne makes one virtual server match desired (nil: delete it).
func (p *programmer) syncOne(k ipvs.Key, desired *ipvs.Service) error {
	plan, err := p.dp.SyncService(k, desired)
	p.metrics.kernelChanges(plan.Len())
	return err
}

// resync has the dataplane compare the whole kernel table with every
// Service's virtual servers: it repairs drift (a virtual server deleted by
// hand) and, at start-up, takes over what a previous speaker programmed
// without touching established connections. A virtual server two Services
// want goes to the first.
func (p *programmer) resync(ctx context.Context, all []serviceServers) error {
	start := time.Now()
	desired := ipvs.NewState()
	programmed := map[string][]ipvs.Service{}
	owner := map[ipvs.Key]string{}
	for _, ss := range all {
		for _, s := range ss.services {
			if other, taken := owner[s.Key()]; taken {
				klog.FromContext(ctx).Info("Virtual server wanted by two Services; the first keeps it", "key", s.Key(), "service", ss.key, "holder", other)
				continue
			}
			owner[s.Key()] = ss.key
			programmed[ss.key] = append(programmed[ss.key], s)
			desired.Add(s)
		}
	}
	plan, err := p.dp.Sync(desired)
	p.metrics.kernelChanges(plan.Len())
	if err != nil {
		return fmt.Errorf("dataplane resync: %w", err)
	}
	p.programmed, p.owner = programmed, owner
	p.metrics.setVirtualServers(len(owner))
	p.metrics.observeSync("dataplane-resync", start)
	if !plan.Empty() {
		klog.FromContext(ctx).Info("Dataplane resynced", "changes", plan.String(), "virtualServers", len(owner), "duration", time.Since(start))
	}
	return nil
}
