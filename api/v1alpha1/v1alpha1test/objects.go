// Package v1alpha1test builds vipcast.io/v1alpha1 objects for the tests of
// the packages that read them (poolspec, ccm, speaker), so that each does
// not carry its own copy of the fixtures.
package v1alpha1test

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vipcast/vipcast/api/v1alpha1"
)

// Epoch returns the creation time of a pool of age 0.
func Epoch() time.Time { return time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) }

// Pool returns an IPPool called name with the given addresses, created age
// seconds after Epoch (pool precedence goes by creation time).
func Pool(name string, age int, addrs ...string) *v1alpha1.IPPool {
	return &v1alpha1.IPPool{
		ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(Epoch().Add(time.Duration(age) * time.Second))},
		Spec:       v1alpha1.IPPoolSpec{Addresses: addrs},
	}
}

// WithBGP sets p's spec.bgp to b and returns p.
func WithBGP(p *v1alpha1.IPPool, b v1alpha1.IPPoolBGP) *v1alpha1.IPPool {
	p.Spec.BGP = &b
	return p
}

// WithAllocation sets p's spec.allocation to a and returns p.
func WithAllocation(p *v1alpha1.IPPool, a v1alpha1.IPPoolAllocation) *v1alpha1.IPPool {
	p.Spec.Allocation = &a
	return p
}
