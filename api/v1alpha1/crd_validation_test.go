package v1alpha1_test

// Fast tier for the CRD schemas: the generated CustomResourceDefinitions in
// charts/vipcast/crds are checked with the API server's own CRD validation
// (CEL rules compile, stay within the static cost limits, defaults are
// valid), and sample objects from testdata/ go through the same pruning,
// defaulting, OpenAPI, list-type and CEL validation steps the API server
// runs on create.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	crdvalidation "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel/model"
	structuraldefaulting "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	structurallisttype "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/listtype"
	structuralpruning "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apimachinery/pkg/runtime"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/util/validation/field"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/cel/environment"
	"sigs.k8s.io/yaml"

	"github.com/vipcast/vipcast/api/v1alpha1"
)

const (
	crdDir = "../../charts/vipcast/crds"

	// Annotations on the invalid samples in testdata/ (see its README).
	expectFieldAnnotation = "test.vipcast.io/expect-field"
	expectErrorAnnotation = "test.vipcast.io/expect-error"
)

// crdSchema holds the validators the API server builds for one CRD version.
type crdSchema struct {
	crd        *apiextensions.CustomResourceDefinition
	structural *structuralschema.Structural
	openapi    apiservervalidation.SchemaValidator
	cel        *cel.Validator
}

var (
	schemasOnce sync.Once
	schemas     map[string]*crdSchema // by kind
	schemasErr  error
)

// loadSchemas reads and validates every CRD in crdDir once per test binary.
func loadSchemas(t *testing.T) map[string]*crdSchema {
	t.Helper()
	schemasOnce.Do(func() { schemas, schemasErr = readSchemas() })
	if schemasErr != nil {
		t.Fatal(schemasErr)
	}
	return schemas
}

func readSchemas() (map[string]*crdSchema, error) {
	files, err := filepath.Glob(filepath.Join(crdDir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no CRDs in %s: run hack/generate.sh", crdDir)
	}
	out := map[string]*crdSchema{}
	for _, file := range files {
		s, err := readSchema(file)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		out[s.crd.Spec.Names.Kind] = s
	}
	return out, nil
}

func readSchema(file string) (*crdSchema, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var v1crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(data, &v1crd); err != nil {
		return nil, err
	}
	apiextensionsv1.SetObjectDefaults_CustomResourceDefinition(&v1crd)
	var crd apiextensions.CustomResourceDefinition
	if err := apiextensionsv1.Convert_v1_CustomResourceDefinition_To_apiextensions_CustomResourceDefinition(&v1crd, &crd, nil); err != nil {
		return nil, err
	}
	// The checks the API server runs when the CRD is created: structural
	// schema, valid defaults, CEL rules compile within the cost limits.
	if errs := crdvalidation.ValidateCustomResourceDefinition(context.Background(), &crd); len(errs) > 0 {
		return nil, fmt.Errorf("CRD rejected by the API server's validation: %w", errs.ToAggregate())
	}
	// The internal type hoists a schema shared by all versions into
	// spec.validation.
	if len(crd.Spec.Versions) != 1 || crd.Spec.Validation == nil {
		return nil, errors.New("expected exactly one version with a schema")
	}
	props := crd.Spec.Validation.OpenAPIV3Schema
	structural, err := structuralschema.NewStructural(props)
	if err != nil {
		return nil, err
	}
	openapi, _, err := apiservervalidation.NewSchemaValidator(props)
	if err != nil {
		return nil, err
	}
	return &crdSchema{
		crd:        &crd,
		structural: structural,
		openapi:    openapi,
		cel:        cel.NewValidator(structural, true, celconfig.PerCallLimit),
	}, nil
}

// validate runs obj through the API server's create path: pruning, defaulting,
// OpenAPI validation, list-type checks and, unless those found a blocking
// error, the CEL rules. It returns the errors, the unknown (pruned) fields
// and the CEL cost spent.
func (s *crdSchema) validate(obj map[string]any) (errs field.ErrorList, unknown []string, cost int64) {
	unknown = structuralpruning.PruneWithOptions(obj, s.structural, true,
		structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true})
	structuraldefaulting.Default(obj, s.structural)

	errs = append(errs, apiservervalidation.ValidateCustomResource(nil, obj, s.openapi)...)
	errs = append(errs, structurallisttype.ValidateListSetsAndMaps(nil, s.structural, obj)...)
	for _, err := range errs {
		// Same rule as the customresource registry strategy: CEL is skipped
		// after errors that could make rules expensive or meaningless.
		switch err.Type {
		case field.ErrorTypeNotSupported, field.ErrorTypeRequired, field.ErrorTypeTooLong,
			field.ErrorTypeTooMany, field.ErrorTypeTypeInvalid:
			return errs, unknown, 0
		}
	}
	celErrs, remaining := s.cel.Validate(context.Background(), nil, s.structural, obj, nil, celconfig.RuntimeCELCostBudget)
	return append(errs, celErrs...), unknown, celconfig.RuntimeCELCostBudget - remaining
}

