package lab

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"github.com/vipcast/vipcast/test/controlplane"
)

// Kubernetes' own e2e suite (e2e.test, built by `make e2e-tools` from
// test/tools/e2e) runs its specs' pods from these images, under the names
// test/utils/image of the cluster's version gives them. No registry is
// reachable: the lab builds them and imports them into the nodes under
// those names.
const (
	// AgnhostImage is agnhost: the binary built from its Go source in
	// k8s.io/kubernetes, on a userland taken from this machine's Debian
	// (agnhostTools) instead of upstream's Alpine.
	AgnhostImage = "registry.k8s.io/e2e-test-images/agnhost:2.66.1"
	// UpstreamPauseImage is the lab's pause image under upstream's name.
	UpstreamPauseImage = "registry.k8s.io/pause:3.10.2"
	// agnhostLocal is the name the lab builds agnhost under (hack/image
	// refuses a registry host); containerdRoot tags it AgnhostImage.
	agnhostLocal = "vipcast/e2e-agnhost:2.66.1"
)

// E2EBin returns the path of a binary of Kubernetes' that `make e2e-tools`
// builds (e2e.test, agnhost), beside the other Kubernetes binaries.
func E2EBin(name string) string {
	return filepath.Join(controlplane.BinDir(), name)
}

// agnhostTools are the commands the suite's specs run in agnhost
// containers (`kubectl exec … /bin/sh -c`): upstream's image has them
// from Alpine (busybox, bind-tools curl netcat-openbsd iproute2 bash),
// this one from the host's Debian, each with the shared libraries it
// loads. nc is netcat-openbsd's, as upstream's (`nc -v -t -w 2`, `nc -u`);
// wget is GNU wget, which takes busybox's `wget -T 5 -qO-`.
var agnhostTools = map[string]string{
	"sh": "dash", "bash": "bash", "curl": "curl", "wget": "wget", "nc": "nc.openbsd", "ip": "ip",
	"cat": "cat", "touch": "touch", "sleep": "sleep", "ls": "ls", "grep": "grep", "timeout": "timeout",
	"hostname": "hostname", "rm": "rm", "mkdir": "mkdir", "seq": "seq", "head": "head", "tail": "tail",
	"tr": "tr", "cut": "cut", "sort": "sort", "wc": "wc", "date": "date", "env": "env", "id": "id",
}

