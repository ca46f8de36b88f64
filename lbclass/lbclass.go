// Package lbclass is the one rule both vipcast binaries apply to decide
// whether vipcast serves a Service: its type and spec.loadBalancerClass
// against the class settings (--load-balancer-class,
// --serve-classless-services) the CCM and every speaker are given. The CCM
// allocates and publishes VIPs for exactly the Services a Selector serves,
// and the speakers announce and forward exactly those, so the two cannot
// disagree about a Service.
package lbclass

import (
	"errors"
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Flag names, the same in vipcast-ccm and vipcast-speaker.
const (
	// FlagClass names the spec.loadBalancerClass vipcast serves.
	FlagClass = "load-balancer-class"
	// FlagClassless says whether vipcast also serves Services without a
	// spec.loadBalancerClass.
	FlagClassless = "serve-classless-services"
)

// Selector says which Services of type LoadBalancer vipcast serves. The
// zero Selector serves the Services without a spec.loadBalancerClass and no
// class: what vipcast did before classes, and what the stock
// cloud-provider service controller does.
type Selector struct {
	// Class is the spec.loadBalancerClass served; "" serves no class.
	Class string
	// NoClassless leaves the Services without a spec.loadBalancerClass to
	// another implementation.
	NoClassless bool
}

// New builds a Selector from the two flags and checks it. serveClassless
// is the value of --serve-classless-services, or nil when the flag was not
// given: class-less Services are then served only when no class is. Errors
// name the flag at fault and how to fix it.
func New(class string, serveClassless *bool) (Selector, error) {
	s := Selector{Class: strings.TrimSpace(class)}
	if serveClassless != nil {
		s.NoClassless = !*serveClassless
	} else {
		s.NoClassless = s.Class != ""
	}
	return s, s.Validate()
}

// Validate reports a Selector that serves nothing or names a class the API
// server would refuse in spec.loadBalancerClass.
func (s Selector) Validate() error {
	if s.Class == "" {
		if s.NoClassless {
			return fmt.Errorf("--%s=false without --%s serves no Service: set --%s (such as vipcast.io/bgp) or drop --%s=false",
				FlagClassless, FlagClass, FlagClass, FlagClassless)
		}
		return nil
	}
	return ValidateClass(s.Class)
}

// ValidateClass checks a loadBalancerClass as Kubernetes does
// (a qualified name, like a label key) and requires the domain prefix that
// the API reserves for implementations: unprefixed names belong to end
// users. The error names --load-balancer-class and shows a valid value.
func ValidateClass(class string) error {
	errs := validation.IsQualifiedName(class)
	if len(errs) == 0 && !strings.Contains(class, "/") {
		errs = append(errs, "it has no domain prefix; unprefixed classes are reserved for end users")
	}
	if len(errs) > 0 {
		return fmt.Errorf("--%s=%q is not a valid spec.loadBalancerClass (%s): use a domain-prefixed name such as vipcast.io/bgp",
			FlagClass, class, strings.Join(errs, "; "))
	}
	return nil
}

// Serves reports whether vipcast serves svc.
func (s Selector) Serves(svc *v1.Service) bool { return s.Why(svc) == "" }

// Why returns why vipcast does not serve svc, or "" when it does: svc must
// be of type LoadBalancer and have the served class, or no class when
// class-less Services are served.
func (s Selector) Why(svc *v1.Service) string {
	if svc.Spec.Type != v1.ServiceTypeLoadBalancer {
		return "not a LoadBalancer Service"
	}
	c := svc.Spec.LoadBalancerClass
	switch {
	case c == nil && s.NoClassless:
		return "has no loadBalancerClass and class-less Services are not served (--" + FlagClassless + "=false)"
	case c == nil:
		return ""
	case *c != s.Class:
		return "handled by loadBalancerClass " + *c
	}
	return ""
}

// String describes the Selector for logs.
func (s Selector) String() string {
	switch {
	case s.Class == "":
		return "class-less Services"
	case s.NoClassless:
		return "loadBalancerClass " + s.Class
	}
	return "loadBalancerClass " + s.Class + " and class-less Services"
}

// errLeaseName is wrapped by LeaseName's errors.
var errLeaseName = errors.New("no valid lease name")

// LeaseName returns the leader-election Lease name of a CCM serving s:
// base alone without a class (the name before classes, so an upgrade keeps
// its lease), else base, "-" and the class with '/' and '_' turned into '-'
// and lowercased. So two CCMs serving different classes never block each
// other and two serving the same class do. A class that yields no valid
// Lease name is an error telling to set --leader-elect-resource-name.
func (s Selector) LeaseName(base string) (string, error) {
	if s.Class == "" {
		return base, nil
	}
	name := base + "-" + strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(s.Class))
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return "", fmt.Errorf("%w for --%s=%q: %q is not a Lease name (%s); set --leader-elect-resource-name to a name of your own, the same on every replica",
			errLeaseName, FlagClass, s.Class, name, strings.Join(errs, "; "))
	}
	return name, nil
}

// ServesClassOf reports whether svc's spec.loadBalancerClass (or its lack
// of one) is one the Selector serves, whatever svc's type: a Service vipcast
// served keeps its class when it stops being a LoadBalancer, and vipcast
// then cleans up after it.
func (s Selector) ServesClassOf(svc *v1.Service) bool {
	c := svc.Spec.LoadBalancerClass
	if c == nil {
		return !s.NoClassless
	}
	return s.Class != "" && *c == s.Class
}