// sample is one YAML document from testdata/.
type sample struct {
	file string
	raw  []byte
	obj  map[string]any
}

func (s sample) String() string {
	return fmt.Sprintf("%s %s/%s", filepath.Base(s.file), kindOf(s.obj), nameOf(s.obj))
}

func kindOf(obj map[string]any) string { k, _ := obj["kind"].(string); return k }

func nameOf(obj map[string]any) string {
	md, _ := obj["metadata"].(map[string]any)
	n, _ := md["name"].(string)
	return n
}

func annotation(obj map[string]any, key string) string {
	md, _ := obj["metadata"].(map[string]any)
	ann, _ := md["annotations"].(map[string]any)
	v, _ := ann[key].(string)
	return v
}

// readSamples returns every document of the testdata files matching glob.
func readSamples(t *testing.T, glob string) []sample {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", glob))
	if err != nil || len(files) == 0 {
		t.Fatalf("no samples match testdata/%s (err %v)", glob, err)
	}
	var out []sample
	for _, file := range files {
		f, err := os.Open(file)
		if err != nil {
			t.Fatal(err)
		}
		r := utilyaml.NewYAMLReader(bufio.NewReader(f))
		for {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			if len(bytes.TrimSpace(doc)) == 0 {
				continue
			}
			out = append(out, sample{file: file, raw: doc, obj: decodeYAML(t, doc)})
		}
		f.Close()
	}
	return out
}

// decodeYAML decodes like the API server: JSON numbers become int64 when
// they are integers.
func decodeYAML(t *testing.T, doc []byte) map[string]any {
	t.Helper()
	js, err := yaml.YAMLToJSON(doc)
	if err != nil {
		t.Fatal(err)
	}
	var obj map[string]any
	if err := utiljson.Unmarshal(js, &obj); err != nil {
		t.Fatal(err)
	}
	return obj
}

func TestCRDs(t *testing.T) {
	schemas := loadSchemas(t)
	// Short names are vipcast's own: "ippool(s)" and "bgppeer(s)" are
	// other products' too (Cilium, Calico, MetalLB).
	// A NodeTunnel is all spec, written by its node's speaker: no status.
	want := map[string]struct {
		plural string
		short  []string
		status bool
	}{
		"IPPool":        {"ippools", []string{"vippool", "vippools"}, true},
		"BGPPeer":       {"bgppeers", []string{"vippeer", "vippeers"}, true},
		"SpeakerStatus": {"speakerstatuses", []string{"vipspeaker", "vipspeakers"}, true},
		"NodeTunnel":    {"nodetunnels", []string{"viptunnel", "viptunnels"}, false},
	}
	if len(schemas) != len(want) {
		t.Errorf("found CRDs for %d kinds, want %d", len(schemas), len(want))
	}
	for kind, w := range want {
		s, ok := schemas[kind]
		if !ok {
			t.Errorf("no CRD for kind %s", kind)
			continue
		}
		crd := s.crd
		if crd.Spec.Group != v1alpha1.GroupName || crd.Spec.Scope != apiextensions.ClusterScoped ||
			crd.Spec.Names.Plural != w.plural || !slices.Equal(crd.Spec.Names.ShortNames, w.short) || len(crd.Spec.Names.Categories) != 1 ||
			crd.Spec.Names.Categories[0] != "vipcast" {
			t.Errorf("%s: unexpected group/scope/names: %s %s %+v", kind, crd.Spec.Group, crd.Spec.Scope, crd.Spec.Names)
		}
		v := crd.Spec.Versions[0]
		if v.Name != v1alpha1.SchemeGroupVersion.Version || !v.Served || !v.Storage {
			t.Errorf("%s: version %q served=%v storage=%v", kind, v.Name, v.Served, v.Storage)
		}
		// Shared by all versions, so hoisted to spec in the internal type.
		if hasStatus := crd.Spec.Subresources != nil && crd.Spec.Subresources.Status != nil; hasStatus != w.status {
			t.Errorf("%s: status subresource %v, want %v", kind, hasStatus, w.status)
		}
		if len(crd.Spec.AdditionalPrinterColumns) < 4 {
			t.Errorf("%s: only %d printer columns", kind, len(crd.Spec.AdditionalPrinterColumns))
		}
	}
}

