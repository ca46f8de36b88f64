package ccm

import (
	"context"
	"strings"

	v1 "k8s.io/api/core/v1"
	cloudprovider "k8s.io/cloud-provider"
	cloudproviderapi "k8s.io/cloud-provider/api"
)

// ProviderIDPrefix starts every provider ID vipcast gives a node:
// "vipcast://<node-name>".
const ProviderIDPrefix = ProviderName + "://"

// instances implements cloudprovider.InstancesV2 for machines vipcast does
// not manage: every node exists and runs; its metadata comes from the node
// itself, so nodes of a --cloud-provider=external cluster get initialized
// and lose the node.cloudprovider.kubernetes.io/uninitialized taint.
type instances struct{}

var _ cloudprovider.InstancesV2 = instances{}

// InstanceExists reports true: vipcast has no inventory to contradict the
// cluster, and false would make the node-lifecycle controller delete nodes.
func (instances) InstanceExists(context.Context, *v1.Node) (bool, error) { return true, nil }

// InstanceShutdown reports false: power state is not known to vipcast.
func (instances) InstanceShutdown(context.Context, *v1.Node) (bool, error) { return false, nil }

// InstanceMetadata returns the provider ID vipcast://<node>, the node's
// addresses (including those kubelet's --node-ip put in the
// alpha.kubernetes.io/provided-node-ip annotation) and the zone and region
// from the well-known topology labels, if set.
func (instances) InstanceMetadata(_ context.Context, node *v1.Node) (*cloudprovider.InstanceMetadata, error) {
	return &cloudprovider.InstanceMetadata{
		ProviderID:    ProviderIDPrefix + node.Name,
		InstanceType:  node.Labels[v1.LabelInstanceTypeStable],
		NodeAddresses: nodeAddresses(node),
		Zone:          node.Labels[v1.LabelTopologyZone],
		Region:        node.Labels[v1.LabelTopologyRegion],
	}, nil
}

// nodeAddresses returns the node's reported addresses plus an InternalIP for
// each address in the provided-node-ip annotation that is not among them.
func nodeAddresses(node *v1.Node) []v1.NodeAddress {
	addrs := append([]v1.NodeAddress(nil), node.Status.Addresses...)
	have := map[string]bool{}
	for _, a := range addrs {
		have[a.Address] = true
	}
	for _, ip := range strings.Split(node.Annotations[cloudproviderapi.AnnotationAlphaProvidedIPAddr], ",") {
		ip = strings.TrimSpace(ip)
		if ip != "" && !have[ip] {
			addrs = append(addrs, v1.NodeAddress{Type: v1.NodeInternalIP, Address: ip})
			have[ip] = true
		}
	}
	return addrs
}
