// Package controlplane starts a real Kubernetes control plane (etcd and
// kube-apiserver, built from Go modules by test/tools) on loopback for tests.
//
// The binaries live in a cache directory keyed by the Kubernetes version
// (see BinDir); `make tools` builds them there once and every later run
// reuses them. Each ControlPlane gets its own free ports and temporary
// directory and is always stopped by t.Cleanup, even when the test fails.
package controlplane

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/vipcast/vipcast/test/proc"

	"github.com/vipcast/vipcast/test/harness"
)

// KubernetesVersion is the version of kube-apiserver (and the etcd it pins)
// that test/tools builds. Keep it equal to the k8s.io/kubernetes requirement
// in test/tools/go.mod.
const KubernetesVersion = "v1.37.1"

// BinDir returns the directory holding the control-plane binaries:
// $VIPCAST_CACHE/k8s-<version>, where VIPCAST_CACHE defaults to
// $HOME/.cache/vipcast.
func BinDir() string {
	base := os.Getenv("VIPCAST_CACHE")
	if base == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			home = os.TempDir()
		}
		base = filepath.Join(home, ".cache", "vipcast")
	}
	return filepath.Join(base, "k8s-"+KubernetesVersion)
}

// ControlPlane is a running etcd + kube-apiserver pair.
type ControlPlane struct {
	// Dir is the control plane's private temporary directory.
	Dir string
	// Kubeconfig is the path of an admin kubeconfig for the API server.
	Kubeconfig string
	// Config is the admin client configuration.
	Config *rest.Config
	// Client is an admin clientset.
	Client kubernetes.Interface
	// Dynamic is an admin dynamic client.
	Dynamic dynamic.Interface
	// APIExtensions is an admin client for CustomResourceDefinitions.
	APIExtensions apiextensionsclient.Interface
	// Token is the admin bearer token.
	Token string
	// EtcdURL is etcd's client URL.
	EtcdURL string

	procs   []*proc.Process
	egress  *egressProxy
	apiURL  string
	apiArgs []string
	nice    int
}

// Start launches etcd and kube-apiserver on loopback, waits until the API
// server is ready and registers their shutdown with t.Cleanup. It fails the
// test if the binaries are missing (run `make tools`) or do not start.
func Start(t harness.T) *ControlPlane {
	t.Helper()
	return StartWith(t, Options{})
}

// Options change the control plane for a cluster with real nodes.
type Options struct {
	// AdvertiseAddress, when set, is the address (reachable from the
	// nodes, such as a relay to the loopback port) that the API server
	// publishes in the kubernetes Service's endpoints, which it then
	// maintains (lease reconciler): pods reach it through the Service.
	AdvertiseAddress string
	// ServiceAccounts turns the ServiceAccount admission plugin on, so
	// pods get their service account's token (the default leaves it off:
	// tests without kubelets create pods no one runs).
	ServiceAccounts bool
	// Nice, when above zero, is the nice value every component runs at
	// (etcd, kube-apiserver and, started later, the controllers), so that
	// a control plane serving VMs at the same nice value shares the CPU
	// with them as equals: the real cluster's node VMs run at nice 10
	// (test/vm), and beside them a restarting kube-apiserver at nice 0
	// took both host CPUs for seconds, starved a node's speaker past its
	// BGP hold timer and flapped a session, which on separate machines
	// no API server restart can do.
	Nice int
	// Egress, when set, dials the cluster for kube-apiserver: its
	// connections to kubelets (logs, exec, port-forward) and to pods and
	// Services (proxy subresources) go through an HTTP CONNECT proxy that
	// opens them with Egress (an EgressSelectorConfiguration, as with
	// konnectivity), so the API server on the host reaches nodes that only
	// a network namespace routes to.
	Egress DialFunc
}

// StartWith is Start with options.
func StartWith(t harness.T, opts Options) *ControlPlane {
	t.Helper()
	cp, err := start(t.TempDir(), t.Logf, opts)
	if cp != nil {
		t.Cleanup(cp.Stop)
	}
	if err != nil {
		t.Fatalf("control plane: %v", err)
	}
	return cp
}

