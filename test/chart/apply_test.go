//go:build controlplane

package chart

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/test/controlplane"
)

// serviceMonitorCRD stands in for the Prometheus Operator's CRD, which is
// not part of this repository: it only makes the API serve the kind, so the
// chart's ServiceMonitors can be created (their content is not validated).
func serviceMonitorCRD() *apiextensionsv1.CustomResourceDefinition {
	preserve := true
	return &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "servicemonitors.monitoring.coreos.com"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "monitoring.coreos.com",
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "servicemonitors", Singular: "servicemonitor", Kind: "ServiceMonitor", ListKind: "ServiceMonitorList"},
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object", XPreserveUnknownFields: &preserve,
				}},
			}},
		},
	}
}

func createCRD(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, crd *apiextensionsv1.CustomResourceDefinition) {
	t.Helper()
	if err := cp.CreateCRD(ctx, crd); err != nil {
		t.Fatal(err)
	}
}

// TestApplyToAPIServer renders the chart twice (defaults, and the full
// example as a second release) and creates every object on a real
// kube-apiserver, the CRDs first as Helm does. Every object must be
// accepted; then the API server's own authorizer is asked what the
// components' ServiceAccounts may do.
func TestApplyToAPIServer(t *testing.T) {
	cp := controlplane.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	def, err := Render(release, namespace, nil)
	if err != nil {
		t.Fatal(err)
	}
	full, err := Render("full", "full-system", fullValues(t))
	if err != nil {
		t.Fatal(err)
	}

	installCRDs(ctx, t, cp, def)
	createCRD(ctx, t, cp, serviceMonitorCRD())

	// Helm creates objects in the release namespace, which must exist; the
	// chart creates the namespaces of the BGP password Secrets itself.
	for _, ns := range []string{namespace, "full-system"} {
		if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatalf("namespace %s: %v", ns, err)
		}
	}

	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(cp.Client.Discovery()))
	apply := func(t *testing.T, ns string, objs []*unstructured.Unstructured) {
		applyObjects(ctx, t, cp, mapper, ns, objs)
	}
	t.Run("defaults", func(t *testing.T) { apply(t, namespace, def.Objects) })
	t.Run("full example", func(t *testing.T) { apply(t, "full-system", full.Objects) })
	if t.Failed() {
		return
	}

	// The API server fills in the pools' defaults and keeps what the values said.
	pool, err := cp.Dynamic.Resource(mustMapping(t, mapper, "vipcast.io", "IPPool").Resource).Get(ctx, "public", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("IPPool public: %v", err)
	}
	if addrs, _, _ := unstructured.NestedStringSlice(pool.Object, "spec", "addresses"); len(addrs) != 3 {
		t.Errorf("IPPool public addresses %v", addrs)
	}

	// Ask the API server's RBAC authorizer what each ServiceAccount may do.
	type check struct {
		sa      string // ServiceAccount namespace/name
		verb    string
		group   string
		res     string
		sub     string
		ns      string
		name    string
		allowed bool
	}
	speaker := namespace + "/vipcast-speaker"
	ccm := namespace + "/vipcast-ccm"
	fullSpeaker := "full-system/full-vipcast-speaker"
	for _, c := range []check{
		{speaker, "list", "", "services", "", "web", "", true},
		{speaker, "watch", "discovery.k8s.io", "endpointslices", "", "web", "", true},
		{speaker, "get", "", "nodes", "", "", "node-1", true},
		{speaker, "watch", "vipcast.io", "bgppeers", "", "", "", true},
		{speaker, "create", "", "events", "", "default", "", true},
		// Secrets: the defaults name none, so the speaker reads no Secret
		// at all, Helm's release Secrets included.
		{speaker, "get", "", "secrets", "", "vipcast-bgp-passwords", "tor-a-md5", false},
		{speaker, "list", "", "secrets", "", "vipcast-bgp-passwords", "", false},
		{speaker, "watch", "", "secrets", "", "vipcast-bgp-passwords", "tor-a-md5", false},
		{speaker, "get", "", "secrets", "", namespace, "sh.helm.release.v1.vipcast.v1", false},
		{speaker, "get", "", "secrets", "", namespace, "tor-a-md5", false},
		{speaker, "list", "", "secrets", "", namespace, "", false},
		{speaker, "watch", "", "secrets", "", namespace, "", false},
		{speaker, "get", "", "secrets", "", "kube-system", "tor-a-md5", false},
		{speaker, "list", "", "secrets", "", "kube-system", "", false},
		{speaker, "list", "", "secrets", "", "", "", false},
		{speaker, "get", "", "secrets", "", "fabric-passwords", "tor-a-md5", false},
		{speaker, "patch", "", "services", "", "web", "", false},
		{speaker, "update", "", "services", "status", "web", "", false},
		{speaker, "update", "", "nodes", "", "", "node-1", false},
		{speaker, "update", "vipcast.io", "ippools", "status", "", "public", false},
		// The full example names fabric-passwords/tor-a-md5 and
		// network-passwords/tor-b-md5 and tor-b-bfd: get, list and watch of
		// those alone (a list or watch names its Secret with the field
		// selector metadata.name, which the authorizer sees as the name).
		{fullSpeaker, "get", "", "secrets", "", "fabric-passwords", "tor-a-md5", true},
		{fullSpeaker, "list", "", "secrets", "", "fabric-passwords", "tor-a-md5", true},
		{fullSpeaker, "watch", "", "secrets", "", "fabric-passwords", "tor-a-md5", true},
		{fullSpeaker, "watch", "", "secrets", "", "network-passwords", "tor-b-md5", true},
		{fullSpeaker, "get", "", "secrets", "", "network-passwords", "tor-b-bfd", true},
		{fullSpeaker, "list", "", "secrets", "", "fabric-passwords", "", false},
		{fullSpeaker, "watch", "", "secrets", "", "network-passwords", "", false},
		{fullSpeaker, "get", "", "secrets", "", "fabric-passwords", "tor-b-md5", false},
		{fullSpeaker, "get", "", "secrets", "", "fabric-passwords", "other", false},
		{fullSpeaker, "list", "", "secrets", "", "network-passwords", "tor-a-md5", false},
		{fullSpeaker, "update", "", "secrets", "", "fabric-passwords", "tor-a-md5", false},
		{fullSpeaker, "create", "", "secrets", "", "fabric-passwords", "", false},
		{fullSpeaker, "delete", "", "secrets", "", "fabric-passwords", "tor-a-md5", false},
		{fullSpeaker, "get", "", "secrets", "", "full-system", "sh.helm.release.v1.full.v1", false},
		{fullSpeaker, "get", "", "secrets", "", "full-system", "tor-a-md5", false},
		{fullSpeaker, "list", "", "secrets", "", "vipcast-bgp-passwords", "", false},
		{ccm, "patch", "", "services", "status", "web", "svc", true},
		{ccm, "patch", "", "services", "", "web", "svc", true},
		{ccm, "update", "", "services", "", "web", "svc", false},
		{ccm, "delete", "", "services", "", "web", "svc", false},
		{ccm, "patch", "", "nodes", "status", "", "node-1", true},
		{ccm, "update", "", "nodes", "", "", "node-1", true},
		{ccm, "delete", "", "nodes", "", "", "node-1", false},
		{ccm, "list", "", "namespaces", "", "", "", true},
		{ccm, "update", "vipcast.io", "ippools", "status", "", "public", true},
		{ccm, "update", "vipcast.io", "ippools", "", "", "public", false},
		{ccm, "patch", "vipcast.io", "ippools", "", "", "public", true},
		{ccm, "delete", "vipcast.io", "ippools", "", "", "public", false},
		{ccm, "list", "vipcast.io", "bgppeers", "", "", "", true},
		{ccm, "update", "vipcast.io", "bgppeers", "status", "", "tor-a", true},
		{ccm, "update", "vipcast.io", "bgppeers", "", "", "tor-a", false},
		{ccm, "get", "", "secrets", "", namespace, "tor-a-md5", false},
		{ccm, "create", "coordination.k8s.io", "leases", "", "kube-system", "", true},
		{ccm, "update", "coordination.k8s.io", "leases", "", "kube-system", "vipcast-ccm", true},
		{ccm, "update", "coordination.k8s.io", "leases", "", "kube-system", "kube-controller-manager", false},
		{ccm, "update", "coordination.k8s.io", "leases", "", namespace, "vipcast-ccm", false},
		{ccm, "get", "", "configmaps", "", "kube-system", "extension-apiserver-authentication", true},
		{ccm, "get", "", "configmaps", "", "kube-system", "kubeadm-config", false},
		{ccm, "create", "authentication.k8s.io", "tokenreviews", "", "", "", true},
		{ccm, "create", "authorization.k8s.io", "subjectaccessreviews", "", "", "", true},
		{ccm, "get", "", "secrets", "", "kube-system", "", false},
		{ccm, "create", "", "serviceaccounts", "token", "kube-system", "node-controller", false},
	} {
		ns, name, _ := strings.Cut(c.sa, "/")
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   fmt.Sprintf("system:serviceaccount:%s:%s", ns, name),
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: c.verb, Group: c.group, Resource: c.res, Subresource: c.sub, Namespace: c.ns, Name: c.name,
			},
		}}
		got, err := cp.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("SubjectAccessReview: %v", err)
		}
		if got.Status.Allowed != c.allowed {
			t.Errorf("%s %s %s/%s/%s in %q name %q: allowed=%v, want %v (%s)", c.sa, c.verb, c.group, c.res, c.sub, c.ns, c.name, got.Status.Allowed, c.allowed, got.Status.Reason)
		}
	}
	t.Run("upgrade refused while a BGPPeer names a Secret not listed", func(t *testing.T) { unlistedSecretUpgrade(ctx, t, cp, full) })
	t.Run("speaker reads Secrets as itself", func(t *testing.T) { speakerSecretAccess(ctx, t, cp) })
	t.Run("only vipcast-ccm writes the pool record", func(t *testing.T) { poolRecordPolicy(ctx, t, cp) })
	t.Run("a speaker writes its own node's SpeakerStatus and NodeTunnel only", func(t *testing.T) { speakerStatusPolicy(ctx, t, cp) })
}

