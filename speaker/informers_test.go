package speaker

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/util/workqueue"

	"github.com/vipcast/vipcast/api/v1alpha1"
)

// TestPasswordsFromSecretCache checks that BGP passwords come from the
// Secret informers of the password namespaces: a Secret there is read,
// its change is seen, its deletion makes it not found, and a Secret in
// another namespace is refused with a message naming the flag — all
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
	w, err := newWatched(Options{NodeName: "n1", Client: client, Dynamic: fakePool(t), PasswordNamespaces: []string{"bgp", "bgp"}}, q)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.start(t.Context()); err != nil {
		t.Fatal(err)
	}
	lookup := w.passwords()
	ref := &v1alpha1.SecretKeyReference{Namespace: "bgp", Name: "tor"}
	if got, err := lookup(ref); err != nil || got != "s3cret" {
		t.Fatalf("password = %q, %v; want s3cret", got, err)
	}
	cached, _, _ := w.secrets["bgp"].GetStore().GetByKey("bgp/tor")
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
	if got := len(client.Actions()) - requests; got != 2 {
		t.Errorf("the lookups made %d requests besides the test's update and delete; want none", got-2)
	}

	_, err = lookup(&v1alpha1.SecretKeyReference{Namespace: "default", Name: "tor"})
	if err == nil || !strings.Contains(err.Error(), "--bgp-password-namespaces") || !strings.Contains(err.Error(), "namespaces bgp") {
		t.Errorf("a Secret outside the password namespaces: err = %v; want one naming them and --bgp-password-namespaces", err)
	}
	none := &watched{}
	if _, err := none.passwords()(ref); err == nil || !strings.Contains(err.Error(), "--bgp-password-namespaces is empty") {
		t.Errorf("no password namespaces: err = %v; want one saying the flag is empty", err)
	}
}

// TestSameNodeAddress: a Node update wakes the speaker when the address
// of either family its tunnel addresses derive from changes, and only
// then.
func TestSameNodeAddress(t *testing.T) {
	node := func(addrs ...string) *v1.Node {
		n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
		for _, a := range addrs {
			n.Status.Addresses = append(n.Status.Addresses, v1.NodeAddress{Type: v1.NodeInternalIP, Address: a})
		}
		return n
	}
	for _, tc := range []struct {
		name     string
		old, cur *v1.Node
		same     bool
	}{
		{"unchanged", node("10.0.0.1", "fd00::1"), node("10.0.0.1", "fd00::1"), true},
		{"IPv4 changed", node("10.0.0.1", "fd00::1"), node("10.0.0.2", "fd00::1"), false},
		{"IPv6 changed", node("10.0.0.1", "fd00::1"), node("10.0.0.1", "fd00::2"), false},
		{"IPv6 added", node("10.0.0.1"), node("10.0.0.1", "fd00::1"), false},
	} {
		if got := sameNodeAddress(tc.old, tc.cur); got != tc.same {
			t.Errorf("%s: sameNodeAddress = %v, want %v", tc.name, got, tc.same)
		}
	}
}
