//go:build controlplane

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/ccm"
	"github.com/vipcast/vipcast/metallbimport"
	"github.com/vipcast/vipcast/poolspec"
	"github.com/vipcast/vipcast/test/ccmtest"
	"github.com/vipcast/vipcast/test/controlplane"
)

// metallbConfig is a MetalLB configuration in MetalLB's namespace: a pool
// announced over BGP with a community by alias to one named peer, which
// reads its password from a Secret and runs BFD; a peer at the older
// v1beta1 with a plain-text password; a pool announced by L2 only.
const metallbConfig = `apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {name: public, namespace: metallb-system}
spec:
  addresses: [192.0.2.0/24, 198.51.100.10-198.51.100.20]
  avoidBuggyIPs: true
  serviceAllocation: {priority: 10, namespaces: [web]}
---
apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {name: l2only, namespace: metallb-system}
spec: {addresses: [203.0.113.0/28]}
---
apiVersion: metallb.io/v1beta1
kind: BGPAdvertisement
metadata: {name: public-tor-a, namespace: metallb-system}
spec: {ipAddressPools: [public], communities: [NO_EXPORT], peers: [tor-a]}
---
apiVersion: metallb.io/v1beta1
kind: L2Advertisement
metadata: {name: l2, namespace: metallb-system}
spec: {ipAddressPools: [l2only]}
---
apiVersion: metallb.io/v1beta1
kind: Community
metadata: {name: aliases, namespace: metallb-system}
spec: {communities: [{name: NO_EXPORT, value: '65535:65281'}]}
---
apiVersion: metallb.io/v1beta1
kind: BFDProfile
metadata: {name: fast, namespace: metallb-system}
spec: {receiveInterval: 200, transmitInterval: 200, detectMultiplier: 4}
---
apiVersion: metallb.io/v1beta2
kind: BGPPeer
metadata: {name: tor-a, namespace: metallb-system}
spec: {myASN: 64501, peerASN: 64500, peerAddress: 10.0.0.1, holdTime: 9s, passwordSecret: {name: tor-a-md5}, bfdProfile: fast}
---
apiVersion: metallb.io/v1beta1
kind: BGPPeer
metadata: {name: tor-b, namespace: metallb-system}
spec: {myASN: 64501, peerASN: 64500, peerAddress: 10.0.0.2, password: s3cret}
`

