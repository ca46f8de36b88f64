package speaker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/vipcast/vipcast/ipvs"
)

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
	// refused holds, by Service key, why the dataplane refused some of
	// that Service's desired virtual servers: this node does not announce
	// such a Service (see refusal).
	refused map[string]error
	// lost are the virtual servers the dataplane found gone from the
	// kernel (ipvs.Plan's Lost) since takeLost last ran, and lostPartly
	// whether a Service's sync found some: it restores only its own.
	lost       []ipvs.Key
	lostPartly bool
}

func newProgrammer(dp Dataplane, m *Metrics) *programmer {
	return &programmer{dp: dp, metrics: m, programmed: map[string][]ipvs.Service{},
		owner: map[ipvs.Key]string{}, refused: map[string]error{}}
}

// refusal returns why the dataplane refused the Service key's virtual
// servers at their last programming (nil: all programmed).
func (p *programmer) refusal(key string) error {
	return p.refused[key]
}

// refusedMessages returns, by Service key, why the dataplane refused the
// Services it refused.
func (p *programmer) refusedMessages() map[string]string {
	out := make(map[string]string, len(p.refused))
	for k, err := range p.refused {
		out[k] = strings.ReplaceAll(err.Error(), "\n", "; ")
	}
	return out
}

// setRefused records why the Service key's virtual servers were refused
// (errs empty: they were not) and updates the metric.
func (p *programmer) setRefused(key string, errs []error) {
	if len(errs) == 0 {
		if _, was := p.refused[key]; !was {
			return // the common case, on every program: nothing to count again
		}
		delete(p.refused, key)
	} else {
		p.refused[key] = errors.Join(errs...)
	}
	p.metrics.setServiceErrors(p.refused)
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
	var errs, refused []error
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
			err = fmt.Errorf("virtual server %s: %w", k, err)
			errs, refused = append(errs, err), append(refused, err)
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
	p.setRefused(key, refused)
	return errors.Join(errs...)
}

// syncOne makes one virtual server match desired (nil: delete it).
func (p *programmer) syncOne(k ipvs.Key, desired *ipvs.Service) error {
	plan, err := p.dp.SyncService(k, desired)
	p.metrics.kernelChanges(plan.Len())
	if len(plan.Lost) > 0 {
		p.lost, p.lostPartly = append(p.lost, plan.Lost...), true
	}
	return err
}

// takeLost returns, and forgets, the virtual servers found gone from the
// kernel since the last call, and whether only a full resync restores
// them all (some were found by one Service's sync).
func (p *programmer) takeLost() (lost []ipvs.Key, needResync bool) {
	lost, needResync = p.lost, p.lostPartly
	p.lost, p.lostPartly = nil, false
	return lost, needResync
}

// resync has the dataplane compare the whole kernel table with every
// Service's virtual servers: it repairs drift (a virtual server deleted by
// hand) and, at start-up, takes over what a previous speaker programmed
// without touching established connections. A virtual server two Services
// want goes to the first.
//
// A virtual server the kernel refuses fails its Service alone: resync
// records the refusal (see refusal), leaves that virtual server out of
// what is programmed (so that program retries it) and returns the keys of
// the refused Services. It returns an error only when the dataplane failed
// as a whole (the kernel could not be read, a source NAT batch failed).
func (p *programmer) resync(ctx context.Context, all []serviceServers) (refused []string, err error) {
	start := time.Now()
	desired, programmed, owner := p.plan(ctx, all)
	plan, err := p.dp.Sync(desired)
	p.metrics.kernelChanges(plan.Len())
	// The read restores everything: lost ones a Service's sync found too.
	p.lost, p.lostPartly = append(p.lost, plan.Lost...), false
	perService, err := p.refusals(ctx, err, programmed, owner)
	if err != nil {
		return nil, fmt.Errorf("dataplane resync: %w", err)
	}
	p.programmed, p.owner, p.refused = programmed, owner, perService
	p.metrics.setVirtualServers(len(owner))
	p.metrics.setServiceErrors(p.refused)
	p.metrics.observeSync("dataplane-resync", start)
	if !plan.Empty() {
		klog.FromContext(ctx).Info("Dataplane resynced", "changes", plan.String(), "virtualServers", len(owner), "duration", time.Since(start))
	}
	return slices.Sorted(maps.Keys(perService)), nil
}

// plan merges every Service's virtual servers into the desired kernel
// state, with the virtual servers of each Service and the Service of each
// virtual server.
func (p *programmer) plan(ctx context.Context, all []serviceServers) (ipvs.State, map[string][]ipvs.Service, map[ipvs.Key]string) {
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
	return desired, programmed, owner
}

// refusals splits the error of a Sync: the virtual servers the kernel
// refused are taken out of programmed and owner and returned by Service;
// the error returned is what failed the dataplane as a whole. A refused
// virtual server no Service wants (a stale one the kernel would not
// delete) is logged; the next resync tries again.
func (p *programmer) refusals(ctx context.Context, err error, programmed map[string][]ipvs.Service, owner map[ipvs.Key]string) (map[string]error, error) {
	perService := map[string]error{}
	var se *ipvs.SyncErrors
	if err == nil {
		return perService, nil
	}
	if !errors.As(err, &se) || se.Other != nil {
		return nil, err
	}
	for _, k := range slices.SortedFunc(maps.Keys(se.Services), compareKeys) {
		kerr := fmt.Errorf("virtual server %s: %w", k, se.Services[k])
		key, ok := owner[k]
		if !ok {
			klog.FromContext(ctx).Error(kerr, "Dataplane resync could not remove a virtual server; retrying at the next resync")
			continue
		}
		perService[key] = errors.Join(perService[key], kerr)
		delete(owner, k)
		programmed[key] = slices.DeleteFunc(programmed[key], func(s ipvs.Service) bool { return s.Key() == k })
		if len(programmed[key]) == 0 {
			delete(programmed, key)
		}
	}
	return perService, nil
}

// compareKeys orders virtual server keys by VIP, port and protocol.
func compareKeys(a, b ipvs.Key) int {
	return cmp.Or(a.VIP.Compare(b.VIP), cmp.Compare(a.Port, b.Port), cmp.Compare(a.Protocol, b.Protocol))
}
