//go:build controlplane || routing

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/test/controlplane"
	"github.com/vipcast/vipcast/test/proc"
)

// ccmBinary, speakerBinary and pluginBinary (kubectl-vipcast) are the
// vipcast binaries built once by TestMain.
var ccmBinary, speakerBinary, pluginBinary string

// TestMain builds the binaries once and runs the tests. Tests that run only
// a control plane of their own and vipcast-ccm call t.Parallel: they wait
// mostly on the API server and the CCM's queues (the model tests settle on
// the CCM's metrics, not on time), so two at a time (go test's -parallel,
// GOMAXPROCS) overlap one's waits with the other's work. go test runs them
// after every other test has finished. The tests with routers, speakers or
// BFD, whose timings are part of what they assert, run one at a time
// before them.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "vipcast-e2e-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ccmBinary = filepath.Join(dir, "vipcast-ccm")
	speakerBinary = filepath.Join(dir, "vipcast-speaker")
	pluginBinary = filepath.Join(dir, "kubectl-vipcast")
	build := exec.Command("go", "build", "-o", dir+"/", "github.com/vipcast/vipcast/cmd/vipcast-ccm", "github.com/vipcast/vipcast/cmd/vipcast-speaker",
		"github.com/vipcast/vipcast/cmd/kubectl-vipcast")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building vipcast binaries:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// env is one test's control plane with the CRDs installed.
type env struct {
	t  testing.TB
	cp *controlplane.ControlPlane
}

func newEnv(t testing.TB) *env {
	t.Helper()
	e := &env{t: t, cp: controlplane.Start(t)}
	e.installCRDs()
	return e
}

// installCRDs creates the chart's CRDs and waits until they are served.
func (e *env) installCRDs() {
	e.t.Helper()
	files, err := filepath.Glob("../../charts/vipcast/crds/*.yaml")
	if err != nil || len(files) == 0 {
		e.t.Fatalf("no CRD manifests in charts/vipcast/crds (run make generate): %v", err)
	}
	if err := e.cp.InstallCRDs(context.Background(), files); err != nil {
		e.t.Fatal(err)
	}
}

// ccmProcess is a running vipcast-ccm process.
type ccmProcess struct {
	*proc.Process
	log  string
	port int
}

// startCCM starts vipcast-ccm against the control plane with leader election
// on (short timings so takeovers are quick in tests) and its own port; extra
// flags follow (tests add -v=2 for useful logs on failure).
func (e *env) startCCM(name string, extra ...string) *ccmProcess {
	return e.startCCMWith(name, append([]string{"-v", "2"}, extra...)...)
}

// startCCMWith starts vipcast-ccm with only the flags the harness needs plus
// extra: the binary's defaults otherwise.
func (e *env) startCCMWith(name string, extra ...string) *ccmProcess {
	e.t.Helper()
	ports, err := proc.FreePorts("127.0.0.1", 1)
	if err != nil {
		e.t.Fatal(err)
	}
	log := filepath.Join(e.cp.Dir, "ccm-"+name+".log")
	args := append(e.cp.ComponentFlags(ports[0]),
		"--leader-elect=true",
		"--leader-elect-lease-duration", "4s",
		"--leader-elect-renew-deadline", "3s",
		"--leader-elect-retry-period", "500ms",
		"--configure-cloud-routes=false")
	args = append(args, extra...)
	p, err := proc.Start(log, ccmBinary, args...)
	if err != nil {
		e.t.Fatal(err)
	}
	c := &ccmProcess{Process: p, log: log, port: ports[0]}
	e.t.Cleanup(func() {
		c.Stop(5 * time.Second)
		if e.t.Failed() {
			dumpTail(e.t, log, 40)
		}
	})
	return c
}

// isLeader reports whether the process logged that it acquired the lease.
func (c *ccmProcess) isLeader() bool {
	data, err := os.ReadFile(c.log)
	return err == nil && strings.Contains(string(data), "Successfully acquired lease")
}

func dumpTail(t testing.TB, path string, n int) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	t.Logf("last lines of %s:\n%s", path, strings.Join(lines, "\n"))
}

// eventually polls cond every 100ms until it reports true or timeout passes;
// the error cond returns with false explains what is still missing.
func (e *env) eventually(timeout time.Duration, what string, cond func() (bool, error)) {
	e.t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		ok, err := cond()
		last = err
		return ok, nil
	})
	if err != nil {
		e.t.Fatalf("timed out after %s waiting for %s (last error: %v)", timeout, what, last)
	}
}

// applyPool creates an IPPool from YAML through the dynamic client.
func (e *env) applyPool(doc string) error {
	obj := mustUnstructured(e.t, doc)
	_, err := e.cp.Dynamic.Resource(vipcastv1alpha1.IPPoolsResource).Create(context.Background(), obj, metav1.CreateOptions{})
	return err
}

