// Package ccmtest gives the CCM's test packages (test/e2e, test/ccmmodel)
// a real kube-apiserver + etcd with vipcast's CRDs installed and
// vipcast-ccm processes against it: one way to start the CCM in a test.
package ccmtest

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/vipcast/vipcast/test/controlplane"
	"github.com/vipcast/vipcast/test/proc"
)

// Build builds the Go packages pkgs (import paths of main packages) into
// dir, for a TestMain to build a test package's binaries once.
func Build(dir string, pkgs ...string) error {
	build := exec.Command("go", append([]string{"build", "-o", dir + "/"}, pkgs...)...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("building %s: %w", strings.Join(pkgs, " "), err)
	}
	return nil
}

// Env is one test's control plane with the CRDs installed, and the
// vipcast-ccm binary its StartCCM runs.
type Env struct {
	T  testing.TB
	CP *controlplane.ControlPlane
	// CCMBinary is the path of the vipcast-ccm binary.
	CCMBinary string
}

// New starts a control plane for t (stopped when t ends), installs the
// chart's CRDs and waits until they are served.
func New(t testing.TB, ccmBinary string) *Env {
	t.Helper()
	e := &Env{T: t, CP: controlplane.Start(t), CCMBinary: ccmBinary}
	dir, err := crdDir()
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRD manifests in %s (run make generate): %v", dir, err)
	}
	if err := e.CP.InstallCRDs(context.Background(), files); err != nil {
		t.Fatal(err)
	}
	return e
}

// crdDir is charts/vipcast/crds of this repository, found from this
// source file so that any test package's directory works.
func crdDir() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", fmt.Errorf("ccmtest: cannot locate its own source to find charts/vipcast/crds")
	}
	return filepath.Join(filepath.Dir(file), "..", "..", "charts", "vipcast", "crds"), nil
}

// CCM is a running vipcast-ccm process.
type CCM struct {
	*proc.Process
	// Log is the path of its log file, Port its secure serving port on
	// 127.0.0.1 (/metrics, /healthz).
	Log  string
	Port int
}

// StartCCM starts vipcast-ccm against the control plane with leader
// election on (short timings so takeovers are quick in tests), its own
// port and -v 2 (useful logs on failure); extra flags follow. It stops
// when the test ends, and the test's failure prints its last log lines.
func (e *Env) StartCCM(name string, extra ...string) *CCM {
	e.T.Helper()
	return e.StartCCMWith(name, append([]string{"-v", "2"}, extra...)...)
}

// StartCCMWith starts vipcast-ccm with only the flags the harness needs
// plus extra: the binary's defaults otherwise.
func (e *Env) StartCCMWith(name string, extra ...string) *CCM {
	e.T.Helper()
	ports, err := proc.FreePorts("127.0.0.1", 1)
	if err != nil {
		e.T.Fatal(err)
	}
	log := filepath.Join(e.CP.Dir, "ccm-"+name+".log")
	args := append(e.CP.ComponentFlags(ports[0]),
		"--leader-elect=true",
		"--leader-elect-lease-duration", "4s",
		"--leader-elect-renew-deadline", "3s",
		"--leader-elect-retry-period", "500ms",
		"--configure-cloud-routes=false")
	args = append(args, extra...)
	p, err := proc.Start(log, e.CCMBinary, args...)
	if err != nil {
		e.T.Fatal(err)
	}
	c := &CCM{Process: p, Log: log, Port: ports[0]}
	e.T.Cleanup(func() {
		c.Stop(5 * time.Second)
		if e.T.Failed() {
			DumpTail(e.T, log, 40)
		}
	})
	return c
}

// IsLeader reports whether the process logged that it acquired the lease.
func (c *CCM) IsLeader() bool {
	data, err := os.ReadFile(c.Log)
	return err == nil && strings.Contains(string(data), "Successfully acquired lease")
}

// Metrics returns the CCM's /metrics, read with token.
func (c *CCM) Metrics(token string) (string, error) {
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the CCM's self-signed loopback certificate
	}}
	defer client.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodGet, fmt.Sprintf("https://127.0.0.1:%d/metrics", c.Port), nil)
	if err != nil {
		return "", fmt.Errorf("building the /metrics request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("reading the CCM's /metrics: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("reading the CCM's /metrics: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("the CCM's /metrics: %s", resp.Status)
	}
	return string(body), nil
}

// DumpTail logs the last n lines of the file at path to t.
func DumpTail(t testing.TB, path string, n int) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer func() { _ = f.Close() }()
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

// Eventually polls cond every 100ms until it reports true or timeout
// passes; the error cond returns with false explains what is still
// missing.
func (e *Env) Eventually(timeout time.Duration, what string, cond func() (bool, error)) {
	e.T.Helper()
	var last error
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		ok, err := cond()
		last = err
		return ok, nil
	})
	if err != nil {
		e.T.Fatalf("timed out after %s waiting for %s (last error: %v)", timeout, what, last)
	}
}

// Namespace creates the namespace name with labels, unless it exists.
func (e *Env) Namespace(name string, labels map[string]string) {
	e.T.Helper()
	_, err := e.CP.Client.CoreV1().Namespaces().Create(context.Background(),
		&v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		e.T.Fatalf("namespace %s: %v", name, err)
	}
}

// ListServices returns every Service in the namespaces given, by
// namespace/name.
func (e *Env) ListServices(namespaces ...string) map[string]*v1.Service {
	e.T.Helper()
	out := map[string]*v1.Service{}
	for _, ns := range namespaces {
		list, err := e.CP.Client.CoreV1().Services(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			e.T.Fatalf("listing Services: %v", err)
		}
		for i := range list.Items {
			s := &list.Items[i]
			out[s.Namespace+"/"+s.Name] = s
		}
	}
	return out
}

// ServiceOption adjusts a test Service before it is created.
type ServiceOption func(*v1.Service)

// LBService is a LoadBalancer Service ns/name selecting app=name with one
// TCP port 80 named http, adjusted by opts.
func LBService(ns, name string, opts ...ServiceOption) *v1.Service {
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
