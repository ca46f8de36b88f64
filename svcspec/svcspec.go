// Package svcspec reads what a Service's fields and annotations ask of
// vipcast's dataplane — its ports, the IPVS scheduler annotation, the
// source ranges — and what is wrong with them. It is pure and judges a
// Service alone, so vipcast-ccm reports a problem once for the cluster
// (Problems) while every speaker programs from the same reading.
package svcspec

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/vipcast/vipcast/ipvs"
)

// Problems returns what is wrong with the Service's ports, scheduler
// annotation and source ranges, each naming the field and the fix, in
// that order; none when all are usable.
func Problems(svc *v1.Service) []string {
	_, problems := Ports(svc)
	if _, _, p := Scheduler(svc); p != "" {
		problems = append(problems, p)
	}
	if _, _, p := SourceRanges(svc); p != "" {
		problems = append(problems, p)
	}
	return problems
}

// Port is a ServicePort as the dataplane needs it: its name (matched
// against the EndpointSlices' ports), number and protocol.
type Port struct {
	Name  string
	Port  uint16
	Proto ipvs.Protocol
}

// Ports returns the Service's usable ports sorted by port and
// protocol, one per port and protocol (the first wins), and a problem for
// each unusable one.
func Ports(svc *v1.Service) (ports []Port, problems []string) {
	ports = make([]Port, 0, len(svc.Spec.Ports))
	for i, sp := range svc.Spec.Ports {
		if sp.Port < 1 || sp.Port > 65535 {
			problems = append(problems, fmt.Sprintf("spec.ports[%d]: port %d is out of range 1-65535; it has no virtual server", i, sp.Port))
			continue
		}
		proto, err := ipvs.ParseProtocol(string(sp.Protocol))
		if err != nil {
			problems = append(problems, fmt.Sprintf("spec.ports[%d]: %v; it has no virtual server", i, err))
			continue
		}
		ports = append(ports, Port{Name: sp.Name, Port: uint16(sp.Port), Proto: proto})
	}
	slices.SortStableFunc(ports, comparePort)
	return slices.CompactFunc(ports, func(a, b Port) bool { return comparePort(a, b) == 0 }), problems
}

func comparePort(a, b Port) int {
	return cmp.Or(cmp.Compare(a.Port, b.Port), cmp.Compare(a.Proto, b.Proto))
}

// Scheduler returns the scheduler and flags of the Service's virtual
// servers from ipvs.SchedulerAnnotation: "" and 0 (the ipvs package's default)
// when unset, empty or invalid, and then, for an invalid value, the problem
// to report.
func Scheduler(svc *v1.Service) (sched string, flags uint32, problem string) {
	raw := strings.TrimSpace(svc.Annotations[ipvs.SchedulerAnnotation])
	if raw == "" {
		return "", 0, ""
	}
	sched, flags, err := ipvs.ParseScheduler(raw)
	if err != nil {
		return "", 0, fmt.Sprintf("%v; the virtual servers use the default scheduler (%s) until it is fixed", err, ipvs.DefaultScheduler)
	}
	return sched, flags, ""
}

// SourceRanges reads which clients a Service admits, as the cloud-provider
// helper (servicehelper.GetLoadBalancerSourceRanges) does:
// spec.loadBalancerSourceRanges when it lists any range, else the
// service.beta.kubernetes.io/load-balancer-source-ranges annotation (a
// comma-separated list), else every client (restricted false).
//
// A range that does not parse fails closed: the Service is restricted to
// the ranges that do parse, possibly none, and problem names the field
// and the fix. A range is masked to its prefix ("10.0.0.1/8" is
// 10.0.0.0/8), as kube-proxy reads it.
func SourceRanges(svc *v1.Service) (restricted bool, ranges []netip.Prefix, problem string) {
	field := "spec.loadBalancerSourceRanges"
	list := svc.Spec.LoadBalancerSourceRanges
	if len(list) == 0 {
		field = "annotation " + v1.AnnotationLoadBalancerSourceRangesKey
		val := strings.TrimSpace(svc.Annotations[v1.AnnotationLoadBalancerSourceRangesKey])
		if val == "" {
			return false, nil, ""
		}
		list = strings.Split(val, ",")
	}
	var bad []string
	for _, s := range list {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil || p.Addr().Zone() != "" {
			bad = append(bad, fmt.Sprintf("%q", s))
			continue
		}
		ranges = append(ranges, p.Masked())
	}
	if len(bad) > 0 {
		admits := "only the valid ranges"
		if len(ranges) == 0 {
			admits = "no client"
		}
		problem = fmt.Sprintf("%s: %s: not a source range (a CIDR such as 10.20.0.0/16 or 2001:db8::/48); the VIP admits %s until it is fixed",
			field, strings.Join(bad, ", "), admits)
	}
	return true, ranges, problem
}