// TestFromMetalLB runs `kubectl vipcast import metallb` through the real
// kubectl against MetalLB's own CRDs (v0.15.2) on a real API server: it
// reads MetalLB's configuration from the cluster and prints its
// translation, names what it leaves behind, refuses an advertisement it
// cannot translate, and with --apply creates objects the API server's
// validation and vipcast-ccm accept: the pool is Ready. Then vipcast-ccm
// honours MetalLB's request annotations on a Service, and refuses, with
// an Event naming both, two spellings that disagree.
func TestFromMetalLB(t *testing.T) {
	t.Parallel() // control plane and vipcast-ccm only (see TestMain)
	e := newEnv(t)
	ctx := context.Background()
	crds, err := filepath.Glob("testdata/metallb-v0.15.2-crds/*.yaml")
	if err != nil || len(crds) != 6 {
		t.Fatalf("MetalLB's CRDs: %v %v", crds, err)
	}
	if err := e.CP.InstallCRDs(ctx, crds); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{metallbimport.DefaultNamespace, metallbimport.DefaultPasswordNamespace} {
		if _, err := e.CP.Client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, doc := range splitYAML(metallbConfig) {
		obj := mustUnstructured(t, doc)
		gv, _ := schema.ParseGroupVersion(obj.GetAPIVersion())
		gvr := gv.WithResource(strings.ToLower(obj.GetKind()) + "s")
		if obj.GetKind() == "Community" {
			gvr.Resource = "communities"
		}
		e.Eventually(30*time.Second, "MetalLB's "+obj.GetKind()+" "+obj.GetName()+" created", func() (bool, error) {
			_, err := e.CP.Dynamic.Resource(gvr).Namespace(obj.GetNamespace()).Create(ctx, obj, metav1.CreateOptions{})
			return err == nil, err
		})
	}

	out, err := importMetalLB(e)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{
		"kind: IPPool", "name: public", "- 65535:65281", "values:\n        - tor-a",
		"kind: BGPPeer", "name: tor-b", "minRx: 200ms", "multiplier: 4",
		"kind: Secret", "name: tor-b-bgp-password",
		"# note: L2Advertisement metallb-system/l2: not carried over",
		"# note: IPAddressPool metallb-system/l2only: not translated",
		"speaker.bgpPasswordSecrets.secrets: [metallb-system/tor-a-md5, vipcast-bgp-passwords/tor-b-bgp-password]",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the translation lacks %q:\n%s", want, out)
		}
	}

	// An advertisement it cannot translate: refused, naming it, and
	// nothing printed or created.
	bad := mustUnstructured(t, "apiVersion: metallb.io/v1beta1\nkind: BGPAdvertisement\nmetadata: {name: bad, namespace: metallb-system}\nspec: {ipAddressPools: [public], communities: [NOPE]}\n")
	adGVR := schema.GroupVersionResource{Group: metallbimport.Group, Version: "v1beta1", Resource: "bgpadvertisements"}
	if _, err := e.CP.Dynamic.Resource(adGVR).Namespace(metallbimport.DefaultNamespace).Create(ctx, bad, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	out, err = importMetalLB(e, "--apply")
	if err == nil || !strings.Contains(out, `BGPAdvertisement metallb-system/bad: spec.communities[0]: "NOPE" is neither`) || strings.Contains(out, "applied") {
		t.Errorf("an advertisement with an unknown community: %v\n%s\nwant a refusal naming it, nothing applied", err, out)
	}
	if err := e.CP.Dynamic.Resource(adGVR).Namespace(metallbimport.DefaultNamespace).Delete(ctx, "bad", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	e.StartCCM("a")
	out, err = importMetalLB(e, "--apply")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"secret/tor-b-bgp-password applied", "bgppeer/tor-a applied", "bgppeer/tor-b applied", "ippool/public applied"} {
		if !strings.Contains(out, want) {
			t.Errorf("--apply printed no %q:\n%s", want, out)
		}
	}
	e.Eventually(30*time.Second, "vipcast-ccm admits the imported pool (Ready True)", func() (bool, error) {
		u, err := e.CP.Dynamic.Resource(vipcastv1alpha1.IPPoolsResource).Get(ctx, "public", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, c := range conds {
			if m, ok := c.(map[string]any); ok && m["type"] == "Ready" {
				return m["status"] == "True", fmt.Errorf("Ready %v: %v", m["status"], m["message"])
			}
		}
		return false, fmt.Errorf("no Ready condition yet")
	})
	peer, err := e.CP.Dynamic.Resource(vipcastv1alpha1.BGPPeersResource).Get(ctx, "tor-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if peer.GetLabels()[metallbimport.PeerLabel] != "tor-a" || peer.GetAnnotations()[metallbimport.ImportedFrom] != "metallb.io/v1beta2 BGPPeer metallb-system/tor-a" {
		t.Errorf("BGPPeer tor-a: labels %v, annotations %v", peer.GetLabels(), peer.GetAnnotations())
	}
	// Applying again changes nothing and fails nothing (server-side apply
	// by the same manager).
	if out, err := importMetalLB(e, "--apply"); err != nil {
		t.Errorf("a second --apply: %v\n%s", err, out)
	}

	// MetalLB's request annotations, on the imported pool: the address
	// and the pool asked for in MetalLB's spelling are given; a vipcast
	// spelling that disagrees is an Event naming both, and the VIP stays.
	e.Namespace("web", nil)
	e.createService(ccmtest.LBService("web", "shop", withAnnotation("metallb.io/loadBalancerIPs", "192.0.2.77"), withAnnotation("metallb.universe.tf/address-pool", "public"), withPorts(80)))
	vip := e.waitVIP("web", "shop")
	if vip != netip.MustParseAddr("192.0.2.77") {
		t.Fatalf("VIP %s, want 192.0.2.77 as metallb.io/loadBalancerIPs asks", vip)
	}
	e.Eventually(30*time.Second, "the pool recorded, not written again in vipcast's spelling", func() (bool, error) {
		svc, err := e.CP.Client.CoreV1().Services("web").Get(ctx, "shop", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		_, doubled := svc.Annotations[ccm.AnnotationPool]
		return svc.Annotations[poolspec.AnnotationAllocatedFrom] == "public" && !doubled, fmt.Errorf("annotations %v", svc.Annotations)
	})
	e.patchService("web", "shop", `{"metadata":{"annotations":{"vipcast.io/ips":"192.0.2.78"}}}`)
	e.waitEventReason("web", "shop", v1.EventTypeWarning, "SyncLoadBalancerFailed", `annotations vipcast.io/ips "192.0.2.78" and metallb.io/loadBalancerIPs "192.0.2.77" ask for different things`)
	e.keepsVIP(3*time.Second, "web", "shop", vip)
}

// importMetalLB runs `kubectl vipcast import metallb args...` through the
// real kubectl and returns its output.
func importMetalLB(e *env, args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(controlplane.BinDir(), "kubectl"), append([]string{"vipcast", "import", "metallb"}, args...)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+e.CP.Kubeconfig,
		"PATH="+filepath.Dir(pluginBinary)+string(os.PathListSeparator)+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	return string(out), err
}
