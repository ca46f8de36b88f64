// Package v1alpha1 contains the vipcast.io/v1alpha1 API: the IPPool and
// BGPPeer custom resources that configure which virtual IPs vipcast hands
// out to LoadBalancer Services and how it announces them over BGP.
//
// Both kinds are cluster-scoped. Structural validation is expressed as
// kubebuilder markers and compiled into OpenAPI and CEL
// (x-kubernetes-validations) rules in the CustomResourceDefinitions under
// charts/vipcast/crds; run hack/generate.sh after changing these types.
//
// +kubebuilder:object:generate=true
// +groupName=vipcast.io
package v1alpha1
