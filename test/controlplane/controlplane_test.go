//go:build controlplane

package controlplane_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vipcast/vipcast/test/controlplane"
)

// TestStart checks that the harness brings up a working API server: the
// namespaces the API server creates itself appear and the version is the
// one test/tools builds.
func TestStart(t *testing.T) {
	cp := controlplane.Start(t)
	v, err := cp.Client.Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("server version: %v", err)
	}
	if v.GitVersion != controlplane.KubernetesVersion {
		t.Fatalf("server version %q, want %q", v.GitVersion, controlplane.KubernetesVersion)
	}
	if _, err := cp.Client.CoreV1().Namespaces().Get(context.Background(), "default", metav1.GetOptions{}); err != nil {
		t.Fatalf("default namespace: %v", err)
	}
}

// TestStartNice: with Options.Nice every component and every thread of it
// runs at that nice value (the real cluster's control plane shares the
// CPU with its VMs as an equal, test/lab).
func TestStartNice(t *testing.T) {
	const nice = 7
	cp := controlplane.StartWith(t, controlplane.Options{Nice: nice})
	pids := cp.Pids()
	if len(pids) != 2 {
		t.Fatalf("running components: %v, want etcd and kube-apiserver", pids)
	}
	for _, pid := range pids {
		tasks, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "task"))
		if err != nil {
			t.Fatal(err)
		}
		for _, task := range tasks {
			stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "task", task.Name(), "stat"))
			if err != nil {
				continue // the thread exited
			}
			// The fields after the command name (which ends with ")"):
			// nice is the 19th field of the line, the 17th after it.
			fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
			if len(fields) < 17 || fields[16] != strconv.Itoa(nice) {
				t.Errorf("thread %s of component %d: stat %q, want nice %d", task.Name(), pid, stat, nice)
			}
		}
	}
}

// TestEgress: with Options.Egress the API server reaches a node's kubelet
// only through the dial function — here to a kubelet stand-in on an
// address the node does not report — and the proxy subresource answers
// with what the stand-in serves.
func TestEgress(t *testing.T) {
	var mu sync.Mutex
	var paths, dialed []string
	kubelet := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.URL.Path)
		mu.Unlock()
		_, _ = io.WriteString(w, "kubelet stand-in")
	}))
	t.Cleanup(kubelet.Close)
	const nodeAddr = "192.0.2.7" // TEST-NET-1: nothing answers there
	egress := func(ctx context.Context, addr string) (net.Conn, error) {
		mu.Lock()
		dialed = append(dialed, addr)
		mu.Unlock()
		return (&net.Dialer{}).DialContext(ctx, "tcp", kubelet.Listener.Addr().String())
	}
	cp := controlplane.StartWith(t, controlplane.Options{Egress: egress})
	ctx := context.Background()
	_, port, _ := net.SplitHostPort(kubelet.Listener.Addr().String())
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		t.Fatal(err)
	}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node1"}}
	node, err = cp.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: nodeAddr}}
	node.Status.DaemonEndpoints.KubeletEndpoint.Port = int32(p)
	if _, err := cp.Client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	body, err := cp.Client.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes/node1/proxy/healthz").DoRaw(ctx)
	if err != nil {
		t.Fatalf("node proxy through the egress proxy: %v (%s)", err, body)
	}
	if want := "kubelet stand-in"; string(body) != want {
		t.Fatalf("node proxy answered %q, want %q", body, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(paths) != 1 || paths[0] != "/healthz" {
		t.Errorf("the kubelet stand-in was asked for %q, want [/healthz]", paths)
	}
	if want := net.JoinHostPort(nodeAddr, port); len(dialed) == 0 || dialed[0] != want {
		t.Fatalf("the egress proxy dialed %q, want %q first", dialed, want)
	}
}