// mustApplyPools creates every IPPool of a (multi-document) YAML string.
func (e *env) mustApplyPools(docs string) {
	e.t.Helper()
	for _, doc := range splitYAML(docs) {
		if err := e.applyPool(doc); err != nil {
			e.t.Fatalf("creating IPPool: %v", err)
		}
	}
}

func (e *env) namespace(name string, labels map[string]string) {
	e.t.Helper()
	_, err := e.cp.Client.CoreV1().Namespaces().Create(context.Background(),
		&v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		e.t.Fatalf("namespace %s: %v", name, err)
	}
}

// svcOpt adjusts a test Service before it is created.
type svcOpt func(*v1.Service)

func withAnnotation(k, v string) svcOpt {
	return func(s *v1.Service) {
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[k] = v
	}
}

func withPorts(ports ...int32) svcOpt {
	return func(s *v1.Service) {
		s.Spec.Ports = nil
		for _, p := range ports {
			s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: fmt.Sprintf("p%d", p), Port: p, Protocol: v1.ProtocolTCP})
		}
	}
}

func withFamilies(policy v1.IPFamilyPolicy, fams ...v1.IPFamily) svcOpt {
	return func(s *v1.Service) {
		s.Spec.IPFamilyPolicy = &policy
		s.Spec.IPFamilies = fams
	}
}

func lbService(ns, name string, opts ...svcOpt) *v1.Service {
	s := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1.ServiceSpec{
			Type:     v1.ServiceTypeLoadBalancer,
			Selector: map[string]string{"app": name},
			Ports:    []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}},
		},
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

func (e *env) createService(s *v1.Service) *v1.Service {
	e.t.Helper()
	got, err := e.cp.Client.CoreV1().Services(s.Namespace).Create(context.Background(), s, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("creating Service %s/%s: %v", s.Namespace, s.Name, err)
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

// listServices returns every Service in the namespaces given, by namespace/name.
func (e *env) listServices(namespaces ...string) map[string]*v1.Service {
	e.t.Helper()
	out := map[string]*v1.Service{}
	for _, ns := range namespaces {
		list, err := e.cp.Client.CoreV1().Services(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			e.t.Fatalf("listing Services: %v", err)
		}
		for i := range list.Items {
			s := &list.Items[i]
			out[s.Namespace+"/"+s.Name] = s
		}
	}
	return out
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
	e.t.Helper()
	for _, name := range names {
		n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
		created, err := e.cp.Client.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{})
		if err != nil {
			e.t.Fatalf("node %s: %v", name, err)
		}
		created.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, LastHeartbeatTime: metav1.Now()}}
		if _, err := e.cp.Client.CoreV1().Nodes().UpdateStatus(context.Background(), created, metav1.UpdateOptions{}); err != nil {
			e.t.Fatalf("node %s status: %v", name, err)
		}
	}
}

// kubectl runs the real kubectl (built by `make tools`) with args against
// the test's API server (through KUBECONFIG: kubectl refuses flags before
// a plugin's name), kubectl-vipcast on its PATH, and returns its output's
// lines, trailing blanks trimmed.
func (e *env) kubectl(args ...string) []string {
	e.t.Helper()
	kubectl := filepath.Join(controlplane.BinDir(), "kubectl")
	if _, err := os.Stat(kubectl); err != nil {
		e.t.Fatalf("kubectl not found (run `make tools` to build it): %v", err)
	}
	cmd := exec.Command(kubectl, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+e.cp.Kubeconfig,
		"PATH="+filepath.Dir(pluginBinary)+string(os.PathListSeparator)+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		e.t.Fatalf("kubectl %v: %v\n%s", args, err, out)
	}
	e.t.Logf("kubectl %s:\n%s", strings.Join(args, " "), out)
	lines := strings.Split(string(out), "\n")
	for i, l := range lines {
		lines[i] = strings.TrimRight(l, " ")
	}
	return lines
}

// kubectlWants checks that kubectl's output for args has every line of
// want.
func (e *env) kubectlWants(args []string, want ...string) {
	e.t.Helper()
	lines := e.kubectl(args...)
	for _, w := range want {
		if !slices.Contains(lines, w) {
			e.t.Errorf("kubectl %v printed %q, without the line %q", args, lines, w)
		}
	}
}

// kubectlLacks checks that kubectl's output for args has none of the
// lines of unwanted.
func (e *env) kubectlLacks(args []string, unwanted ...string) {
	e.t.Helper()
	lines := e.kubectl(args...)
	for _, u := range unwanted {
		if slices.Contains(lines, u) {
			e.t.Errorf("kubectl %v printed the line %q", args, u)
		}
	}
}
