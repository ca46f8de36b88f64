// Package chart renders the vipcast Helm chart (charts/vipcast) with Helm's
// own Go packages, the way `helm install` does: values coalesced with the
// chart's defaults and checked against values.schema.json, the chart's
// kubeVersion checked, templates rendered by Helm's engine. Its tests check
// the rendered manifests and apply them to a real API server.
package chart

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"runtime"
	"sort"
	"strings"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
)

// KubeVersion is the Kubernetes version the chart is rendered for (the
// control-plane harness's).
const KubeVersion = "v1.37.1"

// Dir returns the chart's directory, charts/vipcast in this repository.
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "charts", "vipcast")
}

// Rendered is one rendering of the chart.
type Rendered struct {
	// CRDs are the chart's crds/ directory, which Helm installs first.
	CRDs []*unstructured.Unstructured
	// Objects are the rendered templates, in template-file order.
	Objects []*unstructured.Unstructured
	// Notes is the rendered NOTES.txt.
	Notes string
}

// Render renders the chart as release name in namespace with the given
// values (YAML, may be empty): the same steps as `helm install`, without
// a cluster.
func Render(name, namespace string, valuesYAML []byte) (*Rendered, error) {
	return renderChart(name, namespace, valuesYAML, nil)
}

// RenderAgainst is Render with the templates' lookup answered by the API
// server of cfg, as helm upgrade does.
func RenderAgainst(cfg *rest.Config, name, namespace string, valuesYAML []byte) (*Rendered, error) {
	return renderChart(name, namespace, valuesYAML, cfg)
}

func renderChart(name, namespace string, valuesYAML []byte, cfg *rest.Config) (*Rendered, error) {
	ch, err := loader.Load(Dir())
	if err != nil {
		return nil, fmt.Errorf("loading the chart: %w", err)
	}
	vals, err := chartutil.ReadValues(valuesYAML)
	if err != nil {
		return nil, fmt.Errorf("parsing values: %w", err)
	}
	caps := chartutil.DefaultCapabilities.Copy()
	kv, err := chartutil.ParseKubeVersion(KubeVersion)
	if err != nil {
		return nil, err
	}
	caps.KubeVersion = *kv
	if ch.Metadata.KubeVersion != "" && !chartutil.IsCompatibleRange(ch.Metadata.KubeVersion, caps.KubeVersion.String()) {
		return nil, fmt.Errorf("chart requires kubeVersion %s, which is incompatible with %s", ch.Metadata.KubeVersion, caps.KubeVersion.String())
	}
	opts := chartutil.ReleaseOptions{Name: name, Namespace: namespace, Revision: 1, IsInstall: true}
	// ToRenderValues coalesces the values and validates them against
	// values.schema.json, as helm install does.
	top, err := chartutil.ToRenderValues(ch, vals, opts, caps)
	if err != nil {
		return nil, err
	}
	eng := engine.Engine{Strict: false}
	if cfg != nil {
		eng = engine.New(cfg)
	}
	files, err := eng.Render(ch, top)
	if err != nil {
		return nil, err
	}
	r := &Rendered{}
	for _, f := range ch.CRDObjects() {
		objs, err := decode(f.File.Data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.Filename, err)
		}
		r.CRDs = append(r.CRDs, objs...)
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if strings.HasSuffix(n, "NOTES.txt") {
			r.Notes = files[n]
			continue
		}
		if !strings.HasSuffix(n, ".yaml") {
			continue
		}
		objs, err := decode([]byte(files[n]))
		if err != nil {
			return nil, fmt.Errorf("%s: %w\n%s", n, err, files[n])
		}
		r.Objects = append(r.Objects, objs...)
	}
	return r, nil
}

// decode splits a multi-document YAML stream into objects, skipping empty
// documents; every object must have an apiVersion and a kind.
func decode(data []byte) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	rd := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := rd.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		var m map[string]any
		if err := utilyaml.Unmarshal(doc, &m); err != nil {
			return nil, fmt.Errorf("document %q: %w", doc, err)
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		if u.GetAPIVersion() == "" || u.GetKind() == "" {
			return nil, fmt.Errorf("document without apiVersion or kind: %s", doc)
		}
		out = append(out, u)
	}
}

// Find returns the objects of kind (and name, when not empty).
func (r *Rendered) Find(kind, name string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range r.Objects {
		if o.GetKind() == kind && (name == "" || o.GetName() == name) {
			out = append(out, o)
		}
	}
	return out
}

// Kinds counts the rendered objects by kind.
func (r *Rendered) Kinds() map[string]int {
	m := map[string]int{}
	for _, o := range r.Objects {
		m[o.GetKind()]++
	}
	return m
}
