package metallbimport

import (
	"fmt"
	"io"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

// Objects returns the result's objects in the order they are applied:
// the Secrets, the BGPPeers, then the IPPools.
func (r *Result) Objects() []runtime.Object {
	var out []runtime.Object
	for _, s := range r.Secrets {
		out = append(out, s)
	}
	for _, p := range r.Peers {
		out = append(out, p)
	}
	for _, p := range r.Pools {
		out = append(out, p)
	}
	return out
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
	for _, o := range r.Objects() {
		u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
		if err != nil {
			return fmt.Errorf("encoding %T: %w", o, err)
		}
		delete(u, "status")
		if md, ok := u["metadata"].(map[string]any); ok {
			delete(md, "creationTimestamp")
		}
		y, err := yaml.Marshal(u)
		if err != nil {
			return fmt.Errorf("encoding %T: %w", o, err)
		}
		b.WriteString("---\n")
		b.Write(y)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
