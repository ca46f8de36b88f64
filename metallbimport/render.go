package metallbimport

import (
	"fmt"
	"io"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

// Objects returns the result's objects in the order they are applied
// (the Secrets, the BGPPeers, then the IPPools), as the API server takes
// them: without status or an empty creationTimestamp.
func (r *Result) Objects() ([]*unstructured.Unstructured, error) {
	var typed []runtime.Object
	for _, s := range r.Secrets {
		typed = append(typed, s)
	}
	for _, p := range r.Peers {
		typed = append(typed, p)
	}
	for _, p := range r.Pools {
		typed = append(typed, p)
	}
	out := make([]*unstructured.Unstructured, 0, len(typed))
	for _, o := range typed {
		u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
		if err != nil {
			return nil, fmt.Errorf("encoding %T: %w", o, err)
		}
		obj := &unstructured.Unstructured{Object: u}
		unstructured.RemoveNestedField(obj.Object, "status")
		unstructured.RemoveNestedField(obj.Object, "metadata", "creationTimestamp")
		out = append(out, obj)
	}
	return out, nil
}

// Write prints the result as YAML documents for `kubectl apply -f`: a
// comment with what was skipped, every note and the Secrets the chart must
// name, then the objects (Objects' order), without status or empty
// creationTimestamp. skipped are Objects.Skipped.
func (r *Result) Write(w io.Writer, skipped []string) error {
	var b strings.Builder
	b.WriteString("# Translated from MetalLB by kubectl vipcast import metallb.\n")
	for _, s := range skipped {
		b.WriteString("# skipped: " + s + "\n")
	}
	for _, n := range r.Notes {
		b.WriteString("# note: " + n.String() + "\n")
	}
	if len(r.PasswordSecrets) > 0 {
		fmt.Fprintf(&b, "# The speakers read BGP passwords from these Secrets only once the chart names them:\n#   speaker.bgpPasswordSecrets.secrets: [%s]\n", strings.Join(r.PasswordSecrets, ", "))
	}
	objs, err := r.Objects()
	if err != nil {
		return err
	}
	for _, o := range objs {
		y, err := yaml.Marshal(o.Object)
		if err != nil {
			return fmt.Errorf("encoding %s %s: %w", o.GetKind(), o.GetName(), err)
		}
		b.WriteString("---\n")
		b.Write(y)
	}
	_, err = io.WriteString(w, b.String())
	return err
}
