//go:build controlplane || routing

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/test/ccmtest"
	"github.com/vipcast/vipcast/test/controlplane"
)

// ccmBinary, speakerBinary and pluginBinary (kubectl-vipcast) are the
// vipcast binaries built once by TestMain.
var ccmBinary, speakerBinary, pluginBinary string

// TestMain builds the binaries once and runs the tests. Tests that run only
// a control plane of their own and vipcast-ccm call t.Parallel: they wait
// mostly on the API server and the CCM's queues, so two at a time (go
// test's -parallel, GOMAXPROCS) overlap one's waits with the other's work.
// go test runs them after every other test has finished. The tests with
// routers, speakers or BFD, whose timings are part of what they assert, run
// one at a time before them. The CCM's randomized model test, the longest
// of the CCM-only tests, is test/ccmmodel, a package of its own, so that it
// runs beside this one from its start.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "vipcast-e2e-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ccmBinary = filepath.Join(dir, "vipcast-ccm")
	speakerBinary = filepath.Join(dir, "vipcast-speaker")
	pluginBinary = filepath.Join(dir, "kubectl-vipcast")
	if err := ccmtest.Build(dir, "github.com/vipcast/vipcast/cmd/vipcast-ccm", "github.com/vipcast/vipcast/cmd/vipcast-speaker",
		"github.com/vipcast/vipcast/cmd/kubectl-vipcast"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// env is one test's control plane with the CRDs installed, and the
// e2e tests' helpers on it.
type env struct{ *ccmtest.Env }

func newEnv(t testing.TB) *env {
	t.Helper()
	return &env{ccmtest.New(t, ccmBinary)}
}

// applyPool creates an IPPool from YAML through the dynamic client.
func (e *env) applyPool(doc string) error {
	obj := mustUnstructured(e.T, doc)
	_, err := e.CP.Dynamic.Resource(vipcastv1alpha1.IPPoolsResource).Create(context.Background(), obj, metav1.CreateOptions{})
	return err
}

// mustApplyPools creates every IPPool of a (multi-document) YAML string.
func (e *env) mustApplyPools(docs string) {
	e.T.Helper()
	for _, doc := range splitYAML(docs) {
		if err := e.applyPool(doc); err != nil {
			e.T.Fatalf("creating IPPool: %v", err)
		}
	}
}

func withAnnotation(k, v string) ccmtest.ServiceOption {
	return func(s *v1.Service) {
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[k] = v
	}
}

func withPorts(ports ...int32) ccmtest.ServiceOption {
	return func(s *v1.Service) {
		s.Spec.Ports = nil
		for _, p := range ports {
			s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: fmt.Sprintf("p%d", p), Port: p, Protocol: v1.ProtocolTCP})
		}
	}
}

func withFamilies(policy v1.IPFamilyPolicy, fams ...v1.IPFamily) ccmtest.ServiceOption {
	return func(s *v1.Service) {
		s.Spec.IPFamilyPolicy = &policy
		s.Spec.IPFamilies = fams
	}
}

func (e *env) createService(s *v1.Service) *v1.Service {
	e.T.Helper()
	got, err := e.CP.Client.CoreV1().Services(s.Namespace).Create(context.Background(), s, metav1.CreateOptions{})
	if err != nil {
		e.T.Fatalf("creating Service %s/%s: %v", s.Namespace, s.Name, err)
	}
	return got
}

// ingressIPs returns the Service's status addresses; it fails the test if an
// entry lacks ipMode Proxy.
func ingressIPs(t testing.TB, s *v1.Service) []netip.Addr {
	t.Helper()
	var ips []netip.Addr
	for _, ing := range s.Status.LoadBalancer.Ingress {
		if ing.IPMode == nil || *ing.IPMode != v1.LoadBalancerIPModeProxy {
			t.Errorf("Service %s/%s ingress %s has ipMode %v, want Proxy", s.Namespace, s.Name, ing.IP, ing.IPMode)
		}
		ip, err := netip.ParseAddr(ing.IP)
		if err != nil {
			t.Errorf("Service %s/%s ingress IP %q: %v", s.Namespace, s.Name, ing.IP, err)
			continue
		}
		ips = append(ips, ip)
	}
	return ips
}

// splitYAML splits a multi-document YAML string.
func splitYAML(s string) []string {
	var docs []string
	for _, d := range strings.Split(s, "\n---") {
		if strings.TrimSpace(d) != "" {
			docs = append(docs, d)
		}
	}
	return docs
}

func mustUnstructured(t testing.TB, doc string) *unstructured.Unstructured {
	t.Helper()
	obj := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(doc), &obj.Object); err != nil {
		t.Fatalf("bad test YAML: %v", err)
	}
	return obj
}

// readyNodes registers initialized, Ready nodes, as kubelets would have.
func (e *env) readyNodes(names ...string) {
	e.T.Helper()
	for _, name := range names {
		n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
		created, err := e.CP.Client.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{})
		if err != nil {
			e.T.Fatalf("node %s: %v", name, err)
		}
		created.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, LastHeartbeatTime: metav1.Now()}}
		if _, err := e.CP.Client.CoreV1().Nodes().UpdateStatus(context.Background(), created, metav1.UpdateOptions{}); err != nil {
			e.T.Fatalf("node %s status: %v", name, err)
		}
	}
}

// kubectl runs the real kubectl (built by `make tools`) with args against
// the test's API server (through KUBECONFIG: kubectl refuses flags before
// a plugin's name), kubectl-vipcast on its PATH, and returns its output's
// lines, trailing blanks trimmed.
func (e *env) kubectl(args ...string) []string {
	e.T.Helper()
	kubectl := filepath.Join(controlplane.BinDir(), "kubectl")
	if _, err := os.Stat(kubectl); err != nil {
		e.T.Fatalf("kubectl not found (run `make tools` to build it): %v", err)
	}
	cmd := exec.Command(kubectl, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+e.CP.Kubeconfig,
		"PATH="+filepath.Dir(pluginBinary)+string(os.PathListSeparator)+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		e.T.Fatalf("kubectl %v: %v\n%s", args, err, out)
	}
	e.T.Logf("kubectl %s:\n%s", strings.Join(args, " "), out)
	lines := strings.Split(string(out), "\n")
	for i, l := range lines {
		lines[i] = strings.TrimRight(l, " ")
	}
	return lines
}

// kubectlWants checks that kubectl's output for args has every line of
// want.
func (e *env) kubectlWants(args []string, want ...string) {
	e.T.Helper()
	lines := e.kubectl(args...)
	for _, w := range want {
		if !slices.Contains(lines, w) {
			e.T.Errorf("kubectl %v printed %q, without the line %q", args, lines, w)
		}
	}
}

// kubectlLacks checks that kubectl's output for args has none of the
// lines of unwanted.
func (e *env) kubectlLacks(args []string, unwanted ...string) {
	e.T.Helper()
	lines := e.kubectl(args...)
	for _, u := range unwanted {
		if slices.Contains(lines, u) {
			e.T.Errorf("kubectl %v printed the line %q", args, u)
		}
	}
}
