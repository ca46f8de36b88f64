package speaker

import (
	"fmt"
	"maps"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/vipcast/vipcast/api/v1alpha1"
)

// TestPasswordsFromSecretCache checks that BGP passwords come from the
// Secret informers of the named Secrets: each lists and watches its own
// namespace with the field selector metadata.name=<name> (what RBAC
// resourceNames allow), a named Secret is read, its change is seen, its
// deletion makes it not found, and its creation found again — all
// without a request of the lookup's own.
func TestPasswordsFromSecretCache(t *testing.T) {
	secret := &v1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "tor", Namespace: "bgp",
			Annotations: map[string]string{"kubectl.kubernetes.io/last-applied-configuration": "copy of the data"}},
		Data: map[string][]byte{"password": []byte("s3cret")},
	}
	client := fake.NewClientset(secret)
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
	defer q.ShutDown()
	tor := types.NamespacedName{Namespace: "bgp", Name: "tor"}
	bfdKey := types.NamespacedName{Namespace: "fabric", Name: "tor-bfd"}
	w, err := newWatched(Options{NodeName: "n1", Client: client, Dynamic: fakePool(t), PasswordSecrets: []types.NamespacedName{tor, bfdKey, tor}}, q)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.start(t.Context()); err != nil {
		t.Fatal(err)
	}
	// One list and one watch per named Secret (the duplicate ignored), in
	// its namespace, by its name.
	selectors := func() map[string]int {
		out := map[string]int{}
		for _, a := range client.Actions() {
			if a.GetResource().Resource != "secrets" {
				continue
			}
			var sel string
			switch a := a.(type) {
			case k8stesting.ListAction:
				sel = a.GetListRestrictions().Fields.String()
			case k8stesting.WatchAction:
				sel = a.GetWatchRestrictions().Fields.String()
			}
			out[a.GetVerb()+" "+a.GetNamespace()+" "+sel]++
		}
		return out
	}
	want := map[string]int{"list bgp metadata.name=tor": 1, "watch bgp metadata.name=tor": 1,
		"list fabric metadata.name=tor-bfd": 1, "watch fabric metadata.name=tor-bfd": 1}
	eventually(t, "a list and a watch of each named Secret", func() bool { return maps.Equal(selectors(), want) },
		func() string { return fmt.Sprint(selectors(), ", want ", want) })

	lookup := w.passwords()
	ref := &v1alpha1.SecretKeyReference{Namespace: "bgp", Name: "tor"}
	if got, err := lookup(ref); err != nil || got != "s3cret" {
		t.Fatalf("password = %q, %v; want s3cret", got, err)
	}
	cached, _, _ := w.secrets[tor].GetStore().GetByKey("bgp/tor")
	if s := cached.(*v1.Secret); len(s.Annotations) != 0 {
		t.Errorf("the cached Secret keeps annotations %v; want only name, namespace and data", s.Annotations)
	}
	requests := len(client.Actions())

	secret.Data["password"] = []byte("changed")
	if _, err := client.CoreV1().Secrets("bgp").Update(t.Context(), secret, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the changed password", func() bool { got, _ := lookup(ref); return got == "changed" }, func() string { return "" })
	if err := client.CoreV1().Secrets("bgp").Delete(t.Context(), "tor", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the deletion", func() bool {
		_, err := lookup(ref)
		return err != nil && strings.Contains(err.Error(), "secret bgp/tor not found")
	}, func() string { return "" })
	// A named Secret created after the start (the BFD key here) is read
	// from the watch.
	bfdRef := &v1alpha1.SecretKeyReference{Namespace: "fabric", Name: "tor-bfd", Key: "key"}
	if _, err := lookup(bfdRef); err == nil || !strings.Contains(err.Error(), "secret fabric/tor-bfd not found") {
		t.Errorf("the BFD key before its Secret exists: err = %v, want not found", err)
	}
	if _, err := client.CoreV1().Secrets("fabric").Create(t.Context(), &v1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "tor-bfd", Namespace: "fabric"}, Data: map[string][]byte{"key": []byte("k")},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the created BFD key", func() bool { got, _ := lookup(bfdRef); return got == "k" }, func() string { return "" })
	if got := len(client.Actions()) - requests; got != 3 {
		t.Errorf("the lookups made %d requests besides the test's update, delete and create; want none", got-3)
	}
}

