package speaker

import (
	"net/netip"
	"reflect"
	"strconv"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// fuzzNodeAddresses decodes FuzzNodeFrom's addresses: entries split at
// "|", each a type letter (I InternalIP, E ExternalIP, H Hostname, any
// other letter an unknown type) followed by the address text.
func fuzzNodeAddresses(s string) []v1.NodeAddress {
	var out []v1.NodeAddress
	for _, e := range strings.Split(s, "|") {
		if e == "" {
			continue
		}
		typ := v1.NodeAddressType(e[:1])
		switch e[0] {
		case 'I':
			typ = v1.NodeInternalIP
		case 'E':
			typ = v1.NodeExternalIP
		case 'H':
			typ = v1.NodeHostName
		}
		out = append(out, v1.NodeAddress{Type: typ, Address: e[1:]})
	}
	return out
}

// usableNextHop returns the next hop an address entry stands for, if it is
// one: an IP address (surrounding spaces allowed), without zone, not
// unspecified (in plain or IPv4-mapped form), IPv4-mapped ones as IPv4.
func usableNextHop(s string) (netip.Addr, bool) {
	ip, err := netip.ParseAddr(strings.TrimSpace(s))
	if err != nil || ip.Zone() != "" {
		return netip.Addr{}, false
	}
	ip = ip.Unmap()
	return ip, !ip.IsUnspecified()
}

// FuzzNodeFrom feeds NodeFrom Nodes with arbitrary names, labels,
// addresses, cordon and local-ASN annotation. It never panics, does not
// modify the Node and is deterministic; it copies the name, labels and
// cordon, and Excluded is the exclusion label's presence; IPv4 (IPv6) is
// the zero Addr or a plain IPv4 (IPv6, not mapped) address without zone
// that is not unspecified: the first usable InternalIP of the family, else
// the first usable ExternalIP; LocalASN is non-zero exactly when the
// annotation is a decimal ASN of 1 to 4294967294, and then equals it; an
// error is returned exactly when the annotation is present and not such an
// ASN, and it names the node, the annotation and its value.
func FuzzNodeFrom(f *testing.F) {
	f.Add("n1", "zone", "a", false, "I10.0.0.1|Ifd00::1", true, "64512")
	f.Add("n1", LabelExcludeFromExternalLB, "", true, "E192.0.2.1|I10.0.0.1|E2001:db8::1|Hn1.example", false, "")
	f.Add("n2", "zone", "b", false, "I ::ffff:10.0.0.2 |I0.0.0.0|I::|Ife80::1%eth0|Ibogus|X10.9.9.9", true, " 4294967294 ")
	f.Add("n3", "", "", false, "E::ffff:192.0.2.7|Ifd00::2|Ifd00::3", true, "4294967295")
	// An IPv4-mapped unspecified InternalIP is no next hop either.
	f.Add("n3", "", "", false, "I::ffff:0.0.0.0|E::ffff:192.0.2.7|Ifd00::2", false, "")
	f.Add("n4", "a/b", "c", false, "E10.0.0.1|E10.0.0.2|I10.0.0.3", true, "0")
	f.Add("", "k", "v", true, "", true, "-1")
	f.Add("n5", "k", "v", false, "I10.0.0.1/24|I[::1]|I10.0.0.1:80", true, "0x10")
	f.Add("n6", "k", "v", false, "H10.0.0.1|I2001:db8::1", true, "00064512")
	f.Fuzz(func(t *testing.T, name, labelKey, labelValue string, unschedulable bool, addrs string, annotated bool, asn string) {
		node := &v1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       v1.NodeSpec{Unschedulable: unschedulable},
			Status:     v1.NodeStatus{Addresses: fuzzNodeAddresses(addrs)},
		}
		if labelKey != "" {
			node.Labels = map[string]string{labelKey: labelValue}
		}
		if annotated {
			node.Annotations = map[string]string{AnnotationLocalASN: asn}
		}
		before := node.DeepCopy()
		n, errs := NodeFrom(node)
		if !reflect.DeepEqual(node, before) {
			t.Fatalf("NodeFrom modified the node: %+v, was %+v", node, before)
		}
		if n2, errs2 := NodeFrom(node); !reflect.DeepEqual(n, n2) || !reflect.DeepEqual(errs, errs2) {
			t.Fatalf("NodeFrom is not deterministic: %+v %v, then %+v %v", n, errs, n2, errs2)
		}

		_, excluded := node.Labels[LabelExcludeFromExternalLB]
		if n.Name != name || !reflect.DeepEqual(map[string]string(n.Labels), node.Labels) || n.Cordoned != unschedulable || n.Excluded != excluded {
			t.Fatalf("NodeFrom(%+v) = %+v: name, labels, cordon or exclusion not copied", node, n)
		}

		// The next hops: first usable InternalIP of each family, else ExternalIP.
		var want [2][2]netip.Addr // [internal, external][v4, v6]
		for _, a := range node.Status.Addresses {
			kind := 0
			switch a.Type {
			case v1.NodeInternalIP:
			case v1.NodeExternalIP:
				kind = 1
			default:
				continue
			}
			ip, ok := usableNextHop(a.Address)
			if !ok {
				continue
			}
			fam := 0
			if ip.Is6() {
				fam = 1
			}
			if !want[kind][fam].IsValid() {
				want[kind][fam] = ip
			}
		}
		for fam, got := range []netip.Addr{n.IPv4, n.IPv6} {
			exp := want[0][fam]
			if !exp.IsValid() {
				exp = want[1][fam]
			}
			if got != exp {
				t.Fatalf("NodeFrom(%q): next hop of family %d is %v, want %v", addrs, fam, got, exp)
			}
		}
		if n.IPv4.IsValid() && (!n.IPv4.Is4() || n.IPv4.IsUnspecified()) {
			t.Fatalf("NodeFrom(%q): IPv4 next hop %v", addrs, n.IPv4)
		}
		if n.IPv6.IsValid() && (!n.IPv6.Is6() || n.IPv6.Is4In6() || n.IPv6.Zone() != "" || n.IPv6.IsUnspecified()) {
			t.Fatalf("NodeFrom(%q): IPv6 next hop %v", addrs, n.IPv6)
		}

		// The local ASN override.
		digits := strings.TrimSpace(asn)
		v, perr := strconv.ParseUint(digits, 10, 64)
		valid := annotated && perr == nil && v >= 1 && v <= maxASN && strings.Trim(digits, "0123456789") == ""
		switch {
		case valid && (uint64(n.LocalASN) != v || len(errs) != 0):
			t.Fatalf("annotation %q: LocalASN %d, errors %v; want %d and no error", asn, n.LocalASN, errs, v)
		case !valid && n.LocalASN != 0:
			t.Fatalf("annotation %q (present %v): LocalASN %d, want 0", asn, annotated, n.LocalASN)
		case !valid && annotated && len(errs) != 1:
			t.Fatalf("annotation %q: errors %v, want one", asn, errs)
		case !annotated && len(errs) != 0:
			t.Fatalf("no annotation: errors %v", errs)
		}
		for _, err := range errs {
			msg := err.Error()
			for _, part := range []string{"node " + name + ":", AnnotationLocalASN, strconv.Quote(asn)} {
				if !strings.Contains(msg, part) {
					t.Fatalf("error %q does not name %s", msg, part)
				}
			}
		}
	})
}