func TestSchemeRegistration(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	for _, obj := range []runtime.Object{&v1alpha1.IPPool{}, &v1alpha1.IPPoolList{}, &v1alpha1.BGPPeer{}, &v1alpha1.BGPPeerList{},
		&v1alpha1.SpeakerStatus{}, &v1alpha1.SpeakerStatusList{}, &v1alpha1.NodeTunnel{}, &v1alpha1.NodeTunnelList{}} {
		gvks, _, err := scheme.ObjectKinds(obj)
		if err != nil || len(gvks) != 1 || gvks[0].GroupVersion() != v1alpha1.SchemeGroupVersion {
			t.Errorf("%T: kinds %v, err %v", obj, gvks, err)
		}
	}
}

func TestValidSamples(t *testing.T) {
	schemas := loadSchemas(t)
	for _, s := range readSamples(t, "*-valid.yaml") {
		t.Run(s.String(), func(t *testing.T) {
			schema := schemas[kindOf(s.obj)]
			if schema == nil {
				t.Fatalf("no CRD for kind %q", kindOf(s.obj))
			}
			errs, unknown, _ := schema.validate(s.obj)
			if len(unknown) > 0 {
				t.Errorf("unknown fields (the API server drops them or, with strict field validation, rejects the object): %v", unknown)
			}
			for _, err := range errs {
				t.Errorf("rejected: %v", err)
			}
			// The Go types must accept everything the schema does.
			var typed any
			switch kindOf(s.obj) {
			case "IPPool":
				typed = &v1alpha1.IPPool{}
			case "BGPPeer":
				typed = &v1alpha1.BGPPeer{}
			case "NodeTunnel":
				typed = &v1alpha1.NodeTunnel{}
			default:
				t.Fatalf("no Go type for kind %q: add it here", kindOf(s.obj))
			}
			if err := yaml.UnmarshalStrict(s.raw, typed); err != nil {
				t.Errorf("strict decoding into %T: %v", typed, err)
			}
		})
	}
}

func TestInvalidSamples(t *testing.T) {
	schemas := loadSchemas(t)
	for _, s := range readSamples(t, "*-invalid.yaml") {
		t.Run(s.String(), func(t *testing.T) {
			wantField, wantErr := annotation(s.obj, expectFieldAnnotation), annotation(s.obj, expectErrorAnnotation)
			if wantField == "" || wantErr == "" {
				t.Fatalf("sample lacks the %s and %s annotations", expectFieldAnnotation, expectErrorAnnotation)
			}
			schema := schemas[kindOf(s.obj)]
			if schema == nil {
				t.Fatalf("no CRD for kind %q", kindOf(s.obj))
			}
			errs, unknown, _ := schema.validate(s.obj)
			if len(unknown) > 0 {
				t.Errorf("unknown fields in sample: %v", unknown)
			}
			if len(errs) == 0 {
				t.Fatalf("accepted; want an error on %s containing %q", wantField, wantErr)
			}
			for _, err := range errs {
				if err.Field == wantField && strings.Contains(err.Error(), wantErr) {
					t.Logf("rejected as expected: %v", err)
					return
				}
			}
			t.Errorf("want an error on %s containing %q; got:\n%v", wantField, wantErr, errs.ToAggregate())
		})
	}
}

// TestRangeOrder checks the hand-written CEL rule that rejects ranges whose
// first address is after the last against net/netip, on random IPv4 and IPv6
// ranges in canonical, expanded and upper-case spellings.
func TestRangeOrder(t *testing.T) {
	schema := loadSchemas(t)["IPPool"]
	rng := rand.New(rand.NewPCG(1, 2))
	randAddr := func(v6 bool) netip.Addr {
		if !v6 {
			var b [4]byte
			for i := range b {
				switch rng.IntN(4) { // favour boundary octets
				case 0:
					b[i] = 0
				case 1:
					b[i] = 255
				default:
					b[i] = byte(rng.IntN(256))
				}
			}
			return netip.AddrFrom4(b)
		}
		var b [16]byte
		for i := 0; i+1 < len(b); i += 2 {
			switch rng.IntN(3) { // zero groups produce "::" compression
			case 0:
			case 1:
				b[i+1] = byte(rng.IntN(256))
			default:
				b[i], b[i+1] = byte(rng.IntN(256)), byte(rng.IntN(256))
			}
		}
		a := netip.AddrFrom16(b)
		if a.Is4In6() { // IPv4-mapped addresses are not valid in the API
			b[10] = 0
			a = netip.AddrFrom16(b)
		}
		return a
	}
	spell := func(a netip.Addr) string {
		switch rng.IntN(3) {
		case 0:
			return a.StringExpanded()
		case 1:
			return strings.ToUpper(a.String())
		default:
			return a.String()
		}
	}
	for round := 0; round < 4; round++ {
		var addresses []string
		backwards := map[int]bool{}
		seen := map[string]bool{}
		for len(addresses) < 1000 {
			v6 := rng.IntN(2) == 0
			first, last := randAddr(v6), randAddr(v6)
			switch rng.IntN(5) {
			case 0:
				last = first
			case 1:
				last = first.Next()
			case 2:
				last = first.Prev()
			}
			if !last.IsValid() || last.Is4In6() {
				continue
			}
			entry := spell(first) + "-" + spell(last)
			if seen[entry] {
				continue
			}
			seen[entry] = true
			if first.Compare(last) > 0 {
				backwards[len(addresses)] = true
			}
			addresses = append(addresses, entry)
		}
		obj := ippool("range-order", addresses)
		errs, _, cost := schema.validate(obj)
		t.Logf("round %d: %d ranges, %d backwards, CEL cost %d of %d", round, len(addresses), len(backwards), cost, celconfig.RuntimeCELCostBudget)
		got := map[int]bool{}
		for _, err := range errs {
			var i int
			if _, scanErr := fmt.Sscanf(err.Field, "spec.addresses[%d]", &i); scanErr != nil || !strings.Contains(err.Detail, "is backwards") {
				t.Errorf("unexpected error: %v", err)
				continue
			}
			got[i] = true
		}
		for i, entry := range addresses {
			if got[i] != backwards[i] {
				t.Errorf("%q: rejected=%v, want %v", entry, got[i], backwards[i])
			}
		}
	}
}