// TestPasswordNotInList: a BGPPeer whose password or BFD key names a
// Secret the speaker was not told to read, another one of a password
// namespace included, is left out with SecretNotFound and a message that
// names the Secret, the Secrets it reads and the fix: the flag and the
// chart value.
func TestPasswordNotInList(t *testing.T) {
	w := &watched{secrets: map[types.NamespacedName]cache.SharedIndexInformer{
		{Namespace: "bgp", Name: "tor"}: cache.NewSharedIndexInformer(&cache.ListWatch{}, &v1.Secret{}, 0, cache.Indexers{}),
	}}
	md5 := mkPeer("md5", "10.0.0.250", nil)
	md5.Spec.PasswordSecretRef = &v1alpha1.SecretKeyReference{Namespace: "bgp", Name: "tor-b"}
	bfdAuth := mkPeer("bfd", "10.0.0.251", nil)
	bfdAuth.Spec.BFD = &v1alpha1.BFDConfig{Authentication: &v1alpha1.BFDAuthentication{Type: v1alpha1.BFDAuthKeyedSHA1,
		SecretRef: v1alpha1.SecretKeyReference{Namespace: "fabric", Name: "tor-bfd", Key: "key"}}}
	got, errs := PeersForNode([]*v1alpha1.BGPPeer{md5, bfdAuth}, testNode(), w.passwords())
	if len(got) != 0 || len(errs) != 2 {
		t.Fatalf("peers %v, problems %v; want both left out", got, errs)
	}
	want := map[string][]string{
		"md5": {"spec.passwordSecretRef", "secret bgp/tor-b is not one the speaker may read (it reads bgp/tor)",
			"add bgp/tor-b to the speaker's --bgp-password-secrets (chart value speaker.bgpPasswordSecrets.secrets)"},
		"bfd": {"spec.bfd.authentication.secretRef", "secret fabric/tor-bfd is not one the speaker may read",
			"add fabric/tor-bfd to the speaker's --bgp-password-secrets (chart value speaker.bgpPasswordSecrets.secrets)"},
	}
	for _, e := range errs {
		if e.Reason != v1alpha1.ReasonSecretNotFound {
			t.Errorf("%s: reason %s, want %s", e.Peer, e.Reason, v1alpha1.ReasonSecretNotFound)
		}
		for _, s := range want[e.Peer] {
			if !strings.Contains(e.Message, s) {
				t.Errorf("%s: %q does not contain %q", e.Peer, e.Message, s)
			}
		}
	}

	none := &watched{}
	if _, err := none.passwords()(md5.Spec.PasswordSecretRef); err == nil || !strings.Contains(err.Error(), "it reads none: --bgp-password-secrets is empty") {
		t.Errorf("no password Secrets: err = %v; want one saying the flag is empty", err)
	}
	many := &watched{secrets: map[types.NamespacedName]cache.SharedIndexInformer{}}
	for i := range 7 {
		many.secrets[types.NamespacedName{Namespace: "bgp", Name: fmt.Sprintf("tor-%d", i)}] = nil
	}
	if _, err := many.passwords()(md5.Spec.PasswordSecretRef); err == nil || !strings.Contains(err.Error(), "(it reads bgp/tor-0, bgp/tor-1, bgp/tor-2, bgp/tor-3, bgp/tor-4, and 2 more)") {
		t.Errorf("seven password Secrets: err = %v; want five named and the other two counted", err)
	}
}

// TestSameTunnelAddressAndAnnounces: another node's NodeTunnel update
// wakes the speaker when the address of either family its tunnel
// addresses derive from changes (sameTunnelAddress), or whether it
// announces (sameAnnounces), and only then; an object that does not decode
// counts as changed.
func TestSameTunnelAddressAndAnnounces(t *testing.T) {
	tunnel := func(announces bool, addrs ...string) any {
		u := tunnelObject("n2", announces, addrs...)
		u.SetResourceVersion(fmt.Sprint(len(addrs)))
		return u
	}
	labelled := tunnel(true, "10.0.0.1").(*unstructured.Unstructured).DeepCopy()
	labelled.SetLabels(map[string]string{"team": "net"})
	malformed := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "vipcast.io/v1alpha1", "kind": "NodeTunnel",
		"metadata": map[string]any{"name": "n2"}, "spec": map[string]any{"announces": "yes"},
	}}
	for _, tc := range []struct {
		name              string
		old, cur          any
		sameAddr, sameAnn bool
	}{
		{"unchanged", tunnel(true, "10.0.0.1", "fd00::1"), tunnel(true, "10.0.0.1", "fd00::1"), true, true},
		{"metadata only", tunnel(true, "10.0.0.1"), labelled, true, true},
		{"IPv4 changed", tunnel(true, "10.0.0.1", "fd00::1"), tunnel(true, "10.0.0.2", "fd00::1"), false, true},
		{"IPv6 changed", tunnel(true, "10.0.0.1", "fd00::1"), tunnel(true, "10.0.0.1", "fd00::2"), false, true},
		{"IPv6 added", tunnel(true, "10.0.0.1"), tunnel(true, "10.0.0.1", "fd00::1"), false, true},
		{"stops announcing", tunnel(true, "10.0.0.1"), tunnel(false, "10.0.0.1"), true, false},
		{"does not decode", tunnel(true, "10.0.0.1"), malformed, false, false},
	} {
		if got := sameTunnelAddress(tc.old, tc.cur); got != tc.sameAddr {
			t.Errorf("%s: sameTunnelAddress = %v, want %v", tc.name, got, tc.sameAddr)
		}
		if got := sameAnnounces(tc.old, tc.cur); got != tc.sameAnn {
			t.Errorf("%s: sameAnnounces = %v, want %v", tc.name, got, tc.sameAnn)
		}
	}
}

