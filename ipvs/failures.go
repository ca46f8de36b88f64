package ipvs

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
)

// newFailures returns an empty failures.
func newFailures() *failures {
	return &failures{absent: map[Key]bool{}, unrestricted: map[Key]bool{}}
}

// failures collects the errors of the steps of an apply, each prefixed
// with what failed, and remembers which concern one virtual server or one
// VIP.
type failures struct {
	all   []error
	keys  map[Key][]error
	vips  map[netip.Addr][]error
	other []error // neither: a source NAT batch
	// absent are the virtual servers the kernel refused to add: their
	// real servers are not tried.
	absent map[Key]bool
	// unrestricted are the virtual servers whose restriction to their
	// source ranges failed: allow keeps their ports closed.
	unrestricted map[Key]bool
}

// add records err as the failure to do what, concerning no single virtual
// server or VIP.
func (f *failures) add(what string, err error) {
	e := fmt.Errorf("%s: %w", what, err)
	f.all, f.other = append(f.all, e), append(f.other, e)
}

// addKey records err as the failure to do what to virtual server k.
func (f *failures) addKey(k Key, what string, err error) {
	e := fmt.Errorf("%s: %w", what, err)
	if f.keys == nil {
		f.keys = map[Key][]error{}
	}
	f.all, f.keys[k] = append(f.all, e), append(f.keys[k], e)
}

// addVIP records err as the failure to do what to VIP a.
func (f *failures) addVIP(a netip.Addr, what string, err error) {
	e := fmt.Errorf("%s: %w", what, err)
	if f.vips == nil {
		f.vips = map[netip.Addr][]error{}
	}
	f.all, f.vips[a] = append(f.all, e), append(f.vips[a], e)
}

// err joins every failure (nil: none).
func (f *failures) err() error { return errors.Join(f.all...) }

// syncErrors is the error of a Sync to desired: nil without failures, else
// a *SyncErrors where a VIP's failure counts against every desired virtual
// server on it.
func (f *failures) syncErrors(desired State) error {
	if len(f.all) == 0 {
		return nil
	}
	e := &SyncErrors{Services: map[Key]error{}, Other: errors.Join(f.other...)}
	for k, errs := range f.keys {
		e.Services[k] = errors.Join(errs...)
	}
	for a, errs := range f.vips {
		attributed := false
		for k := range desired.Services {
			if k.VIP == a {
				e.Services[k] = errors.Join(append([]error{e.Services[k]}, errs...)...)
				attributed = true
			}
		}
		if !attributed { // a VIP being removed
			e.Other = errors.Join(append([]error{e.Other}, errs...)...)
		}
	}
	return e
}

// SyncErrors is the error of a Sync that applied all it could: the kernel
// refused changes to some virtual servers (Services, by key; a refused VIP
// counts against every virtual server on it) and, in Other (nil: none),
// changes that concern no single virtual server (a source NAT batch, the
// removal of a VIP nothing wants). Everything else in the plan was applied.
type SyncErrors struct {
	Services map[Key]error
	Other    error
}

// Error lists the failures, virtual servers in key order.
func (e *SyncErrors) Error() string {
	keys := slices.SortedFunc(maps.Keys(e.Services), Key.compare)
	msgs := make([]string, 0, len(keys)+1)
	for _, k := range keys {
		msgs = append(msgs, fmt.Sprintf("virtual server %s: %v", k, e.Services[k]))
	}
	if e.Other != nil {
		msgs = append(msgs, e.Other.Error())
	}
	return strings.Join(msgs, "; ")
}

// Unwrap returns every failure, for errors.Is and errors.As.
func (e *SyncErrors) Unwrap() []error {
	out := make([]error, 0, len(e.Services)+1)
	for _, err := range e.Services {
		out = append(out, err)
	}
	if e.Other != nil {
		out = append(out, e.Other)
	}
	return out
}
