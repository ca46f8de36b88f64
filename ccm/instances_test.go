package ccm

import (
	"context"
	"reflect"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// providedNodeIP is the annotation kubelet's --node-ip writes on a node of
// a --cloud-provider=external cluster.
const providedNodeIP = "alpha.kubernetes.io/provided-node-ip"

// newNode returns node "n1" with the given status addresses and, when
// provided is not nil, the provided-node-ip annotation set to *provided.
func newNode(provided *string, addresses ...v1.NodeAddress) *v1.Node {
	node := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1"},
		Status:     v1.NodeStatus{Addresses: addresses},
	}
	if provided != nil {
		node.Annotations = map[string]string{providedNodeIP: *provided}
	}
	return node
}

// internal returns an InternalIP node address.
func internal(ip string) v1.NodeAddress { return v1.NodeAddress{Type: v1.NodeInternalIP, Address: ip} }

func TestInstanceExistsAndShutdown(t *testing.T) {
	ctx := context.Background()
	node := newNode(nil)
	exists, err := instances{}.InstanceExists(ctx, node)
	if err != nil || !exists {
		t.Errorf("InstanceExists = %v, %v; want true, nil", exists, err)
	}
	shutdown, err := instances{}.InstanceShutdown(ctx, node)
	if err != nil || shutdown {
		t.Errorf("InstanceShutdown = %v, %v; want false, nil", shutdown, err)
	}
}

func TestInstanceMetadata(t *testing.T) {
	tests := []struct {
		name                 string
		labels               map[string]string
		wantZone, wantRegion string
		wantInstanceType     string
	}{
		{name: "no topology labels"},
		{
			name: "well-known labels",
			labels: map[string]string{
				"topology.kubernetes.io/zone":      "eu-west-1a",
				"topology.kubernetes.io/region":    "eu-west-1",
				"node.kubernetes.io/instance-type": "m5.large",
			},
			wantZone: "eu-west-1a", wantRegion: "eu-west-1", wantInstanceType: "m5.large",
		},
		{
			name: "deprecated beta labels are ignored",
			labels: map[string]string{
				"failure-domain.beta.kubernetes.io/zone":   "old-zone",
				"failure-domain.beta.kubernetes.io/region": "old-region",
				"beta.kubernetes.io/instance-type":         "old-type",
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			provided := "10.0.0.1,fd00::1"
			node := newNode(&provided, internal("10.0.0.1"), v1.NodeAddress{Type: v1.NodeHostName, Address: "n1"})
			node.Labels = tc.labels
			md, err := instances{}.InstanceMetadata(context.Background(), node)
			if err != nil {
				t.Fatalf("InstanceMetadata: %v", err)
			}
			if md.ProviderID != "vipcast://n1" {
				t.Errorf("ProviderID = %q, want %q", md.ProviderID, "vipcast://n1")
			}
			if md.Zone != tc.wantZone || md.Region != tc.wantRegion || md.InstanceType != tc.wantInstanceType {
				t.Errorf("zone, region, type = %q, %q, %q; want %q, %q, %q",
					md.Zone, md.Region, md.InstanceType, tc.wantZone, tc.wantRegion, tc.wantInstanceType)
			}
			want := []v1.NodeAddress{internal("10.0.0.1"), {Type: v1.NodeHostName, Address: "n1"}, internal("fd00::1")}
			if !reflect.DeepEqual(md.NodeAddresses, want) {
				t.Errorf("NodeAddresses = %v, want %v", md.NodeAddresses, want)
			}
		})
	}
}

func TestNodeAddresses(t *testing.T) {
	str := func(s string) *string { return &s }
	external := v1.NodeAddress{Type: v1.NodeExternalIP, Address: "203.0.113.5"}
	hostname := v1.NodeAddress{Type: v1.NodeHostName, Address: "n1"}
	tests := []struct {
		name     string
		provided *string
		status   []v1.NodeAddress
		want     []v1.NodeAddress
	}{
		{name: "nothing"},
		{
			name:   "no annotation keeps status addresses",
			status: []v1.NodeAddress{internal("10.0.0.1"), hostname},
			want:   []v1.NodeAddress{internal("10.0.0.1"), hostname},
		},
		{
			name:     "empty annotation adds nothing",
			provided: str(""),
			status:   []v1.NodeAddress{hostname},
			want:     []v1.NodeAddress{hostname},
		},
		{
			name:     "provided IP on a node without addresses",
			provided: str("10.0.0.1"),
			want:     []v1.NodeAddress{internal("10.0.0.1")},
		},
		{
			name:     "provided IP already reported is not repeated",
			provided: str("10.0.0.1"),
			status:   []v1.NodeAddress{internal("10.0.0.1"), hostname},
			want:     []v1.NodeAddress{internal("10.0.0.1"), hostname},
		},
		{
			name:     "provided IP already reported as another type is not repeated",
			provided: str("203.0.113.5"),
			status:   []v1.NodeAddress{external},
			want:     []v1.NodeAddress{external},
		},
		{
			name:     "dual stack with spaces, missing family added",
			provided: str(" 10.0.0.1 , fd00::1 "),
			status:   []v1.NodeAddress{internal("10.0.0.1"), hostname},
			want:     []v1.NodeAddress{internal("10.0.0.1"), hostname, internal("fd00::1")},
		},
		{
			name:     "dual stack both new, in annotation order",
			provided: str("fd00::1,10.0.0.1"),
			status:   []v1.NodeAddress{hostname},
			want:     []v1.NodeAddress{hostname, internal("fd00::1"), internal("10.0.0.1")},
		},
		{
			name:     "repeated and empty entries added once",
			provided: str("10.0.0.1,,10.0.0.1,"),
			want:     []v1.NodeAddress{internal("10.0.0.1")},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			node := newNode(tc.provided, tc.status...)
			before := append([]v1.NodeAddress(nil), node.Status.Addresses...)
			got := nodeAddresses(node)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("nodeAddresses = %v, want %v", got, tc.want)
			}
			if !reflect.DeepEqual(node.Status.Addresses, before) {
				t.Errorf("nodeAddresses modified node.Status.Addresses: %v, was %v", node.Status.Addresses, before)
			}
		})
	}
}