// poolRecordPolicy makes real requests as a tenant with the edit role in
// its own namespace and as vipcast-ccm's ServiceAccount (impersonated)
// against the chart's admission policy: the tenant cannot create a Service
// with vipcast.io/allocated-from-pool nor set or change it (which would
// pick the pool whose BGP attributes and rules its VIPs get), and may
// still edit the Service otherwise and drop the annotation; vipcast-ccm
// sets and changes it.
func poolRecordPolicy(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane) {
	const ns, record = "tenant-a", "vipcast.io/allocated-from-pool"
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The edit role's rules: the ClusterRole edit aggregates them, by
	// kube-controller-manager, which this control plane does not run.
	if _, err := cp.Client.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "tenant-edit"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "system:aggregate-to-edit"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "deployer", Namespace: ns}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	as := func(sa string) *kubernetes.Clientset {
		saNS, name, _ := strings.Cut(sa, "/")
		cfg := rest.CopyConfig(cp.Config)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + saNS + ":" + name,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + saNS, "system:authenticated"}}
		c, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	tenant, ccm := as(ns+"/deployer"), as(namespace+"/vipcast-ccm")
	// A cluster runs one vipcast: the full example's policy exempts its own
	// CCM only and would deny this release's. Uninstall it, as helm would.
	if err := cp.Client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(ctx, "full-vipcast-pool-record", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("removing the full example's policy binding: %v", err)
	}
	svc := func(name string, ann map[string]string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann}, Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeLoadBalancer, Ports: []corev1.ServicePort{{Port: 80}}}}
	}
	patch := func(c *kubernetes.Clientset, name, value string) error {
		v := "null"
		if value != "" {
			v = `"` + value + `"`
		}
		_, err := c.CoreV1().Services(ns).Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"annotations":{"`+record+`":`+v+`}}}`), metav1.PatchOptions{})
		return err
	}
	denied := func(what string, err error) {
		t.Helper()
		if !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), record) || !strings.Contains(err.Error(), "only vipcast-ccm sets it") {
			t.Errorf("tenant %s: err = %v, want a denial naming %s and who sets it", what, err, record)
		}
	}
	// The policy is in force once the API server has loaded it, and the
	// RoleBinding once its authorizer has: wait for the first denial by
	// the policy.
	deadline := time.Now().Add(30 * time.Second)
	var err error
	for {
		_, err = tenant.CoreV1().Services(ns).Create(ctx, svc("db", map[string]string{record: "public"}), metav1.CreateOptions{})
		if err != nil && strings.Contains(err.Error(), record) || time.Now().After(deadline) {
			break
		}
		_ = cp.Client.CoreV1().Services(ns).Delete(ctx, "db", metav1.DeleteOptions{})
		time.Sleep(200 * time.Millisecond)
	}
	denied("creates a Service with the record", err)
	if _, err := tenant.CoreV1().Services(ns).Create(ctx, svc("db", map[string]string{"vipcast.io/pool": "internal"}), metav1.CreateOptions{}); err != nil {
		t.Fatalf("tenant creates a Service without the record: %v", err)
	}
	denied("sets the record", patch(tenant, "db", "public"))
	// The API server drops the removed binding from its cache shortly
	// after: vipcast-ccm's first write waits for it, bounded.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if err = patch(ccm, "db", "internal"); err == nil || !strings.Contains(err.Error(), "full-vipcast-pool-record") || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Errorf("vipcast-ccm sets the record: %v", err)
	}
	denied("changes the record", patch(tenant, "db", "public"))
	if _, err := tenant.CoreV1().Services(ns).Patch(ctx, "db", types.MergePatchType, []byte(`{"metadata":{"labels":{"tier":"db"}}}`), metav1.PatchOptions{}); err != nil {
		t.Errorf("tenant labels its Service (the record unchanged): %v", err)
	}
	if err := patch(tenant, "db", ""); err != nil {
		t.Errorf("tenant drops the record (vipcast-ccm writes it again): %v", err)
	}
	if err := patch(ccm, "db", "public"); err != nil {
		t.Errorf("vipcast-ccm changes the record: %v", err)
	}
	got, err := cp.Client.CoreV1().Services(ns).Get(ctx, "db", metav1.GetOptions{})
	if err != nil || got.Annotations[record] != "public" {
		t.Errorf("record %q, %v; want public, vipcast-ccm's last write", got.Annotations[record], err)
	}
}

// speakerSecretAccess makes real requests as the full example's speaker
// ServiceAccount (impersonated), as its Secret informers do: it gets,
// lists and watches each Secret it names, a list or watch carrying the
// field selector metadata.name=<name>; it is refused a list or watch of
// the namespace without that selector, every other Secret of the password
// namespace, Helm's release Secret, and Secrets anywhere else. The
// defaults' speaker names no Secret and reads none.
func speakerSecretAccess(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane) {
	const pwNS, named, other = "fabric-passwords", "tor-a-md5", "not-a-bgp-password"
	for _, sec := range []*corev1.Secret{
		{ObjectMeta: metav1.ObjectMeta{Namespace: pwNS, Name: named}, StringData: map[string]string{"password": "s3cret"}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: pwNS, Name: other}, StringData: map[string]string{"token": "x"}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "full-system", Name: "sh.helm.release.v1.full.v1", Labels: map[string]string{"owner": "helm", "name": "full"}},
			Type: "helm.sh/release.v1", StringData: map[string]string{"release": "H4sI..."}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "other"}, StringData: map[string]string{"token": "x"}},
	} {
		if _, err := cp.Client.CoreV1().Secrets(sec.Namespace).Create(ctx, sec, metav1.CreateOptions{}); err != nil {
			t.Fatalf("Secret %s/%s: %v", sec.Namespace, sec.Name, err)
		}
	}
	as := func(sa string) *kubernetes.Clientset {
		ns, name, _ := strings.Cut(sa, "/")
		cfg := rest.CopyConfig(cp.Config)
		cfg.Impersonate = rest.ImpersonationConfig{
			UserName: "system:serviceaccount:" + ns + ":" + name,
			Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
		}
		c, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	spk := as("full-system/full-vipcast-speaker")
	byName := func(name string) metav1.ListOptions {
		return metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()}
	}

	list, err := spk.CoreV1().Secrets(pwNS).List(ctx, byName(named))
	if err != nil || len(list.Items) != 1 || string(list.Items[0].Data["password"]) != "s3cret" {
		t.Errorf("speaker lists %s/%s by name: %v, %v; want the one password Secret", pwNS, named, err, list)
	}
	// A watch without resourceVersion starts with the Secret as it is.
	w, err := spk.CoreV1().Secrets(pwNS).Watch(ctx, byName(named))
	if err != nil {
		t.Errorf("speaker watches %s/%s by name: %v", pwNS, named, err)
	} else {
		select {
		case ev := <-w.ResultChan():
			if s, ok := ev.Object.(*corev1.Secret); ev.Type != watch.Added || !ok || s.Name != named {
				t.Errorf("speaker's watch of %s/%s: first event %s %T, want ADDED of the Secret", pwNS, named, ev.Type, ev.Object)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("speaker's watch of %s/%s: no event in 10s, want ADDED of the Secret", pwNS, named)
		}
		w.Stop()
	}
	if _, err := spk.CoreV1().Secrets(pwNS).Get(ctx, named, metav1.GetOptions{}); err != nil {
		t.Errorf("speaker gets %s/%s: %v", pwNS, named, err)
	}
	refused := map[string]func() error{
		"list " + pwNS + " without the field selector": func() error {
			_, err := spk.CoreV1().Secrets(pwNS).List(ctx, metav1.ListOptions{})
			return err
		},
		"watch " + pwNS + " without the field selector": func() error {
			w, err := spk.CoreV1().Secrets(pwNS).Watch(ctx, metav1.ListOptions{})
			if err == nil {
				w.Stop()
			}
			return err
		},
		"get another Secret of " + pwNS: func() error {
			_, err := spk.CoreV1().Secrets(pwNS).Get(ctx, other, metav1.GetOptions{})
			return err
		},
		"list another Secret of " + pwNS + " by name": func() error {
			_, err := spk.CoreV1().Secrets(pwNS).List(ctx, byName(other))
			return err
		},
		"watch another Secret of " + pwNS + " by name": func() error {
			w, err := spk.CoreV1().Secrets(pwNS).Watch(ctx, byName(other))
			if err == nil {
				w.Stop()
			}
			return err
		},
		"get Helm's release Secret": func() error {
			_, err := spk.CoreV1().Secrets("full-system").Get(ctx, "sh.helm.release.v1.full.v1", metav1.GetOptions{})
			return err
		},
		"list the release namespace": func() error {
			_, err := spk.CoreV1().Secrets("full-system").List(ctx, metav1.ListOptions{})
			return err
		},
		"get a Secret in kube-system": func() error {
			_, err := spk.CoreV1().Secrets("kube-system").Get(ctx, "other", metav1.GetOptions{})
			return err
		},
		"list Secrets of every namespace": func() error {
			_, err := spk.CoreV1().Secrets("").List(ctx, byName(named))
			return err
		},
		"the defaults' speaker gets " + pwNS + "/" + named: func() error {
			_, err := as(namespace+"/vipcast-speaker").CoreV1().Secrets(pwNS).Get(ctx, named, metav1.GetOptions{})
			return err
		},
	}
	for what, call := range refused {
		if err := call(); !apierrors.IsForbidden(err) {
			t.Errorf("speaker may %s: err = %v, want Forbidden", what, err)
		}
	}
}

// applyObjects creates objs (namespaced ones in ns unless they name their
// own namespace) and fails the test for each one the API server rejects.
func applyObjects(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, mapper meta.RESTMapper, ns string, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Errorf("%s %s: no REST mapping: %v", gvk, o.GetName(), err)
			continue
		}
		res := cp.Dynamic.Resource(m.Resource)
		var created *unstructured.Unstructured
		on := o.GetNamespace()
		if on == "" {
			on = ns
		}
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			created, err = res.Namespace(on).Create(ctx, o.DeepCopy(), metav1.CreateOptions{FieldValidation: "Strict"})
		} else {
			if o.GetNamespace() != "" {
				t.Errorf("cluster-scoped %s %s has namespace %q", gvk.Kind, o.GetName(), o.GetNamespace())
			}
			created, err = res.Create(ctx, o.DeepCopy(), metav1.CreateOptions{FieldValidation: "Strict"})
		}
		if err != nil {
			t.Errorf("%s %s rejected: %v", gvk.Kind, o.GetName(), err)
			continue
		}
		t.Logf("created %s %s/%s", gvk.Kind, created.GetNamespace(), created.GetName())
	}
}

func mustMapping(t *testing.T, mapper meta.RESTMapper, group, kind string) *meta.RESTMapping {
	t.Helper()
	m, err := mapper.RESTMapping(schema.GroupKind{Group: group, Kind: kind})
	if err != nil {
		t.Fatalf("REST mapping of %s.%s: %v", kind, group, err)
	}
	return m
}

// unlistedSecretUpgrade: a BGPPeer in the cluster that the values do not
// make (one made by hand, or kept from a release that read whole password
// namespaces) names a Secret speaker.bgpPasswordSecrets.secrets leaves out:
// helm upgrade (the templates' lookup against the real API server) fails,
// naming the peer, the Secret and the value to add it to, instead of
// rolling speakers that would drop its sessions; once the Secret is
// listed, the upgrade renders.
func unlistedSecretUpgrade(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, full *Rendered) {
	var peer *unstructured.Unstructured
	for _, o := range full.Objects {
		if o.GetKind() == "BGPPeer" {
			peer = o.DeepCopy()
			break
		}
	}
	if peer == nil {
		t.Fatal("the full example makes no BGPPeer")
	}
	peer.SetName("legacy")
	peer.SetLabels(nil)
	if err := unstructured.SetNestedStringMap(peer.Object, map[string]string{"namespace": "fabric-passwords", "name": "old-md5"}, "spec", "passwordSecretRef"); err != nil {
		t.Fatal(err)
	}
	unstructured.RemoveNestedField(peer.Object, "spec", "bfd")
	res := schema.GroupVersionResource{Group: "vipcast.io", Version: "v1alpha1", Resource: "bgppeers"}
	if _, err := cp.Dynamic.Resource(res).Create(ctx, peer, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Dynamic.Resource(res).Delete(context.Background(), "legacy", metav1.DeleteOptions{}) })
	values := fullValues(t)
	_, err := RenderAgainst(cp.Config, "full", "full-system", values)
	if err == nil || !strings.Contains(err.Error(), "BGPPeer legacy in the cluster: spec.passwordSecretRef names the Secret fabric-passwords/old-md5") ||
		!strings.Contains(err.Error(), "add fabric-passwords/old-md5 to speaker.bgpPasswordSecrets.secrets") {
		t.Errorf("upgrade with an unlisted Secret: err = %v, want one naming the peer, the Secret and the value", err)
	}
	listed := strings.Replace(string(values), "      - network-passwords/tor-b-bfd\n", "      - network-passwords/tor-b-bfd\n      - fabric-passwords/old-md5\n", 1)
	if listed == string(values) {
		t.Fatal("the full example's Secret list moved: update this test")
	}
	if _, err := RenderAgainst(cp.Config, "full", "full-system", []byte(listed)); err != nil {
		t.Errorf("upgrade with the Secret listed: %v", err)
	}
}

// speakerStatusPolicy makes real requests with the defaults' speaker
// ServiceAccount token as the kubelet projects it: bound to a pod on node
// n1, so that it carries the node's name. With it the speaker creates and
// updates n1's SpeakerStatus and NodeTunnel, and is refused n2's, naming
// its own node; a token of the same ServiceAccount not bound to a pod
// writes none. (The policy is the chart's speaker-status
// ValidatingAdmissionPolicy.)
func speakerStatusPolicy(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane) {
	const sa = "vipcast-speaker"
	for _, n := range []string{"n1", "n2"} {
		if _, err := cp.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatalf("Node %s: %v", n, err)
		}
	}
	pod, err := cp.Client.CoreV1().Pods(namespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "speaker-n1"},
		Spec: corev1.PodSpec{NodeName: "n1", ServiceAccountName: sa,
			Containers: []corev1.Container{{Name: "speaker", Image: "vipcast/vipcast-speaker:test"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("speaker pod on n1: %v", err)
	}
	token := func(bound *authenticationv1.BoundObjectReference) dynamic.Interface {
		t.Helper()
		tr, err := cp.Client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{BoundObjectRef: bound}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("token of %s: %v", sa, err)
		}
		cfg := rest.AnonymousClientConfig(cp.Config)
		cfg.BearerToken = tr.Status.Token
		c, err := dynamic.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	onN1Client := token(&authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID})
	unboundClient := token(nil)
	onN1, unbound := onN1Client.Resource(vipcastv1alpha1.SpeakerStatusesResource), unboundClient.Resource(vipcastv1alpha1.SpeakerStatusesResource)
	status := func(name string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": vipcastv1alpha1.SchemeGroupVersion.String(), "kind": "SpeakerStatus",
			"metadata": map[string]any{"name": name},
		}}
	}
	denied := func(what string, err error, want string) {
		t.Helper()
		if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want a denial saying %q", what, err, want)
		}
	}
	// The policy is in force once the API server has loaded it.
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err = onN1.Create(ctx, status("n2"), metav1.CreateOptions{})
		if err != nil && strings.Contains(err.Error(), "own node") || time.Now().After(deadline) {
			break
		}
		_ = cp.Dynamic.Resource(vipcastv1alpha1.SpeakerStatusesResource).Delete(ctx, "n2", metav1.DeleteOptions{})
		time.Sleep(200 * time.Millisecond)
	}
	denied("the speaker on n1 creates n2's SpeakerStatus", err, "the speaker on node n1 writes its own node's SpeakerStatus only")
	own, err := onN1.Create(ctx, status("n1"), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the speaker on n1 creates its own SpeakerStatus: %v", err)
	}
	// The speaker writes its status as a JSON patch of the status
	// subresource, the one write its RBAC allows.
	patch := []byte(`[{"op":"add","path":"/status","value":{"sessionsConfigured":2}}]`)
	patchStatus := func(c dynamic.ResourceInterface, name string) error {
		_, err := c.Patch(ctx, name, types.JSONPatchType, patch, metav1.PatchOptions{}, "status")
		return err
	}
	if err := patchStatus(onN1, own.GetName()); err != nil {
		t.Errorf("the speaker on n1 patches its own SpeakerStatus: %v", err)
	}
	if _, err := cp.Dynamic.Resource(vipcastv1alpha1.SpeakerStatusesResource).Create(ctx, status("n2"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("the admin creates n2's SpeakerStatus: %v", err)
	}
	denied("the speaker on n1 patches n2's SpeakerStatus", patchStatus(onN1, "n2"), "the speaker on node n1 writes its own node's SpeakerStatus only")
	denied("a token of the speaker's ServiceAccount not bound to a pod patches n1's SpeakerStatus", patchStatus(unbound, "n1"), "not bound to a pod on a node")

	// NodeTunnels, as the speaker writes them: create, then update.
	tunnel := func(name, ipv4 string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": vipcastv1alpha1.SchemeGroupVersion.String(), "kind": "NodeTunnel",
			"metadata": map[string]any{"name": name}, "spec": map[string]any{"ipv4": ipv4, "announces": true},
		}}
	}
	tunnels := onN1Client.Resource(vipcastv1alpha1.NodeTunnelsResource)
	_, err = tunnels.Create(ctx, tunnel("n2", "10.0.0.1"), metav1.CreateOptions{})
	denied("the speaker on n1 creates n2's NodeTunnel (claiming n1's address)", err, "the speaker on node n1 writes its own node's NodeTunnel only")
	ownTunnel, err := tunnels.Create(ctx, tunnel("n1", "10.0.0.1"), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the speaker on n1 creates its own NodeTunnel: %v", err)
	}
	if err := unstructured.SetNestedField(ownTunnel.Object, "10.0.0.11", "spec", "ipv4"); err != nil {
		t.Fatal(err)
	}
	if ownTunnel, err = tunnels.Update(ctx, ownTunnel, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("the speaker on n1 updates its own NodeTunnel: %v", err)
	}
	admin := cp.Dynamic.Resource(vipcastv1alpha1.NodeTunnelsResource)
	n2Tunnel, err := admin.Create(ctx, tunnel("n2", "10.0.0.2"), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the admin creates n2's NodeTunnel: %v", err)
	}
	if err := unstructured.SetNestedField(n2Tunnel.Object, "10.0.0.1", "spec", "ipv4"); err != nil {
		t.Fatal(err)
	}
	_, err = tunnels.Update(ctx, n2Tunnel, metav1.UpdateOptions{})
	denied("the speaker on n1 updates n2's NodeTunnel", err, "the speaker on node n1 writes its own node's NodeTunnel only")
	_, err = unboundClient.Resource(vipcastv1alpha1.NodeTunnelsResource).Update(ctx, ownTunnel, metav1.UpdateOptions{})
	denied("a token of the speaker's ServiceAccount not bound to a pod updates n1's NodeTunnel", err, "not bound to a pod on a node")
	// The CRD's schema refuses an address of the wrong family.
	_, err = admin.Create(ctx, tunnel("n3", "fd00::3"), metav1.CreateOptions{})
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.ipv4") {
		t.Errorf("a NodeTunnel with an IPv6 spec.ipv4: err = %v, want Invalid naming spec.ipv4", err)
	}
}
