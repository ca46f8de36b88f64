//go:build controlplane

package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cloudproviderapi "k8s.io/cloud-provider/api"

	"github.com/vipcast/vipcast/test/ccmtest"
)

// TestNodeInitialization: a Node registered with the external cloud
// provider's uninitialized taint is initialized (provider ID, addresses from
// kubelet's --node-ip annotation, topology labels kept) and the taint removed.
func TestNodeInitialization(t *testing.T) {
	t.Parallel() // control plane and vipcast-ccm only (see TestMain)
	e := newEnv(t)
	e.StartCCM("a")
	node := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        "node-a",
			Labels:      map[string]string{v1.LabelTopologyZone: "rack-1", v1.LabelTopologyRegion: "dc-1"},
			Annotations: map[string]string{cloudproviderapi.AnnotationAlphaProvidedIPAddr: "192.0.2.11"},
		},
		Spec: v1.NodeSpec{Taints: []v1.Taint{{
			Key: cloudproviderapi.TaintExternalCloudProvider, Value: "true", Effect: v1.TaintEffectNoSchedule,
		}}},
	}
	if _, err := e.CP.Client.CoreV1().Nodes().Create(context.Background(), node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var got *v1.Node
	e.Eventually(60*time.Second, "node-a to be initialized", func() (bool, error) {
		var err error
		got, err = e.CP.Client.CoreV1().Nodes().Get(context.Background(), "node-a", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, taint := range got.Spec.Taints {
			if taint.Key == cloudproviderapi.TaintExternalCloudProvider {
				return false, fmt.Errorf("taint still present")
			}
		}
		return true, nil
	})
	if got.Spec.ProviderID != "vipcast://node-a" {
		t.Errorf("providerID %q, want vipcast://node-a", got.Spec.ProviderID)
	}
	if got.Labels[v1.LabelTopologyZone] != "rack-1" || got.Labels[v1.LabelTopologyRegion] != "dc-1" {
		t.Errorf("topology labels %v", got.Labels)
	}
	e.Eventually(30*time.Second, "node-a's InternalIP from --node-ip", func() (bool, error) {
		n, err := e.CP.Client.CoreV1().Nodes().Get(context.Background(), "node-a", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, a := range n.Status.Addresses {
			if a.Type == v1.NodeInternalIP && a.Address == "192.0.2.11" {
				return true, nil
			}
		}
		return false, fmt.Errorf("addresses %v", n.Status.Addresses)
	})
}

// TestMetricsAndHealth: the CCM serves /healthz and, to an authorized
// client, /metrics with the pool gauges and allocation counters.
func TestMetricsAndHealth(t *testing.T) {
	t.Parallel() // control plane and vipcast-ccm only (see TestMain)
	e := newEnv(t)
	e.mustApplyPools("apiVersion: vipcast.io/v1alpha1\nkind: IPPool\nmetadata: {name: m}\nspec: {addresses: [10.80.0.0/28, '2001:db8:80::/64'], avoidBuggyIPs: true}\n")
	c := e.StartCCM("a")
	e.Namespace("m", nil)
	e.createService(ccmtest.LBService("m", "s", withFamilies(v1.IPFamilyPolicyPreferDualStack, v1.IPv4Protocol, v1.IPv6Protocol)))
	e.createService(ccmtest.LBService("m", "bad", withAnnotation("vipcast.io/pool", "missing")))
	e.waitEvent("m", "bad", "missing")

	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the CCM's self-signed loopback certificate
	}}
	get := func(path string) (int, string, error) {
		req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("https://127.0.0.1:%d%s", c.Port, path), nil)
		req.Header.Set("Authorization", "Bearer "+e.CP.Token)
		resp, err := client.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), err
	}
	e.Eventually(30*time.Second, "/healthz ok", func() (bool, error) {
		code, body, err := get("/healthz")
		return err == nil && code == 200 && strings.TrimSpace(body) == "ok", err
	})
	want := []string{
		`vipcast_ipam_pool_capacity_addresses{family="IPv4",pool="m"} 15`, // .0 avoided
		`vipcast_ipam_pool_capacity_addresses{family="IPv6",pool="m"} 1.8446744073709552e+19`,
		`vipcast_ipam_pool_in_use_addresses{family="IPv4",pool="m"} 1`,
		`vipcast_ipam_allocations_total{family="IPv4",pool="m"} 1`,
		`vipcast_ipam_allocations_total{family="IPv6",pool="m"} 1`,
		`vipcast_ipam_pool_in_use_addresses{family="IPv6",pool="m"} 1`,
		`vipcast_ipam_allocation_errors_total{reason="UnknownPool"}`,
	}
	waitMetrics := func(want []string) {
		t.Helper()
		e.Eventually(30*time.Second, "the vipcast metrics", func() (bool, error) {
			code, body, err := get("/metrics")
			if err != nil {
				return false, err
			}
			if code != 200 {
				return false, fmt.Errorf("status %d", code)
			}
			for _, w := range want {
				if !strings.Contains(body, w) {
					return false, fmt.Errorf("missing %q", w)
				}
			}
			return true, nil
		})
	}
	waitMetrics(want)

	// Going from dual-stack to single-stack releases the IPv6 VIP: counted,
	// and the pool gauge follows.
	e.Eventually(30*time.Second, "m/s to be downgraded to single-stack", func() (bool, error) {
		s, err := e.CP.Client.CoreV1().Services("m").Get(context.Background(), "s", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		single := v1.IPFamilyPolicySingleStack
		s.Spec.IPFamilyPolicy = &single
		s.Spec.IPFamilies = s.Spec.IPFamilies[:1]
		s.Spec.ClusterIPs = s.Spec.ClusterIPs[:1]
		_, err = e.CP.Client.CoreV1().Services("m").Update(context.Background(), s, metav1.UpdateOptions{})
		return err == nil, err
	})
	waitMetrics([]string{
		`vipcast_ipam_releases_total{family="IPv6"} 1`,
		`vipcast_ipam_pool_in_use_addresses{family="IPv6",pool="m"} 0`,
		`vipcast_ipam_pool_in_use_addresses{family="IPv4",pool="m"} 1`,
	})
}
