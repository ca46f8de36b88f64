package lab_test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/vipcast/vipcast/test/lab"
	"github.com/vipcast/vipcast/test/netns"
)

// TestCluster runs vipcast the way its users do, in each of kube-proxy's
// modes: real kubelets started with --cloud-provider=external, containerd,
// kube-proxy beside vipcast with the settings docs/install.md prescribes,
// and vipcast installed by `helm install` of charts/vipcast (the CCM as the
// chart's Deployment with leader election and in-cluster configuration,
// the speakers as its DaemonSet). Each mode checks:
//
//   - the in-cluster vipcast-ccm initialized the nodes the kubelets
//     registered (provider ID, no uninitialized taint);
//   - a Deployment's LoadBalancer Service gets a VIP, the ToR routes it
//     over both nodes, and the client behind the ToR reaches every pod
//     through both;
//   - a pod inside the cluster reaches the VIP;
//   - kube-proxy's own Services keep working beside vipcast's: the
//     Service's ClusterIP from a pod, its NodePort from the client;
//   - externalTrafficPolicy Local keeps the client's address.
func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("real cluster: skipped with -short")
	}
	netns.Require(t)
	for _, mode := range []string{"iptables", "nftables", "ipvs"} {
		t.Run(mode, func(t *testing.T) {
			// The iptables run also goes through a cluster's life (see
			// clusterLifecycle), with a third node to join.
			life := mode == "iptables"
			opts := lab.Options{Cluster: &lab.ClusterOptions{ProxyMode: mode}}
			if life {
				opts.Nodes, opts.Cluster.Boot, opts.Cluster.ExtraTags = 3, 2, []string{upgradeTag}
			}
			l := lab.Up(t, opts)
			vip := clusterWithKubeProxy(t, l)
			if life {
				clusterLifecycle(t, l, vip)
			}
		})
	}
}

func clusterWithKubeProxy(t *testing.T, l *lab.Lab) netip.Addr {
	ctx := t.Context()
	checkNodesInitialized(t, l)
	for _, n := range l.Nodes {
		node, err := l.CP.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(node.Status.NodeInfo.KubeletVersion, "v1.37") {
			t.Fatalf("%s: kubelet version %q: not a real kubelet", n.Name, node.Status.NodeInfo.KubeletVersion)
		}
	}
	vip := demoVIP(t, l)
	addr := netip.AddrPortFrom(vip, 80)
	reach(t, l, addr, l.Pods(), nil)
	throughBoth(t, l, addr)

	svc, err := l.CP.Client.CoreV1().Services(lab.DemoNamespace).Get(ctx, lab.DemoService, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// From a pod: the VIP (vipcast's dataplane on the pod's node) and the
	// ClusterIP (kube-proxy's).
	for _, target := range []string{vip.String(), svc.Spec.ClusterIP} {
		body := podGet(t, l, "http://"+netip.AddrPortFrom(netip.MustParseAddr(target), 80).String()+"/")
		t.Logf("from a pod, %s answered %q", target, body)
	}
	// From the client: the NodePort on each node (kube-proxy's).
	nodePort := svc.Spec.Ports[0].NodePort
	for _, n := range l.Nodes {
		body, err := l.Get(ctx, netip.AddrPortFrom(n.Addr, uint16(nodePort))) //nolint:gosec // a port
		if err != nil {
			t.Fatalf("NodePort %d on %s: %v", nodePort, n.Name, err)
		}
		t.Logf("NodePort %d on %s answered %q", nodePort, n.Name, body)
	}

	// Local: the pods see the client itself, with kube-proxy present.
	patchService(t, l, `{"spec":{"externalTrafficPolicy":"Local"}}`)
	// Every node programs its own pods only (and no SNAT) before the
	// client's requests count.
	for _, n := range l.Nodes {
		waitIPVS(t, n, vip, backendsOf(n.Pods...))
	}
	time.Sleep(time.Second) // the same sync's SNAT change
	for i := range 20 {
		body, err := l.Get(ctx, addr)
		if err != nil {
			t.Fatalf("Local, request %d: %v", i, err)
		}
		if !strings.HasSuffix(body, "client 192.168.50.2") {
			t.Fatalf("Local, request %d: the backend saw %q, want the client's own address 192.168.50.2", i, body)
		}
	}
	return vip
}

// podGet runs a pod in the demo namespace that GETs url once (the backend
// image's -get mode) and returns the answer it reported; it fails the test
// if the pod failed.
func podGet(t *testing.T, l *lab.Lab, url string) string {
	t.Helper()
	ctx := t.Context()
	name := fmt.Sprintf("get-%d", time.Now().UnixNano()%1e6)
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: lab.DemoNamespace},
		Spec: v1.PodSpec{
			RestartPolicy: v1.RestartPolicyNever,
			Containers: []v1.Container{{
				Name: "get", Image: lab.BackendImage, ImagePullPolicy: v1.PullNever,
				Args: []string{"-get", url},
			}},
		},
	}
	pods := l.CP.Client.CoreV1().Pods(lab.DemoNamespace)
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var got *v1.Pod
	err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // retry
		}
		got = p
		return p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed, nil
	})
	if err != nil {
		t.Fatalf("pod %s getting %s did not finish: %v (status %+v)", name, url, err, got.Status)
	}
	msg := ""
	for _, cs := range got.Status.ContainerStatuses {
		if cs.State.Terminated != nil {
			msg = cs.State.Terminated.Message
		}
	}
	if got.Status.Phase != v1.PodSucceeded {
		t.Fatalf("from pod %s on %s, GET %s failed: %s", name, got.Spec.NodeName, url, msg)
	}
	return msg
}
