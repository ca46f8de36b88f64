//go:build controlplane

package chart

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/restmapper"
	"k8s.io/utils/ptr"

	"github.com/vipcast/vipcast/test/controlplane"
	"github.com/vipcast/vipcast/test/proc"
)

var (
	ippoolsGVR  = schema.GroupVersionResource{Group: "vipcast.io", Version: "v1alpha1", Resource: "ippools"}
	bgppeersGVR = schema.GroupVersionResource{Group: "vipcast.io", Version: "v1alpha1", Resource: "bgppeers"}
	// speakerStatusesGVR: the speakers' per-node status objects.
	speakerStatusesGVR = schema.GroupVersionResource{Group: "vipcast.io", Version: "v1alpha1", Resource: "speakerstatuses"}
)

// installCRDs creates the chart's CRDs and waits until they are established.
func installCRDs(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, r *Rendered) {
	t.Helper()
	for _, u := range r.CRDs {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, crd, true); err != nil {
			t.Fatalf("CRD %s: %v", u.GetName(), err)
		}
		createCRD(ctx, t, cp, crd)
	}
}

// saKubeconfig writes a kubeconfig that authenticates as a ServiceAccount
// with a token from the TokenRequest API, bound to the object bound names
// (a pod on a node, as the kubelet projects it), or to none.
func saKubeconfig(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, ns, name string, bound *authenticationv1.BoundObjectReference) string {
	t.Helper()
	tok, err := cp.Client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600), BoundObjectRef: bound},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for %s/%s: %v", ns, name, err)
	}
	path := filepath.Join(t.TempDir(), name+".kubeconfig")
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: %q, insecure-skip-tls-verify: true}
users:
- name: sa
  user: {token: %q}
contexts:
- name: test
  context: {cluster: test, user: sa}