// start launches etcd and kube-apiserver with their files in dir and waits
// until the API server is ready. It returns the ControlPlane also with an
// error once there is something to stop.
func start(dir string, logf func(string, ...any), opts Options) (*ControlPlane, error) {
	bin := BinDir()
	for _, name := range []string{"etcd", "kube-apiserver"} {
		if _, err := os.Stat(filepath.Join(bin, name)); err != nil {
			return nil, fmt.Errorf("%s not found in %s (run `make tools` to build it): %w", name, bin, err)
		}
	}
	cp := &ControlPlane{Dir: dir, nice: opts.Nice}
	ports, err := proc.FreePorts("127.0.0.1", 3)
	if err != nil {
		return cp, err
	}
	etcdClient, etcdPeer, apiPort := ports[0], ports[1], ports[2]

	if err := cp.writeCredentials(); err != nil {
		return cp, err
	}

	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", etcdClient)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", etcdPeer)
	cp.EtcdURL = etcdURL
	if err := cp.launch(filepath.Join(bin, "etcd"), "etcd", etcdArgs(dir, etcdURL, peerURL)...); err != nil {
		return cp, err
	}
	cp.apiArgs = apiServerArgs(dir, etcdURL, apiPort, opts)
	if opts.Egress != nil {
		p, sock, err := startEgressProxy(opts.Egress)
		if err != nil {
			return cp, err
		}
		cp.egress = p
		file := filepath.Join(dir, "egress-selector.yaml")
		if err := os.WriteFile(file, []byte(egressConfig(sock)), 0o600); err != nil {
			return cp, err
		}
		cp.apiArgs = append(cp.apiArgs, "--egress-selector-config-file", file)
	}
	if err := cp.launch(filepath.Join(bin, "kube-apiserver"), "kube-apiserver", cp.apiArgs...); err != nil {
		return cp, err
	}

	apiURL := fmt.Sprintf("https://127.0.0.1:%d", apiPort)
	cp.apiURL = apiURL
	if err := cp.writeKubeconfig(apiURL); err != nil {
		return cp, err
	}
	if err := waitReady(apiURL, cp.Token, 60*time.Second); err != nil {
		return cp, fmt.Errorf("kube-apiserver not ready (logs in %s): %w", dir, err)
	}
	logf("control plane ready at %s (dir %s)", apiURL, dir)
	return cp, nil
}

// etcdArgs is the command line of a single-member etcd with its data in
// dir, serving clients on clientURL.
func etcdArgs(dir, clientURL, peerURL string) []string {
	return []string{
		"--data-dir", filepath.Join(dir, "etcd"),
		"--name", "vipcast-test",
		"--listen-client-urls", clientURL, "--advertise-client-urls", clientURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "vipcast-test=" + peerURL,
		"--unsafe-no-fsync", "--log-level", "warn",
	}
}

// apiServerArgs is the command line of a kube-apiserver on loopback port
// apiPort, storing in the etcd at etcdURL, with the tokens and service
// account keys writeCredentials put in dir and its serving certificate in
// dir/certs.
func apiServerArgs(dir, etcdURL string, apiPort int, opts Options) []string {
	advertise, reconciler, admissionOff := "127.0.0.1", "none", "ServiceAccount"
	if opts.AdvertiseAddress != "" {
		advertise, reconciler = opts.AdvertiseAddress, "lease"
	}
	if opts.ServiceAccounts {
		admissionOff = ""
	}
	return []string{
		"--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1", "--advertise-address", advertise,
		"--secure-port", strconv.Itoa(apiPort),
		"--cert-dir", filepath.Join(dir, "certs"),
		"--token-auth-file", filepath.Join(dir, "tokens.csv"),
		"--authorization-mode", "RBAC",
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", filepath.Join(dir, "sa.pub"),
		"--service-account-signing-key-file", filepath.Join(dir, "sa.key"),
		// Dual-stack, so Services may ask for IPv6 and dual-stack VIPs.
		"--service-cluster-ip-range", "10.96.0.0/16,fd00:10:96::/112",
		"--endpoint-reconciler-type", reconciler,
		"--disable-admission-plugins", admissionOff,
		// Logs and exec reach kubelets by their InternalIP: a node's
		// name would be resolved through the host's DNS resolver.
		"--kubelet-preferred-address-types", "InternalIP",
		// The chart's speaker DaemonSet has a privileged init container (IPVS sysctl).
		"--allow-privileged=true",
		// A test run creates thousands of objects quickly; the defaults
		// (400/200 in flight) are for shared production servers.
		"--max-requests-inflight", "1000",
		"--max-mutating-requests-inflight", "500",
		"-v", "1",
	}
}

// writeCredentials creates the admin token file and the service-account key pair.
func (cp *ControlPlane) writeCredentials() error {
	tok := make([]byte, 16)
	if _, err := rand.Read(tok); err != nil {
		return fmt.Errorf("token: %w", err)
	}
	cp.Token = hex.EncodeToString(tok)
	if err := os.WriteFile(filepath.Join(cp.Dir, "tokens.csv"),
		[]byte(cp.Token+",admin,admin-uid,system:masters\n"), 0o600); err != nil {
		return fmt.Errorf("token file: %w", err)
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return fmt.Errorf("service-account key: %w", err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return fmt.Errorf("service-account public key: %w", err)
	}
	files := map[string][]byte{
		"sa.key": pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}),
		"sa.pub": pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(cp.Dir, name), data, 0o600); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return nil
}

