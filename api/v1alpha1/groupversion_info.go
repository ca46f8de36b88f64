package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the API group of all vipcast custom resources.
const GroupName = "vipcast.io"

// SchemeGroupVersion is the group and version of the types in this package.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: "v1alpha1"}

var (
	// SchemeBuilder collects the functions that register this package's
	// types into a runtime.Scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme registers IPPool, BGPPeer, SpeakerStatus, NodeTunnel
	// and their list types with a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// IPPoolsResource, BGPPeersResource, SpeakerStatusesResource and
// NodeTunnelsResource are the resources served for the CRDs, for dynamic
// clients and informers.
var (
	IPPoolsResource         = SchemeGroupVersion.WithResource("ippools")
	BGPPeersResource        = SchemeGroupVersion.WithResource("bgppeers")
	SpeakerStatusesResource = SchemeGroupVersion.WithResource("speakerstatuses")
	NodeTunnelsResource     = SchemeGroupVersion.WithResource("nodetunnels")
)

// Kind returns the group-qualified kind for an unqualified kind name.
func Kind(kind string) schema.GroupKind {
	return SchemeGroupVersion.WithKind(kind).GroupKind()
}

// Resource returns the group-qualified resource for an unqualified resource
// name (for example "ippools").
func Resource(resource string) schema.GroupResource {
	return SchemeGroupVersion.WithResource(resource).GroupResource()
}

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(SchemeGroupVersion,
		&IPPool{},
		&IPPoolList{},
		&BGPPeer{},
		&BGPPeerList{},
		&SpeakerStatus{},
		&SpeakerStatusList{},
		&NodeTunnel{},
		&NodeTunnelList{},
	)
	metav1.AddToGroupVersion(scheme, SchemeGroupVersion)
	return nil
}
