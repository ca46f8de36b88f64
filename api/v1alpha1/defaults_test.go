package v1alpha1_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/vipcast/vipcast/api/v1alpha1"
)

func TestIPPoolDefaults(t *testing.T) {
	var spec v1alpha1.IPPoolSpec
	if !spec.AutoAssignOrDefault() {
		t.Error("AutoAssignOrDefault() = false for unset autoAssign, want true")
	}
	spec.AutoAssign = ptr.To(false)
	if spec.AutoAssignOrDefault() {
		t.Error("AutoAssignOrDefault() = true for autoAssign false")
	}
	if got := (*v1alpha1.IPPoolSpec)(nil).AutoAssignOrDefault(); !got {
		t.Error("nil spec: AutoAssignOrDefault() = false")
	}

	var bgp *v1alpha1.IPPoolBGP // spec.bgp omitted
	if got := bgp.AggregationLengthOrDefault(); got != 32 {
		t.Errorf("AggregationLengthOrDefault() = %d, want 32", got)
	}
	if got := bgp.AggregationLengthV6OrDefault(); got != 128 {
		t.Errorf("AggregationLengthV6OrDefault() = %d, want 128", got)
	}
	bgp = &v1alpha1.IPPoolBGP{AggregationLength: ptr.To[int32](24), AggregationLengthV6: ptr.To[int32](64)}
	if got := bgp.AggregationLengthOrDefault(); got != 24 {
		t.Errorf("AggregationLengthOrDefault() = %d, want 24", got)
	}
	if got := bgp.AggregationLengthV6OrDefault(); got != 64 {
		t.Errorf("AggregationLengthV6OrDefault() = %d, want 64", got)
	}
}

func TestBGPPeerDefaults(t *testing.T) {
	spec := v1alpha1.BGPPeerSpec{PeerAddress: "192.0.2.1", PeerASN: 64512, LocalASN: 64513}
	if got := spec.PortOrDefault(); got != 179 {
		t.Errorf("PortOrDefault() = %d, want 179", got)
	}
	if got := spec.HoldTimeOrDefault(); got != 90*time.Second {
		t.Errorf("HoldTimeOrDefault() = %v, want 90s", got)
	}
	if got := spec.KeepaliveTimeOrDefault(); got != 30*time.Second {
		t.Errorf("KeepaliveTimeOrDefault() = %v, want 30s", got)
	}
	if got := spec.EBGPMultiHopOrDefault(); got != 1 {
		t.Errorf("EBGPMultiHopOrDefault() = %d, want 1", got)
	}
	want := []v1alpha1.AddressFamily{v1alpha1.AddressFamilyIPv4Unicast, v1alpha1.AddressFamilyIPv6Unicast}
	if got := spec.FamiliesOrDefault(); !slices.Equal(got, want) {
		t.Errorf("FamiliesOrDefault() = %v, want %v", got, want)
	}
	if spec.IsIBGP() {
		t.Error("IsIBGP() = true for different ASNs")
	}

	spec.Port = ptr.To[int32](1179)
	spec.HoldTime = &metav1.Duration{Duration: 9 * time.Second}
	spec.EBGPMultiHop = ptr.To[int32](3)
	spec.Families = []v1alpha1.AddressFamily{v1alpha1.AddressFamilyIPv6Unicast}
	spec.LocalASN = spec.PeerASN
	if got := spec.PortOrDefault(); got != 1179 {
		t.Errorf("PortOrDefault() = %d, want 1179", got)
	}
	if got := spec.KeepaliveTimeOrDefault(); got != 3*time.Second {
		t.Errorf("KeepaliveTimeOrDefault() with holdTime 9s = %v, want 3s", got)
	}
	spec.KeepaliveTime = &metav1.Duration{Duration: 2 * time.Second}
	if got := spec.KeepaliveTimeOrDefault(); got != 2*time.Second {
		t.Errorf("KeepaliveTimeOrDefault() = %v, want 2s", got)
	}
	if got := spec.EBGPMultiHopOrDefault(); got != 3 {
		t.Errorf("EBGPMultiHopOrDefault() = %d, want 3", got)
	}
	got := spec.FamiliesOrDefault()
	if !slices.Equal(got, spec.Families) {
		t.Errorf("FamiliesOrDefault() = %v, want %v", got, spec.Families)
	}
	got[0] = "mutated"
	if spec.Families[0] != v1alpha1.AddressFamilyIPv6Unicast {
		t.Error("FamiliesOrDefault() returned the spec's own slice")
	}
	if !spec.IsIBGP() {
		t.Error("IsIBGP() = false for equal ASNs")
	}

	spec.HoldTime = &metav1.Duration{}
	spec.KeepaliveTime = nil
	if got := spec.KeepaliveTimeOrDefault(); got != 0 {
		t.Errorf("KeepaliveTimeOrDefault() with holdTime 0 = %v, want 0", got)
	}

	ref := v1alpha1.SecretKeyReference{Name: "bgp", Namespace: "vipcast-system"}
	if got := ref.KeyOrDefault(); got != "password" {
		t.Errorf("KeyOrDefault() = %q, want password", got)
	}
	ref.Key = "tor1"
	if got := ref.KeyOrDefault(); got != "tor1" {
		t.Errorf("KeyOrDefault() = %q, want tor1", got)
	}

	gr := v1alpha1.GracefulRestart{Enabled: true}
	if got := gr.RestartTimeOrDefault(); got != 120*time.Second {
		t.Errorf("RestartTimeOrDefault() = %v, want 120s", got)
	}
	gr.RestartTime = &metav1.Duration{Duration: time.Minute}
	if got := gr.RestartTimeOrDefault(); got != time.Minute {
		t.Errorf("RestartTimeOrDefault() = %v, want 1m", got)
	}
}

// TestWellKnownCommunities keeps the Go table and the CRD's list of accepted
// names in step: every name the API accepts has a value, and vice versa.
func TestWellKnownCommunities(t *testing.T) {
	schema := loadSchemas(t)["IPPool"]
	for name := range v1alpha1.WellKnownCommunities {
		obj := ippool("communities", []string{"10.0.0.0/24"})
		obj["spec"].(map[string]any)["bgp"] = map[string]any{"communities": []any{name}}
		if errs, _, _ := schema.validate(obj); len(errs) > 0 {
			t.Errorf("community %q: %v", name, errs)
		}
	}
	rule := schema.structural.Properties["spec"].Properties["bgp"].Properties["communities"].Items.XValidations[0].Rule
	if n := strings.Count(rule, "', '") + 1; n != len(v1alpha1.WellKnownCommunities) {
		t.Errorf("the CRD accepts %d well-known names, WellKnownCommunities has %d", n, len(v1alpha1.WellKnownCommunities))
	}
}