// TestWorstCaseCost fills a pool with the maximum number of the longest IPv6
// ranges: the API server must still validate it within its per-object CEL
// budget.
func TestWorstCaseCost(t *testing.T) {
	schema := loadSchemas(t)["IPPool"]
	var addresses []string
	for i := 0; i < 1024; i++ {
		addresses = append(addresses, fmt.Sprintf("2001:db8:1234:5678:9abc:def0:%x:1111-2001:db8:1234:5678:9abc:def0:%x:ffff", 0x1000+i, 0x1000+i))
	}
	obj := ippool("worst-case", addresses)
	obj["spec"].(map[string]any)["bgp"] = map[string]any{"aggregationLengthV6": int64(128)}
	errs, _, cost := schema.validate(obj)
	for _, err := range errs {
		t.Error(err)
	}
	t.Logf("CEL cost %d of %d", cost, celconfig.RuntimeCELCostBudget)
}

// TestCELCostHeadroom logs, for every CEL rule, its worst-case static cost
// times the number of times it can run per object (the product of the
// enclosing lists' maxItems): the API server refuses a CRD when that exceeds
// crdvalidation.StaticEstimatedCostLimit. Run with -v when changing rules or
// maxItems/maxLength bounds to see the remaining headroom.
func TestCELCostHeadroom(t *testing.T) {
	envSet := environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion())
	for kind, s := range loadSchemas(t) {
		var walk func(path string, node *structuralschema.Structural, root bool, cardinality uint64)
		walk = func(path string, node *structuralschema.Structural, root bool, cardinality uint64) {
			if len(node.XValidations) > 0 {
				results, err := cel.Compile(node, model.SchemaDeclType(node, root), celconfig.PerCallLimit, envSet, cel.NewExpressionsEnvLoader())
				if err != nil {
					t.Fatalf("%s %s: %v", kind, path, err)
				}
				for i, r := range results {
					if r.Error != nil {
						t.Errorf("%s %s rule %d: %v", kind, path, i, r.Error)
						continue
					}
					total := max(r.MaxCost, r.MessageExpressionMaxCost) * cardinality
					t.Logf("%s %s rule %d: cost %d x %d = %d (%.1f%% of the limit)", kind, path, i,
						max(r.MaxCost, r.MessageExpressionMaxCost), cardinality, total,
						100*float64(total)/crdvalidation.StaticEstimatedCostLimit)
					if total > crdvalidation.StaticEstimatedCostLimit {
						t.Errorf("%s %s rule %d: estimated cost %d exceeds %d", kind, path, i, total, crdvalidation.StaticEstimatedCostLimit)
					}
				}
			}
			for name, prop := range node.Properties {
				walk(path+"."+name, &prop, false, cardinality)
			}
			if node.Items != nil {
				n := cardinality
				if node.ValueValidation != nil && node.ValueValidation.MaxItems != nil {
					n *= uint64(*node.ValueValidation.MaxItems)
				} else {
					n = 0 // unbounded: only fine without rules below
				}
				walk(path+"[*]", node.Items, false, n)
			}
		}
		walk("", s.structural, true, 1)
	}
}

func ippool(name string, addresses []string) map[string]any {
	list := make([]any, len(addresses))
	for i, a := range addresses {
		list[i] = a
	}
	return map[string]any{
		"apiVersion": v1alpha1.SchemeGroupVersion.String(),
		"kind":       "IPPool",
		"metadata":   map[string]any{"name": name},
		"spec":       map[string]any{"addresses": list},
	}
}