// TestSameNode: an update of this node's Node wakes the speaker (a full
// recompute of routes and dataplane) when anything the decisions read
// changes: its zone, which topology hints follow, among them; a status
// heartbeat does not.
func TestSameNode(t *testing.T) {
	node := func(mutate func(*v1.Node)) *v1.Node {
		n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{v1.LabelTopologyZone: "a"}}}
		n.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "10.0.0.1"}}
		if mutate != nil {
			mutate(n)
		}
		return n
	}
	for _, tc := range []struct {
		name   string
		mutate func(*v1.Node)
		same   bool
	}{
		{"unchanged", nil, true},
		{"heartbeat", func(n *v1.Node) {
			n.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, LastHeartbeatTime: metav1.Now()}}
		}, true},
		{"zone changed", func(n *v1.Node) { n.Labels[v1.LabelTopologyZone] = "b" }, false},
		{"zone removed", func(n *v1.Node) { delete(n.Labels, v1.LabelTopologyZone) }, false},
		{"cordoned", func(n *v1.Node) { n.Spec.Unschedulable = true }, false},
		{"excluded", func(n *v1.Node) { n.Labels[LabelExcludeFromExternalLB] = "" }, false},
		{"local ASN", func(n *v1.Node) { n.Annotations = map[string]string{AnnotationLocalASN: "64600"} }, false},
	} {
		if got := sameNode(node(nil), node(tc.mutate)); got != tc.same {
			t.Errorf("%s: sameNode = %v, want %v", tc.name, got, tc.same)
		}
	}
}

// TestSlimObject: what the informers cache lacks managedFields, kubectl's
// last-applied annotation and a Node's image and volume lists, and keeps
// everything the speaker reads.
func TestSlimObject(t *testing.T) {
	mf := []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply}}
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "web", ManagedFields: mf, Annotations: map[string]string{
		v1.LastAppliedConfigAnnotation: `{"big":"json"}`, "vipcast.io/pool": "vips"}}}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", ManagedFields: mf, Labels: map[string]string{"rack": "r1"}},
		Status: v1.NodeStatus{
			Addresses:    []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "10.0.0.1"}},
			Images:       []v1.ContainerImage{{Names: []string{"registry.example/app:v1"}, SizeBytes: 1 << 20}},
			VolumesInUse: []v1.UniqueVolumeName{"kubernetes.io/csi/x"},
		}}
	pool := &unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{"name": "vips",
		"managedFields": []any{map[string]any{"manager": "kubectl"}}}, "spec": map[string]any{"addresses": []any{"10.0.0.0/24"}}}}

	for _, obj := range []any{svc, node, pool, cache.DeletedFinalStateUnknown{Key: "web/a", Obj: svc.DeepCopy()}} {
		got, err := slimObject(obj)
		if err != nil {
			t.Fatal(err)
		}
		if d, ok := got.(cache.DeletedFinalStateUnknown); ok {
			got = d.Obj
		}
		m, err := meta.Accessor(got)
		if err != nil {
			t.Fatal(err)
		}
		if m.GetManagedFields() != nil || m.GetAnnotations()[v1.LastAppliedConfigAnnotation] != "" {
			t.Errorf("%s: managedFields %v, annotations %v", m.GetName(), m.GetManagedFields(), m.GetAnnotations())
		}
	}
	if svc.Annotations["vipcast.io/pool"] != "vips" {
		t.Errorf("the Service's own annotations: %v", svc.Annotations)
	}
	if node.Status.Images != nil || node.Status.VolumesInUse != nil || len(node.Status.Addresses) != 1 || node.Labels["rack"] != "r1" {
		t.Errorf("node status %+v, labels %v: want the addresses and labels only", node.Status, node.Labels)
	}
	if addrs, _, _ := unstructured.NestedSlice(pool.Object, "spec", "addresses"); len(addrs) != 1 {
		t.Errorf("the pool's spec: %v", pool.Object)
	}
}