current-context: test
`, cp.Config.Host, tok.Status.Token)
	if err := os.WriteFile(path, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// chartArgs returns the container's args from the rendered workload, without
// the flags in drop (by name) and with replace applied.
func chartArgs(args []string, drop []string, replace map[string]string) []string {
	var out []string
	for _, a := range args {
		name, _, _ := strings.Cut(a, "=")
		if v, ok := replace[name]; ok {
			out = append(out, name+"="+v)
			continue
		}
		dropped := false
		for _, d := range drop {
			dropped = dropped || name == d
		}
		if !dropped {
			out = append(out, a)
		}
	}
	return out
}

// passwordNamespace is the namespace of the BGP password Secret the
// binaries' test names (speaker.bgpPasswordSecrets.secrets).
const passwordNamespace = "vipcast-bgp-passwords" //nolint:gosec // G101: a namespace name, not a credential

// forbidden returns the lines of a log that report an RBAC refusal.
func forbidden(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(data), "\n") {
		if strings.Contains(strings.ToLower(l), "forbidden") {
			out = append(out, l)
		}
	}
	return out
}

func tail(path string, n int) string {
	data, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// TestBinariesRunWithChartRBAC is the proof that the chart's RBAC is enough:
// the chart is installed on a real API server, and vipcast-ccm and
// vipcast-speaker (built from this repository) run with the chart's own
// arguments, authenticated as the chart's ServiceAccounts with bound tokens.
// The CCM must initialize a node, allocate a VIP, annotate the Service,
// write the pool's status, hold its Lease and serve /metrics through
// delegated authentication and authorization; the speaker must become ready
// and read the BGP password, through its informer of that one Secret (a
// list and watch by name, what the chart's resourceNames allow). Neither
// may log a single "forbidden".
func TestBinariesRunWithChartRBAC(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binaries")
	}
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+"/", "github.com/vipcast/vipcast/cmd/vipcast-ccm", "github.com/vipcast/vipcast/cmd/vipcast-speaker")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the binaries: %v\n%s", err, out)
	}
	cp := controlplane.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	r, err := Render(release, namespace, []byte("speaker: {bgpPasswordSecrets: {secrets: ["+passwordNamespace+"/tor-a-md5]}}"))
	if err != nil {
		t.Fatal(err)
	}
	installCRDs(ctx, t, cp, r)
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(cp.Client.Discovery()))
	applyObjects(ctx, t, cp, mapper, namespace, r.Objects)
	if t.Failed() {
		t.FailNow()
	}

	// What a cluster would have: a new node (uninitialized, Ready), a pool,
	// a router with an MD5 password, a web namespace with a Service.
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "node-1"},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{
			Key: "node.cloudprovider.kubernetes.io/uninitialized", Value: "true", Effect: corev1.TaintEffectNoSchedule,
		}}},
	}
	created, err := cp.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now()}}
	created.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.11"}}
	if _, err := cp.Client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pool := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "vipcast.io/v1alpha1", "kind": "IPPool",
		"metadata": map[string]any{"name": "public"},
		"spec":     map[string]any{"addresses": []any{"192.0.2.0/28"}},
	}}
	if _, err := cp.Dynamic.Resource(ippoolsGVR).Create(ctx, pool, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Client.CoreV1().Secrets(passwordNamespace).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "tor-a-md5"}, StringData: map[string]string{"password": "s3cret"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ports, err := proc.FreePorts("127.0.0.1", 3)
	if err != nil {
		t.Fatal(err)
	}
	ccmPort, speakerPort, bgpPort := ports[0], ports[1], ports[2] // nothing listens on bgpPort
	peer := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "vipcast.io/v1alpha1", "kind": "BGPPeer",
		"metadata": map[string]any{"name": "tor-a"},
		"spec": map[string]any{
			"peerAddress": "127.0.0.1", "peerASN": int64(64500), "localASN": int64(64501), "port": int64(bgpPort),
			"passwordSecretRef": map[string]any{"namespace": passwordNamespace, "name": "tor-a-md5", "key": "password"},
		},
	}}
	if _, err := cp.Dynamic.Resource(bgppeersGVR).Create(ctx, peer, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "web"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The CCM with the Deployment's args; only where it listens changes
	// (loopback, a free port) and the credentials come from a kubeconfig
	// instead of the pod's mounted token.
	ccmKC := saKubeconfig(ctx, t, cp, namespace, "vipcast-ccm", nil)
	dep := one[appsv1.Deployment](t, r, "Deployment", "vipcast-ccm")
	ccmArgs := chartArgs(dep.Spec.Template.Spec.Containers[0].Args, nil, map[string]string{"--secure-port": strconv.Itoa(ccmPort)})
	ccmArgs = append(ccmArgs, "--kubeconfig", ccmKC, "--authentication-kubeconfig", ccmKC, "--authorization-kubeconfig", ccmKC,
		"--bind-address", "127.0.0.1")
	ccmLog := filepath.Join(cp.Dir, "ccm.log")
	ccm, err := proc.Start(ccmLog, filepath.Join(bin, "vipcast-ccm"), ccmArgs...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ccm.Stop(5 * time.Second) })

	// The speaker with the DaemonSet's args, announcing only (IPVS needs
	// root and a kernel; that part is proven by the ipvs/ VM tests).
	// Its token bound to a pod on node-1, as the kubelet projects it: the
	// chart's admission policy lets it write node-1's SpeakerStatus only.
	spkPod, err := cp.Client.CoreV1().Pods(namespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "vipcast-speaker-node-1"},
		Spec: corev1.PodSpec{NodeName: "node-1", ServiceAccountName: "vipcast-speaker",
			Containers: []corev1.Container{{Name: "vipcast-speaker", Image: "vipcast/vipcast-speaker:test"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	spkKC := saKubeconfig(ctx, t, cp, namespace, "vipcast-speaker", &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: spkPod.Name, UID: spkPod.UID})
	ds := one[appsv1.DaemonSet](t, r, "DaemonSet", "vipcast-speaker")
	drop := []string{"--ipvs-link", "--dataplane-resync-period"}
	spkArgs := chartArgs(ds.Spec.Template.Spec.Containers[0].Args, drop, map[string]string{
		"--node-name": "node-1",
		"--ipvs":      "false",
		// The chart's bracketed form, [$(NODE_IP)]:port, on loopback.
		"--metrics-bind-address": "[127.0.0.1]:" + strconv.Itoa(speakerPort),
	})
	spkArgs = append(spkArgs, "--kubeconfig", spkKC)
	spkLog := filepath.Join(cp.Dir, "speaker.log")
	spk, err := proc.Start(spkLog, filepath.Join(bin, "vipcast-speaker"), spkArgs...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { spk.Stop(10 * time.Second) })
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("vipcast-ccm log tail:\n%s", tail(ccmLog, 40))
			t.Logf("vipcast-speaker log tail:\n%s", tail(spkLog, 40))
		}
	})
	t.Logf("vipcast-ccm %q", ccmArgs)
	t.Logf("vipcast-speaker %q", spkArgs)

	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "web"},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeLoadBalancer,
			Selector: map[string]string{"app": "web"},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}},
		},
	}
	if _, err := cp.Client.CoreV1().Services("web").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	eventually := func(what string, cond func(ctx context.Context) (bool, error)) {
		t.Helper()
		if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 60*time.Second, true, cond); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	eventually("CCM holds the Lease kube-system/vipcast-ccm", func(ctx context.Context) (bool, error) {
		l, err := cp.Client.CoordinationV1().Leases("kube-system").Get(ctx, "vipcast-ccm", metav1.GetOptions{})
		return err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "", nil
	})
	eventually("node initialized (uninitialized taint removed, provider ID set)", func(ctx context.Context) (bool, error) {
		n, err := cp.Client.CoreV1().Nodes().Get(ctx, "node-1", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, tn := range n.Spec.Taints {
			if tn.Key == "node.cloudprovider.kubernetes.io/uninitialized" {
				return false, nil
			}
		}
		return n.Spec.ProviderID != "", nil
	})
	eventually("BGPPeer tor-a Ready=True, written by the CCM", func(ctx context.Context) (bool, error) {
		u, err := cp.Dynamic.Resource(bgppeersGVR).Get(ctx, "tor-a", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, c := range conds {
			if m, ok := c.(map[string]any); ok && m["type"] == "Ready" && m["status"] == "True" {
				return true, nil
			}
		}
		return false, nil
	})
	eventually("Service has a VIP from the pool and the pool annotation", func(ctx context.Context) (bool, error) {
		s, err := cp.Client.CoreV1().Services("web").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		ing := s.Status.LoadBalancer.Ingress
		return len(ing) == 1 && strings.HasPrefix(ing[0].IP, "192.0.2.") && s.Annotations["vipcast.io/pool"] == "public", nil
	})
	eventually("IPPool status written", func(ctx context.Context) (bool, error) {
		p, err := cp.Dynamic.Resource(ippoolsGVR).Get(ctx, "public", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		inUse, _, _ := unstructured.NestedInt64(p.Object, "status", "ipv4", "inUse")
		return inUse == 1, nil
	})

	// /metrics on the secure port: delegated authentication (TokenReview)
	// and authorization (SubjectAccessReview) both run with the CCM's RBAC.
	// The admin may read it; the speaker's ServiceAccount may not.
	insecure := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // self-signed serving certificate
	get := func(url, token string) int {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := insecure.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	base := fmt.Sprintf("https://127.0.0.1:%d", ccmPort)
	eventually("CCM /healthz (probe path, no credentials)", func(context.Context) (bool, error) {
		return get(base+"/healthz", "") == http.StatusOK, nil
	})
	eventually("CCM /metrics for the admin", func(context.Context) (bool, error) {
		return get(base+"/metrics", cp.Token) == http.StatusOK, nil
	})
	spkTok, err := cp.Client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, "vipcast-speaker", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if code := get(base+"/metrics", spkTok.Status.Token); code != http.StatusForbidden {
		t.Errorf("CCM /metrics for the speaker's ServiceAccount: %d, want 403", code)
	}

	eventually("speaker ready (/readyz)", func(context.Context) (bool, error) {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", speakerPort))
		if err != nil {
			return false, nil //nolint:nilerr // an error would end the poll: retry until the timeout
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	// The speaker writes its SpeakerStatus, owned by its Node, through
	// the chart's RBAC and admission policy: the session it opens (no
	// router listens: not Established) and the Services it serves.
	eventually("the speaker's SpeakerStatus", func(ctx context.Context) (bool, error) {
		s, err := cp.Dynamic.Resource(speakerStatusesGVR).Get(ctx, "node-1", metav1.GetOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // not written yet: retry until the timeout
		}
		owners := s.GetOwnerReferences()
		configured, _, _ := unstructured.NestedInt64(s.Object, "status", "sessionsConfigured")
		classless, _, _ := unstructured.NestedBool(s.Object, "status", "servesClassless")
		return len(owners) == 1 && owners[0].Kind == "Node" && owners[0].UID == created.UID && configured == 1 && classless, nil
	})
	// The speaker reads the password when it configures the peer; a
	// refused read would be a Warning Event on the BGPPeer (and a log line).
	time.Sleep(2 * time.Second)
	evs, err := cp.Client.CoreV1().Events("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs.Items {
		if e.Type != corev1.EventTypeWarning {
			continue
		}
		// A Service synced before the provider's caches may get a
		// transient SyncLoadBalancerFailed; only refusals count here.
		msg := fmt.Sprintf("Warning Event on %s %s: %s: %s", e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
		if strings.Contains(strings.ToLower(e.Message), "forbidden") || e.InvolvedObject.Kind == "BGPPeer" {
			t.Error(msg)
		} else {
			t.Log(msg)
		}
	}
	if ccm.Exited() || spk.Exited() {
		t.Errorf("a binary exited: ccm %v, speaker %v", ccm.Exited(), spk.Exited())
	}
	for name, log := range map[string]string{"vipcast-ccm": ccmLog, "vipcast-speaker": spkLog} {
		if lines := forbidden(t, log); len(lines) > 0 {
			t.Errorf("%s was refused by RBAC:\n%s", name, strings.Join(lines, "\n"))
		}
	}
}