// agnhostUserland fills dir with a merged-/usr Debian userland holding
// agnhostTools and their shared libraries (as ldd lists them), /etc's
// passwd and group, and /tmp.
func agnhostUserland(ctx context.Context, dir string) error {
	for _, d := range []string{"usr/bin", "usr/lib", "usr/lib64", "etc", "tmp", "uploads"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	for _, l := range []string{"bin", "sbin", "lib", "lib64"} {
		target := "usr/" + l
		if l == "sbin" {
			target = "usr/bin"
		}
		if err := os.Symlink(target, filepath.Join(dir, l)); err != nil {
			return err
		}
	}
	libs := map[string]bool{}
	names := make([]string, 0, len(agnhostTools))
	for name := range agnhostTools {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		path, err := exec.LookPath(agnhostTools[name])
		if err != nil {
			return fmt.Errorf("agnhost's userland: %s (%s) not on this machine (make e2e-tools installs it): %w", name, agnhostTools[name], err)
		}
		if err := copyFile(path, filepath.Join(dir, "usr/bin", name)); err != nil {
			return err
		}
		deps, err := sharedLibs(ctx, path)
		if err != nil {
			return err
		}
		for _, d := range deps {
			libs[d] = true
		}
	}
	for lib := range libs {
		// /lib/x86_64-linux-gnu/libc.so.6 → usr/lib/x86_64-linux-gnu/libc.so.6
		// (lib and lib64 are links into usr/, as on the host).
		rel := strings.TrimPrefix(lib, "/")
		if !strings.HasPrefix(rel, "usr/") {
			rel = "usr/" + rel
		}
		if err := copyFile(lib, filepath.Join(dir, rel)); err != nil {
			return err
		}
	}
	for file, body := range map[string]string{ //nolint:gosec // a userland's account names, without passwords
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
		"etc/group":  "root:x:0:\nnogroup:x:65534:\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(body), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// sharedLibs returns the absolute paths of the shared libraries and the
// loader ldd says bin loads.
func sharedLibs(ctx context.Context, bin string) ([]string, error) {
	out, err := exec.CommandContext(ctx, "ldd", bin).Output()
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w", bin, err)
	}
	var libs []string
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		// "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)" or
		// "/lib64/ld-linux-x86-64.so.2 (0x…)"; linux-vdso has no file.
		f := strings.Fields(sc.Text())
		switch {
		case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
			libs = append(libs, f[2])
		case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
			libs = append(libs, f[0])
		}
	}
	return libs, nil
}

// UpstreamRun is one run of Kubernetes' e2e suite from the client.
type UpstreamRun struct {
	// Focus and Skip are ginkgo's regular expressions on the specs' full
	// text (--ginkgo.focus, --ginkgo.skip).
	Focus, Skip string
	// Timeout bounds the whole run (--ginkgo.timeout).
	Timeout string
	// Dir receives the run's log (e2e.log) and ginkgo's JSON report
	// (report.json).
	Dir string
}

// SpecResult is one spec's outcome in an UpstreamRun.
type SpecResult struct {
	Name    string // the containers' texts and the spec's, as ginkgo prints it
	State   string // passed, failed, skipped, pending, panicked, interrupted, timedout
	Seconds float64
	Message string // the failure's or the skip's message
}

// RunUpstream runs e2e.test (`make e2e-tools`) in the client's namespace,
// behind the ToR — the LoadBalancer specs dial the VIP from where they run
// — with kubectl for the specs' exec calls, and returns every spec's
// result from ginkgo's JSON report. The error is about the run itself
// (e2e.test missing, no report); a failed spec is a result, not an error.
func (l *Lab) RunUpstream(ctx context.Context, run UpstreamRun) ([]SpecResult, error) {
	bin := E2EBin("e2e.test")
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("e2e.test: %w (run `make e2e-tools`)", err)
	}
	if err := os.MkdirAll(run.Dir, 0o755); err != nil {
		return nil, err
	}
	report := filepath.Join(run.Dir, "report.json")
	_ = os.Remove(report)
	logFile, err := os.Create(filepath.Join(run.Dir, "e2e.log"))
	if err != nil {
		return nil, err
	}
	defer func() { _ = logFile.Close() }()
	args := []string{"netns", "exec", l.ClientNS.Name, bin,
		// The nodes' kubeconfig: the admin through the ToR's relay, which
		// the client reaches through the ToR as a workstation would.
		"--kubeconfig", l.NodesKubeconfig(),
		"--kubectl-path", filepath.Join(controlplane.BinDir(), "kubectl"),
		"--provider", "skeleton",
		"--report-dir", run.Dir,
		"--ginkgo.json-report", report,
		"--ginkgo.focus", run.Focus,
		"--ginkgo.v", "--ginkgo.no-color",
	}
	if run.Skip != "" {
		args = append(args, "--ginkgo.skip", run.Skip)
	}
	if run.Timeout != "" {
		args = append(args, "--ginkgo.timeout", run.Timeout)
	}
	cmd := exec.CommandContext(ctx, "ip", args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Dir = run.Dir
	runErr := cmd.Run()
	results, err := readGinkgoReport(report)
	if err != nil {
		return nil, fmt.Errorf("e2e.test: %w (log %s)", errors.Join(err, runErr), logFile.Name())
	}
	return results, nil
}

// readGinkgoReport reads the specs' results from ginkgo's JSON report
// (an array of suite reports), leaving out the suite's own nodes
// (BeforeSuite and the like, which have no spec text).
func readGinkgoReport(path string) ([]SpecResult, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var suites []struct {
		SpecReports []struct {
			ContainerHierarchyTexts []string
			LeafNodeText            string
			LeafNodeType            string
			State                   string
			RunTime                 int64 // nanoseconds
			Failure                 *struct{ Message string }
		}
	}
	if err := json.Unmarshal(data, &suites); err != nil {
		return nil, fmt.Errorf("ginkgo report %s: %w", path, err)
	}
	var out []SpecResult
	for _, s := range suites {
		for _, r := range s.SpecReports {
			if r.LeafNodeType == "It" && r.State == "skipped" && r.Failure == nil {
				continue // outside the focus: never started (a spec's own Skip carries its reason)
			}
			if r.LeafNodeType != "It" {
				if r.State != "passed" && r.Failure != nil {
					out = append(out, SpecResult{Name: "[" + r.LeafNodeType + "]", State: r.State, Message: r.Failure.Message})
				}
				continue
			}
			res := SpecResult{
				Name:    strings.Join(append(append([]string{}, r.ContainerHierarchyTexts...), r.LeafNodeText), " "),
				State:   r.State,
				Seconds: float64(r.RunTime) / 1e9,
			}
			if r.Failure != nil {
				res.Message = r.Failure.Message
			}
			out = append(out, res)
		}
	}
	return out, nil
}

// UpstreamLoadBalancerFocus selects the suite's LoadBalancer specs: every
// [Feature:LoadBalancer] spec (test/e2e/network/loadbalancer.go) and the
// LoadBalancer cases of service.go (Services of type LoadBalancer, their
// health check node port, their terminating endpoints, the status
// lifecycle).
const UpstreamLoadBalancerFocus = `\[Feature:LoadBalancer\]|` +
	`Services should (fail health check node port if there are only terminating endpoints|` +
	`fallback to (local )?terminating endpoints when there are no ready endpoints with externa|` +
	`serve endpoints on same port and different protocol for internal traffic on Type LoadBalancer|` +
	`implement NodePort and HealthCheckNodePort correctly when ExternalTrafficPolicy changes|` +
	`complete a service status lifecycle)`

// The cluster's DNS, for Kubernetes' e2e suite (its specs reach Services
// by name): CoreDNS built by `make e2e-tools` (test/tools/coredns), as
// kubeadm deploys it, in kube-system behind the kube-dns Service.
const (
	// ClusterDNS is the kube-dns Service's address, the kubelets'
	// clusterDNS.
	ClusterDNS = "10.96.0.10"
	// CoreDNSVersion is the CoreDNS the Makefile builds (COREDNS_VERSION).
	CoreDNSVersion = "v1.15.0"
	corednsImage   = "vipcast/coredns:lab"
)

// corednsManifest is CoreDNS's ServiceAccount, RBAC, Corefile,
// Deployment and Service, after kubeadm's. The Corefile answers for
// cluster.local and the reverse zones and forwards nothing: a name outside
// the cluster gets SERVFAIL instead of a lookup through the machine's
// resolver. CoreDNS listens on 1053 as an unprivileged user; the Service
// maps port 53 onto it.
const corednsManifest = `apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects:
- {kind: ServiceAccount, name: coredns, namespace: kube-system}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  Corefile: |
    .:1053 {
        errors
        health :8080
        ready :8181
        kubernetes cluster.local in-addr.arpa ip6.arpa {
           pods insecure
           ttl 5
        }
        cache 5
        loadbalance
    }
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: coredns
  namespace: kube-system
  labels: {k8s-app: kube-dns}
spec:
  replicas: 1
  selector:
    matchLabels: {k8s-app: kube-dns}
  template:
    metadata:
      labels: {k8s-app: kube-dns}
    spec:
      serviceAccountName: coredns
      dnsPolicy: Default
      containers:
      - name: coredns
        image: ` + corednsImage + `
        imagePullPolicy: Never
        args: ["-conf", "/etc/coredns/Corefile"]
        ports:
        - {name: dns, containerPort: 1053, protocol: UDP}
        - {name: dns-tcp, containerPort: 1053, protocol: TCP}
        readinessProbe:
          httpGet: {path: /ready, port: 8181}
          periodSeconds: 2
        livenessProbe:
          httpGet: {path: /health, port: 8080}
          initialDelaySeconds: 30
        securityContext:
          runAsUser: 65532
          runAsGroup: 65532
          runAsNonRoot: true
          allowPrivilegeEscalation: false
          readOnlyRootFilesystem: true
          capabilities: {drop: [ALL]}
        volumeMounts:
        - {name: config, mountPath: /etc/coredns, readOnly: true}
      volumes:
      - name: config
        configMap: {name: coredns}
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {k8s-app: kube-dns}
spec:
  clusterIP: ` + ClusterDNS + `
  selector: {k8s-app: kube-dns}
  ports:
  - {name: dns, port: 53, targetPort: 1053, protocol: UDP}
  - {name: dns-tcp, port: 53, targetPort: 1053, protocol: TCP}
`

// deployDNS applies corednsManifest; the e2e suite waits for kube-system's
// pods to be ready before its first spec.
func (l *Lab) deployDNS(ctx context.Context) error {
	file := filepath.Join(l.Opts.Dir, "coredns.yaml")
	if err := os.WriteFile(file, []byte(corednsManifest), 0o644); err != nil {
		return err
	}
	_, err := l.Kubectl(ctx, "apply", "-f", file)
	return err
}

// UpstreamCIFocus is the part of UpstreamLoadBalancerFocus that `make test`
// runs (the lab's upstream scenario): specs of what vipcast's own
// dataplane does under ipMode Proxy that pass in the lab — client affinity
// across nodes and across a switch, a UDP flow across its pod's restart,
// a Service without node ports, Local's nodes — about 2 minutes. The
// whole focus takes about 50 minutes more (rolling update, Cluster and
// Local, and source ranges 11-14 minutes each); `make test-upstream` runs
// it.
const UpstreamCIFocus = `\[Feature:LoadBalancer\] should (have session affinity work for LoadBalancer service with Cluster traffic policy|` +
	`be able to switch session affinity for LoadBalancer service with Local traffic policy|` +
	`be able to preserve UDP traffic when server pod cycles for a LoadBalancer service on different nodes|` +
	`be able to create LoadBalancer Service without NodePort)|` +
	`ExternalTrafficPolicy: Local \[Feature:LoadBalancer\] should only target nodes with endpoints`
