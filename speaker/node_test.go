package speaker

import (
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestNodeFrom(t *testing.T) {
	addrs := func(as ...string) []v1.NodeAddress {
		var out []v1.NodeAddress
		for i := 0; i+1 < len(as); i += 2 {
			out = append(out, v1.NodeAddress{Type: v1.NodeAddressType(as[i]), Address: as[i+1]})
		}
		return out
	}
	tests := []struct {
		name         string
		labels       map[string]string
		annotations  map[string]string
		unsched      bool
		addresses    []v1.NodeAddress
		wantV4       string
		wantV6       string
		wantExcluded bool
		wantCordoned bool
		wantASN      uint32
		wantErr      []string // substrings of the single error
	}{
		{
			name:      "first InternalIP of each family",
			addresses: addrs("Hostname", "n1", "ExternalIP", "192.0.2.9", "InternalIP", "10.0.0.1", "InternalIP", "10.0.0.2", "InternalIP", "fd00::1", "InternalIP", "fd00::2"),
			wantV4:    "10.0.0.1", wantV6: "fd00::1",
		},
		{
			name:      "ExternalIP when no InternalIP of the family",
			addresses: addrs("ExternalIP", "2001:db8::9", "InternalIP", "10.0.0.1", "ExternalIP", "192.0.2.9", "ExternalIP", "2001:db8::8"),
			wantV4:    "10.0.0.1", wantV6: "2001:db8::9",
		},
		{
			name:      "unparsable and mapped addresses",
			addresses: addrs("InternalIP", "not-an-ip", "InternalIP", "::ffff:10.0.0.7", "InternalIP", "0.0.0.0"),
			wantV4:    "10.0.0.7",
		},
		{name: "no addresses"},
		{name: "excluded with empty value", labels: map[string]string{LabelExcludeFromExternalLB: ""}, wantExcluded: true},
		{name: "excluded with any value", labels: map[string]string{LabelExcludeFromExternalLB: "false"}, wantExcluded: true},
		{name: "cordoned", unsched: true, wantCordoned: true},
		{name: "local ASN override", annotations: map[string]string{AnnotationLocalASN: " 4200000001 "}, wantASN: 4200000001},
		{name: "local ASN max", annotations: map[string]string{AnnotationLocalASN: "4294967294"}, wantASN: 4294967294},
		{name: "local ASN reserved", annotations: map[string]string{AnnotationLocalASN: "4294967295"}, wantErr: []string{AnnotationLocalASN, `"4294967295"`, "1 to 4294967294"}},
		{name: "local ASN zero", annotations: map[string]string{AnnotationLocalASN: "0"}, wantErr: []string{AnnotationLocalASN, `"0"`}},
		{name: "local ASN not a number", annotations: map[string]string{AnnotationLocalASN: "AS64512"}, wantErr: []string{"node n1", AnnotationLocalASN, `"AS64512"`, "remove the annotation", "ignored"}},
		{name: "local ASN negative", annotations: map[string]string{AnnotationLocalASN: "-1"}, wantErr: []string{`"-1"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			node := &v1.Node{
				ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: tc.labels, Annotations: tc.annotations},
				Spec:       v1.NodeSpec{Unschedulable: tc.unsched},
				Status:     v1.NodeStatus{Addresses: tc.addresses},
			}
			n, errs := NodeFrom(node)
			if n.Name != "n1" {
				t.Errorf("Name = %q", n.Name)
			}
			if got := addrString(n.IPv4); got != tc.wantV4 {
				t.Errorf("IPv4 = %q, want %q", got, tc.wantV4)
			}
			if got := addrString(n.IPv6); got != tc.wantV6 {
				t.Errorf("IPv6 = %q, want %q", got, tc.wantV6)
			}
			if n.Excluded != tc.wantExcluded || n.Cordoned != tc.wantCordoned {
				t.Errorf("Excluded, Cordoned = %v, %v; want %v, %v", n.Excluded, n.Cordoned, tc.wantExcluded, tc.wantCordoned)
			}
			if n.LocalASN != tc.wantASN {
				t.Errorf("LocalASN = %d, want %d", n.LocalASN, tc.wantASN)
			}
			switch {
			case len(tc.wantErr) == 0 && len(errs) > 0:
				t.Errorf("unexpected errors %v", errs)
			case len(tc.wantErr) > 0 && len(errs) != 1:
				t.Errorf("errors = %v, want one", errs)
			case len(tc.wantErr) > 0:
				for _, s := range tc.wantErr {
					if !strings.Contains(errs[0].Error(), s) {
						t.Errorf("error %q does not mention %q", errs[0], s)
					}
				}
			}
		})
	}
}

func addrString(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}