func (cp *ControlPlane) writeKubeconfig(apiURL string) error {
	cp.Kubeconfig = filepath.Join(cp.Dir, "kubeconfig")
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: %s
    insecure-skip-tls-verify: true
users:
- name: admin
  user:
    token: %s
contexts:
- name: test
  context: {cluster: test, user: admin}
current-context: test
`, apiURL, cp.Token)
	if err := os.WriteFile(cp.Kubeconfig, []byte(kc), 0o600); err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", cp.Kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	cfg.QPS, cfg.Burst = 1000, 2000
	cp.Config = cfg
	if cp.Client, err = kubernetes.NewForConfig(cfg); err != nil {
		return fmt.Errorf("clientset: %w", err)
	}
	if cp.Dynamic, err = dynamic.NewForConfig(cfg); err != nil {
		return fmt.Errorf("dynamic client: %w", err)
	}
	if cp.APIExtensions, err = apiextensionsclient.NewForConfig(cfg); err != nil {
		return fmt.Errorf("apiextensions client: %w", err)
	}
	return nil
}

func (cp *ControlPlane) launch(path, name string, args ...string) error {
	p, err := cp.startLogged(name, path, args...)
	if err != nil {
		return err
	}
	cp.procs = append(cp.procs, p)
	return nil
}

// startLogged starts the component name from path with its output in
// the control plane's directory as name.log, at the control plane's nice
// value (nice(1) execs path: the process is the component's).
func (cp *ControlPlane) startLogged(name, path string, args ...string) (*proc.Process, error) {
	if cp.nice > 0 {
		args = append([]string{"-n", strconv.Itoa(cp.nice), path}, args...)
		path = "nice"
	}
	p, err := proc.Start(filepath.Join(cp.Dir, name+".log"), path, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return p, nil
}

// Pids returns the process IDs of the running components, in start
// order (etcd, kube-apiserver, then the controllers if started).
func (cp *ControlPlane) Pids() []int {
	var pids []int
	for _, p := range cp.procs {
		if !p.Exited() {
			pids = append(pids, p.Pid())
		}
	}
	return pids
}

// Stop terminates the API server and etcd (in reverse start order), waiting
// briefly for each before killing it. It is safe to call more than once.
func (cp *ControlPlane) Stop() {
	for i := len(cp.procs) - 1; i >= 0; i-- {
		cp.procs[i].Stop(5 * time.Second)
	}
	cp.procs = nil
	if cp.egress != nil {
		cp.egress.close()
		cp.egress = nil
	}
}

func waitReady(apiURL, token string, timeout time.Duration) error {
	client := &http.Client{Timeout: 2 * time.Second, Transport: insecureTransport()}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last error
	for ctx.Err() == nil {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, apiURL+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("readyz returned %s", resp.Status)
		}
		last = err
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("after %s: %w", timeout, last)
}

// InstallCRDs creates the CustomResourceDefinitions in the given YAML files
// (one per file, as in charts/vipcast/crds) and waits until each is
// established.
func (cp *ControlPlane) InstallCRDs(ctx context.Context, files []string) error {
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict(data, crd); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if err := cp.CreateCRD(ctx, crd); err != nil {
			return err
		}
	}
	return nil
}

// CreateCRD creates one CustomResourceDefinition and waits until it is
// established.
func (cp *ControlPlane) CreateCRD(ctx context.Context, crd *apiextensionsv1.CustomResourceDefinition) error {
	crds := cp.APIExtensions.ApiextensionsV1().CustomResourceDefinitions()
	if _, err := crds.Create(ctx, crd, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating CRD %s: %w", crd.Name, err)
	}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := crds.Get(ctx, crd.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // an error would end the poll: retry until the timeout
		}
		for _, c := range got.Status.Conditions {
			if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("CRD %s not established: %w", crd.Name, err)
	}
	return nil
}

// ComponentFlags are the flags a controller-manager style binary (such as
// vipcast-ccm) needs to run against this control plane as admin, serving
// on loopback at securePort.
func (cp *ControlPlane) ComponentFlags(securePort int) []string {
	return []string{
		"--kubeconfig", cp.Kubeconfig,
		"--authentication-kubeconfig", cp.Kubeconfig,
		"--authorization-kubeconfig", cp.Kubeconfig,
		"--bind-address", "127.0.0.1",
		"--secure-port", strconv.Itoa(securePort),
	}
}
