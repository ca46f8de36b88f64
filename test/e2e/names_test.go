//go:build controlplane

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Stand-ins for other products' CRDs that clusters run beside vipcast:
// Calico's ippools and bgppeers, Cilium's LB-IPAM pools (short names
// ippools and ippool) and MetalLB's bgppeers, with the names those
// products register (schemas left open).
const otherProductsCRDs = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: ippools.crd.projectcalico.org}
spec:
  group: crd.projectcalico.org
  scope: Cluster
  names: {plural: ippools, singular: ippool, kind: IPPool, listKind: IPPoolList}
  versions: [{name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}}]
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: ciliumloadbalancerippools.cilium.io}
spec:
  group: cilium.io
  scope: Cluster
  names: {plural: ciliumloadbalancerippools, singular: ciliumloadbalancerippool, kind: CiliumLoadBalancerIPPool, listKind: CiliumLoadBalancerIPPoolList, shortNames: [ippools, ippool, lbippool, lbippools], categories: [cilium]}
  versions: [{name: v2, served: true, storage: true, schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}}]
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: bgppeers.metallb.io}
spec:
  group: metallb.io
  scope: Namespaced
  names: {plural: bgppeers, singular: bgppeer, kind: BGPPeer, listKind: BGPPeerList}
  versions: [{name: v1beta2, served: true, storage: true, schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}}]
`

// TestResourceNames: beside other products' CRDs, kubectl's short forms
// of "ippools"/"bgppeers" may name another product's resource; the
// qualified names and vipcast's own short names (vippool(s), vippeer(s),
// vipspeaker(s)) always name vipcast's, and the category vipcast lists
// exactly vipcast's objects. The real kubectl resolves every name.
func TestResourceNames(t *testing.T) {
	t.Parallel() // control plane and vipcast-ccm only (see TestMain)
	e := newEnv(t)
	dir := t.TempDir()
	var files []string // InstallCRDs reads one CRD per file
	for i, doc := range strings.Split(otherProductsCRDs, "---\n") {
		f := filepath.Join(dir, fmt.Sprintf("other-%d.yaml", i))
		if err := os.WriteFile(f, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	if err := e.CP.InstallCRDs(context.Background(), files); err != nil {
		t.Fatal(err)
	}
	calico := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "crd.projectcalico.org/v1", "kind": "IPPool", "metadata": map[string]any{"name": "calico-pool"},
	}}
	gvr := schema.GroupVersionResource{Group: "crd.projectcalico.org", Version: "v1", Resource: "ippools"}
	e.Eventually(30*time.Second, "Calico's stand-in pool created", func() (bool, error) {
		_, err := e.CP.Dynamic.Resource(gvr).Create(context.Background(), calico, metav1.CreateOptions{})
		return err == nil, err
	})
	e.mustApplyPools("apiVersion: vipcast.io/v1alpha1\nkind: IPPool\nmetadata: {name: vips}\nspec: {addresses: [10.100.0.0/28]}\n")
	e.applyPeer(peerDoc("tor", netip.MustParseAddr("192.0.2.1"), 179, 64500, 64501, ""))

	// Qualified and vipcast-only names.
	for _, name := range []string{"ippools.vipcast.io", "vippool", "vippools"} {
		e.kubectlWants([]string{"get", name, "-o", "name"}, "ippool.vipcast.io/vips")
	}
	for _, name := range []string{"bgppeers.vipcast.io", "vippeer", "vippeers"} {
		e.kubectlWants([]string{"get", name, "-o", "name"}, "bgppeer.vipcast.io/tor")
	}
	// The docs' explain commands, qualified.
	for res, field := range map[string]string{"ippools.vipcast.io.spec": "addresses", "bgppeers.vipcast.io.spec": "peerAddress"} {
		lines := e.kubectl("explain", res)
		if !slices.ContainsFunc(lines, func(l string) bool { return strings.Contains(l, field) }) {
			t.Errorf("kubectl explain %s: no field %s in %q", res, field, lines)
		}
	}
	// The category lists vipcast's kinds and no other product's.
	e.kubectlWants([]string{"get", "vipcast", "-o", "name"}, "ippool.vipcast.io/vips", "bgppeer.vipcast.io/tor")
	e.kubectlLacks([]string{"get", "vipcast", "-o", "name"}, "ippool.crd.projectcalico.org/calico-pool")
	// Why the docs qualify: here the bare forms name Calico's pools (and
	// Cilium's pools claim them as short names), so vipcast's pool is not
	// among what they list.
	for _, short := range []string{"ippool", "ippools"} {
		e.kubectlWants([]string{"get", short, "-o", "name"}, "ippool.crd.projectcalico.org/calico-pool")
		e.kubectlLacks([]string{"get", short, "-o", "name"}, "ippool.vipcast.io/vips")
	}
}
