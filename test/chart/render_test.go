package chart

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
)

const (
	release   = "vipcast"
	namespace = "vipcast-system"
)

// The RBAC each component is meant to have: "apiGroup/resource" → verbs,
// derived from the binaries' code (see the comments in the chart's rbac-*.yaml).
// The tests compare the rendered roles with these tables exactly, so a
// broader verb, a new resource or a lost one fails.
var (
	wantCCMClusterRole = map[string][]string{
		"/services":                                 {"get", "list", "patch", "watch"},
		"/services/status":                          {"patch"},
		"/nodes":                                    {"get", "list", "patch", "update", "watch"},
		"/nodes/status":                             {"patch"},
		"/namespaces":                               {"list", "watch"},
		"/events":                                   {"create", "patch"},
		"vipcast.io/ippools":                        {"list", "patch", "watch"},
		"vipcast.io/ippools/status":                 {"update"},
		"vipcast.io/bgppeers":                       {"list", "watch"},
		"vipcast.io/bgppeers/status":                {"update"},
		"vipcast.io/speakerstatuses":                {"list", "watch"},
		"authentication.k8s.io/tokenreviews":        {"create"},
		"authorization.k8s.io/subjectaccessreviews": {"create"},
	}
	// Leader election: create any Lease; get/update only the CCM's.
	wantCCMLeaseRole = map[string][]string{
		"coordination.k8s.io/leases":              {"create"},
		"coordination.k8s.io/leases[vipcast-ccm]": {"get", "update"},
	}
	wantCCMAuthReaderRole = map[string][]string{
		"/configmaps[extension-apiserver-authentication]": {"get", "list", "watch"},
	}
	wantSpeakerClusterRole = map[string][]string{
		"/services":                         {"list", "watch"},
		"discovery.k8s.io/endpointslices":   {"list", "watch"},
		"/nodes":                            {"get", "list", "watch"},
		"vipcast.io/ippools":                {"list", "watch"},
		"vipcast.io/bgppeers":               {"list", "watch"},
		"/events":                           {"create", "patch"},
		"vipcast.io/speakerstatuses":        {"create"},
		"vipcast.io/speakerstatuses/status": {"patch"},
		"vipcast.io/nodetunnels":            {"create", "get", "list", "update", "watch"},
	}
)

// render renders with the values in valuesYAML and fails the test on error.
func render(t *testing.T, valuesYAML string) *Rendered {
	t.Helper()
	r, err := Render(release, namespace, []byte(valuesYAML))
	if err != nil {
		t.Fatalf("rendering: %v", err)
	}
	return r
}

func fullValues(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(Dir(), "ci", "full-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// one returns the only object of kind and name, converted to T.
func one[T any](t *testing.T, r *Rendered, kind, name string) *T {
	t.Helper()
	objs := r.Find(kind, name)
	if len(objs) != 1 {
		t.Fatalf("%d %s objects named %q, want 1 (kinds rendered: %v)", len(objs), kind, name, r.Kinds())
	}
	return convert[T](t, objs[0])
}

func convert[T any](t *testing.T, u *unstructured.Unstructured) *T {
	t.Helper()
	out := new(T)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, out, true); err != nil {
		t.Fatalf("%s %s does not convert to %T: %v", u.GetKind(), u.GetName(), out, err)
	}
	return out
}

// ruleTable flattens policy rules into "group/resource[names]" → sorted verbs.
func ruleTable(t *testing.T, rules []rbacv1.PolicyRule) map[string][]string {
	t.Helper()
	m := map[string][]string{}
	for _, r := range rules {
		if len(r.NonResourceURLs) > 0 {
			for _, u := range r.NonResourceURLs {
				m["url:"+u] = append(m["url:"+u], r.Verbs...)
			}
			continue
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				key := g + "/" + res
				if len(r.ResourceNames) > 0 {
					key += "[" + strings.Join(r.ResourceNames, ",") + "]"
				}
				m[key] = append(m[key], r.Verbs...)
			}
		}
	}
	for k, v := range m {
		sort.Strings(v)
		m[k] = slices.Compact(v)
		for _, verb := range v {
			if verb == "*" {
				t.Errorf("rule %s grants every verb", k)
			}
		}
		if strings.Contains(k, "*") {
			t.Errorf("rule %s uses a wildcard", k)
		}
	}
	return m
}

func checkRules(t *testing.T, what string, rules []rbacv1.PolicyRule, want map[string][]string) {
	t.Helper()
	got := ruleTable(t, rules)
	for k, v := range want {
		if !slices.Equal(got[k], v) {
			t.Errorf("%s: %s verbs %v, want %v", what, k, got[k], v)
		}
	}
	for k, v := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: unexpected rule %s %v", what, k, v)
		}
	}
}

func checkBinding(t *testing.T, subjects []rbacv1.Subject, roleRef rbacv1.RoleRef, kind, role, sa string) {
	t.Helper()
	if roleRef.Kind != kind || roleRef.Name != role {
		t.Errorf("binding refers to %s %s, want %s %s", roleRef.Kind, roleRef.Name, kind, role)
	}
	if len(subjects) != 1 || subjects[0].Kind != "ServiceAccount" || subjects[0].Name != sa || subjects[0].Namespace != namespace {
		t.Errorf("binding of %s has subjects %+v, want only ServiceAccount %s/%s", role, subjects, namespace, sa)
	}
}

func arg(args []string, flag string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v, true
		}
	}
	return "", false
}

func wantArg(t *testing.T, what string, args []string, flag, value string) {
	t.Helper()
	if v, ok := arg(args, flag); !ok || v != value {
		t.Errorf("%s: %s=%q (set: %v), want %q; args %q", what, flag, v, ok, value, args)
	}
}

// checkCommon checks what holds for every rendering: every object
// converts to its typed form, the RBAC tables, the ServiceAccounts and bindings.
func checkCommon(t *testing.T, r *Rendered) {
	t.Helper()
	for _, o := range r.Objects {
		if o.GetName() == "" {
			t.Errorf("%s without a name", o.GetKind())
		}
		if _, ok := o.GetLabels()["app.kubernetes.io/instance"]; !ok {
			t.Errorf("%s %s without the instance label", o.GetKind(), o.GetName())
		}
	}
	one[corev1.ServiceAccount](t, r, "ServiceAccount", "vipcast-ccm")
	one[corev1.ServiceAccount](t, r, "ServiceAccount", "vipcast-speaker")

	ccmRole := one[rbacv1.ClusterRole](t, r, "ClusterRole", "vipcast-ccm")
	checkRules(t, "CCM ClusterRole", ccmRole.Rules, wantCCMClusterRole)
	crb := one[rbacv1.ClusterRoleBinding](t, r, "ClusterRoleBinding", "vipcast-ccm")
	checkBinding(t, crb.Subjects, crb.RoleRef, "ClusterRole", "vipcast-ccm", "vipcast-ccm")

	lease := one[rbacv1.Role](t, r, "Role", "vipcast-ccm-leader-election")
	if lease.Namespace != "kube-system" {
		t.Errorf("leader-election Role in %q, want kube-system", lease.Namespace)
	}
	checkRules(t, "CCM leader-election Role", lease.Rules, wantCCMLeaseRole)
	lrb := one[rbacv1.RoleBinding](t, r, "RoleBinding", "vipcast-ccm-leader-election")
	checkBinding(t, lrb.Subjects, lrb.RoleRef, "Role", "vipcast-ccm-leader-election", "vipcast-ccm")

	auth := one[rbacv1.Role](t, r, "Role", "vipcast-ccm-authentication-reader")
	if auth.Namespace != "kube-system" {
		t.Errorf("authentication-reader Role in %q, want kube-system", auth.Namespace)
	}
	checkRules(t, "CCM authentication-reader Role", auth.Rules, wantCCMAuthReaderRole)
	arb := one[rbacv1.RoleBinding](t, r, "RoleBinding", "vipcast-ccm-authentication-reader")
	checkBinding(t, arb.Subjects, arb.RoleRef, "Role", "vipcast-ccm-authentication-reader", "vipcast-ccm")

	spk := one[rbacv1.ClusterRole](t, r, "ClusterRole", "vipcast-speaker")
	checkRules(t, "speaker ClusterRole", spk.Rules, wantSpeakerClusterRole)
	for k, verbs := range ruleTable(t, spk.Rules) {
		for _, v := range verbs {
			if !strings.HasPrefix(k, "vipcast.io/speakerstatuses") && k != "vipcast.io/nodetunnels" && k != "/events" && !slices.Contains([]string{"get", "list", "watch"}, v) {
				t.Errorf("speaker may %s %s: it only reads (and records Events, its SpeakerStatus and its NodeTunnel)", v, k)
			}
		}
	}
	srb := one[rbacv1.ClusterRoleBinding](t, r, "ClusterRoleBinding", "vipcast-speaker")
	checkBinding(t, srb.Subjects, srb.RoleRef, "ClusterRole", "vipcast-speaker", "vipcast-speaker")
	for _, u := range r.Find("RoleBinding", "vipcast-speaker-bgp-passwords") {
		b := convert[rbacv1.RoleBinding](t, u)
		checkBinding(t, b.Subjects, b.RoleRef, "Role", "vipcast-speaker-bgp-passwords", "vipcast-speaker")
	}
	// Secret informers, one per named Secret: get, list and watch of
	// those names only (resourceNames), never a whole namespace.
	for _, u := range r.Find("Role", "vipcast-speaker-bgp-passwords") {
		role := convert[rbacv1.Role](t, u)
		if len(role.Rules) != 1 || len(role.Rules[0].ResourceNames) == 0 {
			t.Errorf("speaker Secret Role in %s: rules %+v, want one rule naming its Secrets", u.GetNamespace(), role.Rules)
			continue
		}
		names := role.Rules[0].ResourceNames
		if !slices.IsSorted(names) || len(slices.Compact(slices.Clone(names))) != len(names) {
			t.Errorf("speaker Secret Role in %s: resourceNames %q, want sorted, each once", u.GetNamespace(), names)
		}
		checkRules(t, "speaker Secret Role in "+u.GetNamespace(), role.Rules, map[string][]string{
			"/secrets[" + strings.Join(names, ",") + "]": {"get", "list", "watch"},
		})
		if u.GetNamespace() == namespace {
			t.Errorf("speaker may read Secrets in the release namespace %s", namespace)
		}
	}
	// Its own DaemonSet, read at shutdown (--owner-daemonset), and nothing else.
	own := one[rbacv1.Role](t, r, "Role", "vipcast-speaker")
	if own.Namespace != namespace {
		t.Errorf("speaker's own Role in %q, want the release namespace %s", own.Namespace, namespace)
	}
	checkRules(t, "speaker's own Role", own.Rules, map[string][]string{"apps/daemonsets[vipcast-speaker]": {"get"}})
	orb := one[rbacv1.RoleBinding](t, r, "RoleBinding", "vipcast-speaker")
	checkBinding(t, orb.Subjects, orb.RoleRef, "Role", "vipcast-speaker", "vipcast-speaker")
	wantArg(t, "speaker", one[appsv1.DaemonSet](t, r, "DaemonSet", "vipcast-speaker").Spec.Template.Spec.Containers[0].Args,
		"--owner-daemonset", namespace+"/vipcast-speaker")
	// Only the speaker's password Roles grant anything on Secrets.
	for _, u := range r.Find("Role", "") {
		if _, ok := ruleTable(t, convert[rbacv1.Role](t, u).Rules)["/secrets"]; ok && u.GetName() != "vipcast-speaker-bgp-passwords" {
			t.Errorf("Role %s/%s grants Secrets", u.GetNamespace(), u.GetName())
		}
	}
	for _, u := range r.Find("Namespace", "") {
		if u.GetAnnotations()["helm.sh/resource-policy"] != "keep" {
			t.Errorf("Namespace %s lacks helm.sh/resource-policy: keep: uninstall would delete its Secrets", u.GetName())
		}
	}
	// Nobody gets cluster-wide Secrets by default or in the full example.
	for _, u := range r.Find("ClusterRole", "") {
		for k := range ruleTable(t, convert[rbacv1.ClusterRole](t, u).Rules) {
			if strings.HasPrefix(k, "/secrets") {
				t.Errorf("ClusterRole %s grants %s", u.GetName(), k)
			}
		}
	}
}

// passwordSecrets lists the Secrets (namespace/name) the speaker's Roles
// let it read, sorted.
func passwordSecrets(t *testing.T, r *Rendered) []string {
	t.Helper()
	var out []string
	for _, u := range r.Find("Role", "vipcast-speaker-bgp-passwords") {
		for _, rule := range convert[rbacv1.Role](t, u).Rules {
			for _, name := range rule.ResourceNames {
				out = append(out, u.GetNamespace()+"/"+name)
			}
		}
	}
	sort.Strings(out)
	return out
}

// checkSpeaker checks the DaemonSet's invariants and returns it.
func checkSpeaker(t *testing.T, r *Rendered, delay string, delaySeconds int64) *appsv1.DaemonSet {
	t.Helper()
	ds := one[appsv1.DaemonSet](t, r, "DaemonSet", "vipcast-speaker")
	spec := ds.Spec.Template.Spec
	if !spec.HostNetwork || spec.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
		t.Errorf("speaker hostNetwork=%v dnsPolicy=%q, want true and ClusterFirstWithHostNet", spec.HostNetwork, spec.DNSPolicy)
	}
	if spec.ServiceAccountName != "vipcast-speaker" {
		t.Errorf("speaker ServiceAccount %q", spec.ServiceAccountName)
	}
	if !slices.ContainsFunc(spec.Tolerations, func(tl corev1.Toleration) bool {
		return tl.Key == "" && tl.Operator == corev1.TolerationOpExists && tl.Effect == ""
	}) {
		t.Errorf("speaker tolerations %+v do not tolerate every taint", spec.Tolerations)
	}
	if g := spec.TerminationGracePeriodSeconds; g == nil || *g <= delaySeconds+5 {
		t.Errorf("terminationGracePeriodSeconds %v, want more than the convergence delay (%ds) + 5s", g, delaySeconds)
	}
	if len(spec.Containers) != 1 || len(spec.InitContainers) > 1 {
		t.Fatalf("speaker has %d containers and %d init containers, want 1 and at most 1", len(spec.Containers), len(spec.InitContainers))
	}
	for _, ic := range spec.InitContainers {
		checkPrepareNode(t, ic, spec.Containers[0].Image)
	}
	c := spec.Containers[0]
	wantArg(t, "speaker", c.Args, "--node-name", "$(NODE_NAME)")
	wantArg(t, "speaker", c.Args, "--convergence-delay", delay)
	wantArg(t, "speaker", c.Args, "--outage-settle", "2m")
	if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
		return e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName"
	}) {
		t.Errorf("speaker env %+v lacks NODE_NAME from spec.nodeName", c.Env)
	}
	sc := c.SecurityContext
	if sc == nil || sc.Capabilities == nil {
		t.Fatalf("speaker has no securityContext capabilities")
	}
	// The long-running speaker parses BGP from the routers: never privileged.
	if privileged(c) || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("speaker securityContext %+v, want unprivileged, no privilege escalation, read-only root, seccomp RuntimeDefault", sc)
	}
	if psc := spec.SecurityContext; psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("speaker pod securityContext %+v, want seccomp RuntimeDefault", psc)
	}
	if !slices.Contains(sc.Capabilities.Drop, "ALL") {
		t.Errorf("speaker capabilities drop %v, want ALL", sc.Capabilities.Drop)
	}
	for _, cap := range sc.Capabilities.Add {
		if cap != "NET_ADMIN" {
			t.Errorf("speaker adds capability %s; it needs NET_ADMIN only (modules are autoloaded by the kernel)", cap)
		}
	}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			t.Errorf("speaker mounts host path %s", v.HostPath.Path)
		}
	}
	if c.LivenessProbe != nil {
		checkPatientProbes(t, "speaker", c, time.Minute)
	}
	return ds
}

// checkPatientProbes checks that a loaded node cannot get a healthy
// container restarted: a startup probe gives the start 5 minutes, and the
// liveness probe (with no initial delay of its own, the startup probe
// covers that) restarts only a container that has failed it for at least
// patience, each try waiting 10 s or more.
func checkPatientProbes(t *testing.T, what string, c corev1.Container, patience time.Duration) {
	t.Helper()
	window := func(p *corev1.Probe) time.Duration {
		return time.Duration(p.FailureThreshold*p.PeriodSeconds) * time.Second
	}
	if p := c.StartupProbe; p == nil || window(p) < 5*time.Minute || p.TimeoutSeconds < 10 {
		t.Errorf("%s startup probe %+v, want one allowing 5 minutes, each try 10 s or more", what, p)
	}
	if p := c.LivenessProbe; p == nil || window(p) < patience || p.TimeoutSeconds < 10 || p.InitialDelaySeconds != 0 {
		t.Errorf("%s liveness probe %+v, want one restarting after %s of failures, each try 10 s or more, no initial delay", what, p, patience)
	}
}

// checkPrepareNode checks the speaker's init container: the speaker's own
// image running the prepare-node subcommand, privileged (it writes
// /proc/sys), and nothing else: no probes, ports, env or mounts.
func checkPrepareNode(t *testing.T, c corev1.Container, image string) {
	t.Helper()
	// The two-tier dataplane, and its connection sync relay.
	args := slices.DeleteFunc(slices.Clone(c.Args), func(a string) bool { return a == "--tunnel" || a == "--conn-sync-relay" })
	if c.Name != "prepare-node" || c.Image != image || !slices.Equal(args, []string{"prepare-node"}) || len(c.Command) != 0 {
		t.Errorf("init container %s image %q command %q args %q, want prepare-node running %q prepare-node", c.Name, c.Image, c.Command, c.Args, image)
	}
	if !privileged(c) || c.SecurityContext.ReadOnlyRootFilesystem == nil || !*c.SecurityContext.ReadOnlyRootFilesystem {
		t.Errorf("init container securityContext %+v, want privileged with a read-only root", c.SecurityContext)
	}
	if len(c.Ports) != 0 || len(c.Env) != 0 || len(c.VolumeMounts) != 0 || c.LivenessProbe != nil || c.ReadinessProbe != nil {
		t.Errorf("init container has ports %v env %v mounts %v or probes", c.Ports, c.Env, c.VolumeMounts)
	}
}

func privileged(c corev1.Container) bool {
	return c.SecurityContext != nil && c.SecurityContext.Privileged != nil && *c.SecurityContext.Privileged
}

func checkCCM(t *testing.T, r *Rendered, replicas int32) *appsv1.Deployment {
	t.Helper()
	d := one[appsv1.Deployment](t, r, "Deployment", "vipcast-ccm")
	if d.Spec.Replicas == nil || *d.Spec.Replicas != replicas {
		t.Errorf("CCM replicas %v, want %d", d.Spec.Replicas, replicas)
	}
	spec := d.Spec.Template.Spec
	if spec.ServiceAccountName != "vipcast-ccm" {
		t.Errorf("CCM ServiceAccount %q", spec.ServiceAccountName)
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("CCM has %d containers", len(spec.Containers))
	}
	c := spec.Containers[0]
	wantArg(t, "CCM", c.Args, "--leader-elect", "true")
	wantArg(t, "CCM", c.Args, "--leader-elect-resource-name", "vipcast-ccm")
	wantArg(t, "CCM", c.Args, "--leader-elect-resource-namespace", "kube-system")
	wantArg(t, "CCM", c.Args, "--cloud-provider", "vipcast")
	wantArg(t, "CCM", c.Args, "--use-service-account-credentials", "false")
	wantArg(t, "CCM", c.Args, "--secure-port", "10258")
	wantArg(t, "CCM", c.Args, "--configure-cloud-routes", "false")
	for _, p := range []*corev1.Probe{c.StartupProbe, c.LivenessProbe, c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" || p.HTTPGet.Scheme != corev1.URISchemeHTTPS || p.HTTPGet.Port.String() != "https" {
			t.Errorf("CCM probe %+v, want HTTPS GET /healthz on the https port", p)
		}
	}
	checkPatientProbes(t, "CCM", c, 80*time.Second)
	if len(c.Ports) != 1 || c.Ports[0].ContainerPort != 10258 || c.Ports[0].Name != "https" {
		t.Errorf("CCM ports %+v, want https 10258", c.Ports)
	}
	if privileged(c) || c.SecurityContext.Capabilities == nil || len(c.SecurityContext.Capabilities.Add) != 0 {
		t.Errorf("CCM securityContext %+v: it needs no privilege", c.SecurityContext)
	}
	if !slices.ContainsFunc(spec.Tolerations, func(tl corev1.Toleration) bool {
		return tl.Key == "node.cloudprovider.kubernetes.io/uninitialized" && tl.Effect == corev1.TaintEffectNoSchedule
	}) {
		t.Errorf("CCM does not tolerate the uninitialized taint: %+v", spec.Tolerations)
	}
	pdb := one[policyv1.PodDisruptionBudget](t, r, "PodDisruptionBudget", "vipcast-ccm")
	if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() < 1 || pdb.Spec.MinAvailable.IntValue() >= int(replicas) {
		t.Errorf("PDB minAvailable %v, want between 1 and replicas-1 (%d)", pdb.Spec.MinAvailable, replicas-1)
	}
	if fmt.Sprint(pdb.Spec.Selector.MatchLabels) != fmt.Sprint(d.Spec.Selector.MatchLabels) {
		t.Errorf("PDB selects %v, the Deployment %v", pdb.Spec.Selector.MatchLabels, d.Spec.Selector.MatchLabels)
	}
	return d
}

func TestRenderDefaults(t *testing.T) {
	r := render(t, "")
	checkCommon(t, r)
	// No BGP password Secret by default: no password Role or Namespace.
	want := map[string]int{
		"ServiceAccount": 2, "ClusterRole": 2, "ClusterRoleBinding": 2, "Role": 3, "RoleBinding": 3,
		"Deployment": 1, "PodDisruptionBudget": 1, "DaemonSet": 1,
		"ValidatingAdmissionPolicy": 2, "ValidatingAdmissionPolicyBinding": 2,
	}
	if got := r.Kinds(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("kinds %v, want %v", got, want)
	}
	if len(r.CRDs) != 4 {
		t.Errorf("%d CRDs, want 4 (IPPool, BGPPeer, SpeakerStatus, NodeTunnel)", len(r.CRDs))
	}

	d := checkCCM(t, r, 2)
	if img := d.Spec.Template.Spec.Containers[0].Image; img != "vipcast/vipcast-ccm:0.1.0" {
		t.Errorf("CCM image %q, want vipcast/vipcast-ccm:<appVersion>", img)
	}

	ds := checkSpeaker(t, r, "3s", 3)
	c := ds.Spec.Template.Spec.Containers[0]
	if img := c.Image; img != "vipcast/vipcast-speaker:0.1.0" {
		t.Errorf("speaker image %q", img)
	}
	wantArg(t, "speaker", c.Args, "--ipvs", "true")
	// Metrics on the node's address only (kubelet expands $(NODE_IP); the
	// brackets make one form for IPv4 and IPv6 node addresses).
	wantArg(t, "speaker", c.Args, "--metrics-bind-address", "[$(NODE_IP)]:7473")
	if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
		return e.Name == "NODE_IP" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.hostIP"
	}) {
		t.Errorf("speaker env %+v lacks NODE_IP from status.hostIP", c.Env)
	}
	// No BGP password Secret by default: no Secret access at all.
	wantArg(t, "speaker", c.Args, "--bgp-password-secrets", "")
	wantArg(t, "speaker", c.Args, "--dataplane-resync-period", "1m")
	if g := *ds.Spec.Template.Spec.TerminationGracePeriodSeconds; g != 38 {
		t.Errorf("terminationGracePeriodSeconds %d, want 38 (3s delay + the speaker's 30s shutdown bound + 5s)", g)
	}
	// With --ipvs the speaker needs net.ipv4.vs.conntrack=1, and /proc/sys
	// is read-only in every unprivileged container: a privileged init
	// container sets it; the speaker itself has NET_ADMIN only.
	if !slices.Equal(c.SecurityContext.Capabilities.Add, []corev1.Capability{"NET_ADMIN"}) {
		t.Errorf("speaker capabilities add %v, want NET_ADMIN", c.SecurityContext.Capabilities.Add)
	}
	if n := len(ds.Spec.Template.Spec.InitContainers); n != 1 {
		t.Errorf("%d init containers, want prepare-node", n)
	}
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" || c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("speaker probes: liveness %+v readiness %+v", c.LivenessProbe, c.ReadinessProbe)
	}
	if got := passwordSecrets(t, r); len(got) != 0 || len(r.Find("Namespace", "")) != 0 || len(r.Find("RoleBinding", "vipcast-speaker-bgp-passwords")) != 0 {
		t.Errorf("speaker reads Secrets %v, %d Namespaces, %d password RoleBindings: want none by default", got, len(r.Find("Namespace", "")), len(r.Find("RoleBinding", "vipcast-speaker-bgp-passwords")))
	}
	// The Lease the CCM leads on, as the RBAC Role names it (the value
	// "" derives it).
	if !strings.Contains(r.Notes, "leader election on Lease kube-system/vipcast-ccm)") {
		t.Errorf("NOTES.txt does not name the CCM's Lease kube-system/vipcast-ccm:\n%s", r.Notes)
	}
	if !strings.Contains(r.Notes, "vipcast-ccm") || !strings.Contains(r.Notes, "create an IPPool") ||
		!strings.Contains(r.Notes, "until speaker.bgpPasswordSecrets.secrets names their Secrets") {
		t.Errorf("NOTES.txt:\n%s", r.Notes)
	}
}

func TestRenderFullExample(t *testing.T) {
	r, err := Render(release, namespace, fullValues(t))
	if err != nil {
		t.Fatal(err)
	}
	checkCommon(t, r)
	d := checkCCM(t, r, 3)
	c := d.Spec.Template.Spec.Containers[0]
	if c.Image != "myorg/vipcast-ccm:v0.1.0" || c.ImagePullPolicy != corev1.PullAlways {
		t.Errorf("CCM image %q %q", c.Image, c.ImagePullPolicy)
	}
	wantArg(t, "CCM", c.Args, "--concurrent-service-syncs", "20")
	wantArg(t, "CCM", c.Args, "--node-monitor-period", "10s")
	if pdb := one[policyv1.PodDisruptionBudget](t, r, "PodDisruptionBudget", "vipcast-ccm"); pdb.Spec.MinAvailable.IntValue() != 2 {
		t.Errorf("PDB minAvailable %v, want 2", pdb.Spec.MinAvailable)
	}
	if len(d.Spec.Template.Spec.ImagePullSecrets) != 1 {
		t.Errorf("CCM imagePullSecrets %v", d.Spec.Template.Spec.ImagePullSecrets)
	}

	ds := checkSpeaker(t, r, "5s", 5)
	sc := ds.Spec.Template.Spec.Containers[0]
	if g := *ds.Spec.Template.Spec.TerminationGracePeriodSeconds; g != 60 {
		t.Errorf("terminationGracePeriodSeconds %d, want 60 (set)", g)
	}
	wantArg(t, "speaker", sc.Args, "--ipvs-link", "vip0")
	wantArg(t, "speaker", sc.Args, "--dataplane-resync-period", "30s")
	wantArg(t, "speaker", sc.Args, "--resync-period", "10m")
	wantArg(t, "speaker", sc.Args, "--one_output", "true")
	// One Role per namespace of the named Secrets, naming them.
	if got := fmt.Sprint(passwordSecrets(t, r)); got != "[fabric-passwords/tor-a-md5 network-passwords/tor-b-bfd network-passwords/tor-b-md5]" {
		t.Errorf("speaker reads Secrets %v, want fabric-passwords/tor-a-md5, network-passwords/tor-b-bfd and tor-b-md5", got)
	}
	if n := len(r.Find("RoleBinding", "vipcast-speaker-bgp-passwords")); n != 2 {
		t.Errorf("%d password RoleBindings, want one in each of the 2 namespaces", n)
	}
	wantArg(t, "speaker", sc.Args, "--bgp-password-secrets", "fabric-passwords/tor-a-md5,network-passwords/tor-b-md5,network-passwords/tor-b-bfd")
	if n := len(r.Find("Namespace", "")); n != 2 {
		t.Errorf("%d Namespaces, want the 2 namespaces of the password Secrets", n)
	}
	if !strings.Contains(r.Notes, "fabric-passwords/tor-a-md5 network-passwords/tor-b-bfd network-passwords/tor-b-md5") {
		t.Errorf("NOTES.txt does not name the password Secrets:\n%s", r.Notes)
	}

	if n := len(r.Find("IPPool", "")); n != 2 {
		t.Errorf("%d IPPools, want 2", n)
	}
	pub := r.Find("IPPool", "public")[0]
	if pub.GetLabels()["exposure"] != "public" || pub.GetNamespace() != "" {
		t.Errorf("IPPool public: labels %v namespace %q", pub.GetLabels(), pub.GetNamespace())
	}
	if addrs, _, _ := unstructured.NestedStringSlice(pub.Object, "spec", "addresses"); len(addrs) != 3 {
		t.Errorf("IPPool public addresses %v", addrs)
	}
	if n := len(r.Find("BGPPeer", "")); n != 2 {
		t.Errorf("%d BGPPeers, want 2", n)
	}
	if asn, _, _ := unstructured.NestedInt64(r.Find("BGPPeer", "tor-a")[0].Object, "spec", "peerASN"); asn != 64500 {
		t.Errorf("BGPPeer tor-a peerASN %d", asn)
	}
	sms := r.Find("ServiceMonitor", "")
	if len(sms) != 2 {
		t.Fatalf("%d ServiceMonitors, want 2", len(sms))
	}
	for _, sm := range sms {
		if sm.GetLabels()["release"] != "prometheus" {
			t.Errorf("ServiceMonitor %s labels %v", sm.GetName(), sm.GetLabels())
		}
	}
	if n := len(r.Find("Service", "")); n != 2 {
		t.Errorf("%d metrics Services, want 2", n)
	}
	mr := one[rbacv1.ClusterRole](t, r, "ClusterRole", "vipcast-metrics-reader")
	checkRules(t, "metrics reader", mr.Rules, map[string][]string{"url:/metrics": {"get"}})
	mrb := one[rbacv1.ClusterRoleBinding](t, r, "ClusterRoleBinding", "vipcast-metrics-reader")
	if len(mrb.Subjects) != 1 || mrb.Subjects[0].Name != "prometheus-k8s" || mrb.Subjects[0].Namespace != "monitoring" {
		t.Errorf("metrics-reader subjects %+v", mrb.Subjects)
	}
}

// TestRenderSpeakerVariants covers the speaker's security settings and
// grace period outside the defaults.
func TestRenderSpeakerVariants(t *testing.T) {
	t.Run("routes only: no privilege, no capability, no init container", func(t *testing.T) {
		r := render(t, "speaker: {ipvs: {enabled: false}}")
		spec := checkSpeaker(t, r, "3s", 3).Spec.Template.Spec
		c := spec.Containers[0]
		wantArg(t, "speaker", c.Args, "--ipvs", "false")
		if privileged(c) || len(c.SecurityContext.Capabilities.Add) != 0 || *c.SecurityContext.AllowPrivilegeEscalation || len(spec.InitContainers) != 0 {
			t.Errorf("securityContext %+v, init containers %d: want no privilege", c.SecurityContext, len(spec.InitContainers))
		}
		if _, ok := arg(c.Args, "--ipvs-link"); ok {
			t.Errorf("--ipvs-link passed without IPVS: %q", c.Args)
		}
	})
	t.Run("prepareNode false: nothing privileged, NET_ADMIN only", func(t *testing.T) {
		r := render(t, "speaker: {ipvs: {enabled: true, prepareNode: false}}")
		spec := checkSpeaker(t, r, "3s", 3).Spec.Template.Spec
		c := spec.Containers[0]
		if len(spec.InitContainers) != 0 || !slices.Equal(c.SecurityContext.Capabilities.Add, []corev1.Capability{"NET_ADMIN"}) {
			t.Errorf("init containers %d, securityContext %+v: want none and NET_ADMIN", len(spec.InitContainers), c.SecurityContext)
		}
	})
	t.Run("two tiers: flags and prepare-node --tunnel", func(t *testing.T) {
		r := render(t, "speaker: {ipvs: {enabled: true, tunnelPrefix: 100.127.0.0/16, tunnelMTU: 9000}}")
		spec := checkSpeaker(t, r, "3s", 3).Spec.Template.Spec
		wantArg(t, "speaker", spec.Containers[0].Args, "--tunnel-prefix", "100.127.0.0/16")
		wantArg(t, "speaker", spec.Containers[0].Args, "--tunnel-mtu", "9000")
		wantArg(t, "speaker", spec.Containers[0].Args, "--conn-sync-interface", "auto")
		wantArg(t, "speaker", spec.Containers[0].Args, "--conn-sync-id", "96")
		// Tier 1 follows the speakers' readiness: a headless Service that
		// selects exactly the DaemonSet's pods.
		wantArg(t, "speaker", spec.Containers[0].Args, "--speaker-service", namespace+"/vipcast-speaker")
		tr := render(t, "speaker: {ipvs: {enabled: true, tunnelPrefix: 100.127.0.0/16}}")
		ss := one[corev1.Service](t, tr, "Service", "vipcast-speaker")
		ds := checkSpeaker(t, tr, "3s", 3)
		if ss.Spec.ClusterIP != corev1.ClusterIPNone || ss.Spec.PublishNotReadyAddresses || !maps.Equal(ss.Spec.Selector, ds.Spec.Selector.MatchLabels) ||
			!labels.SelectorFromSet(ss.Spec.Selector).Matches(labels.Set(ds.Spec.Template.Labels)) {
			t.Errorf("speakers' Service %+v: want headless, ready pods only, selecting the DaemonSet's pods (%v)", ss.Spec, ds.Spec.Selector.MatchLabels)
		}
		if n := len(render(t, "").Find("Service", "vipcast-speaker")); n != 0 {
			t.Errorf("one tier: the speakers' Service rendered")
		}
		dual := checkSpeaker(t, render(t, `speaker: {ipvs: {enabled: true, tunnelPrefix: "100.127.0.0/16,fd00:7f::/64"}}`), "3s", 3).Spec.Template.Spec
		wantArg(t, "speaker", dual.Containers[0].Args, "--tunnel-prefix", "100.127.0.0/16,fd00:7f::/64")
		named := checkSpeaker(t, render(t, "speaker: {ipvs: {enabled: true, tunnelPrefix: 100.127.0.0/16, connSync: {interface: none, id: 7}}}"), "3s", 3).Spec.Template.Spec
		wantArg(t, "speaker", named.Containers[0].Args, "--conn-sync-interface", "none")
		wantArg(t, "speaker", named.Containers[0].Args, "--conn-sync-id", "7")
		if len(spec.InitContainers) != 1 || !slices.Equal(spec.InitContainers[0].Args, []string{"prepare-node", "--tunnel"}) {
			t.Errorf("init containers %+v: want one running prepare-node --tunnel", spec.InitContainers)
		}
		wantArg(t, "speaker", spec.Containers[0].Args, "--conn-sync-transport", "multicast")
		relayed := checkSpeaker(t, render(t, "speaker: {ipvs: {enabled: true, tunnelPrefix: 100.127.0.0/16, connSync: {transport: relay, relayPort: 9000}}}"), "3s", 3).Spec.Template.Spec
		wantArg(t, "speaker", relayed.Containers[0].Args, "--conn-sync-transport", "relay")
		wantArg(t, "speaker", relayed.Containers[0].Args, "--conn-sync-relay-port", "9000")
		if len(relayed.InitContainers) != 1 || !slices.Equal(relayed.InitContainers[0].Args, []string{"prepare-node", "--tunnel", "--conn-sync-relay"}) {
			t.Errorf("relay: init containers %+v: want one running prepare-node --tunnel --conn-sync-relay", relayed.InitContainers)
		}
		// The relays' keys: a Secret the chart makes, mounted read-only,
		// or the operator's; none without the relay.
		relayR := render(t, "speaker: {ipvs: {enabled: true, tunnelPrefix: 100.127.0.0/16, connSync: {transport: relay}}}")
		keys := one[corev1.Secret](t, relayR, "Secret", "vipcast-speaker-conn-sync-keys")
		if k := keys.Data["1"]; len(k) != 64 || len(keys.Data) != 1 {
			t.Errorf("relay keys Secret: %d keys, key 1 of %d bytes; want one of 64", len(keys.Data), len(k))
		}
		wantKeyMount := func(name string, spec corev1.PodSpec, secret string) {
			t.Helper()
			wantArg(t, name, spec.Containers[0].Args, "--conn-sync-key-dir", "/etc/vipcast/conn-sync-keys")
			m := spec.Containers[0].VolumeMounts
			if len(spec.Volumes) != 1 || spec.Volumes[0].Secret == nil || spec.Volumes[0].Secret.SecretName != secret ||
				len(m) != 1 || m[0].MountPath != "/etc/vipcast/conn-sync-keys" || !m[0].ReadOnly || len(spec.InitContainers[0].VolumeMounts) != 0 {
				t.Errorf("%s: volumes %+v, mounts %+v: want Secret %s read-only in the speaker only", name, spec.Volumes, m, secret)
			}
		}
		wantKeyMount("relay", checkSpeaker(t, relayR, "3s", 3).Spec.Template.Spec, "vipcast-speaker-conn-sync-keys")
		own := render(t, "speaker: {ipvs: {enabled: true, tunnelPrefix: 100.127.0.0/16, connSync: {transport: relay, keySecret: sync-keys}}}")
		if n := len(own.Find("Secret", "vipcast-speaker-conn-sync-keys")); n != 0 {
			t.Errorf("keySecret set: the chart made its own Secret too")
		}
		wantKeyMount("relay with keySecret", checkSpeaker(t, own, "3s", 3).Spec.Template.Spec, "sync-keys")
		for _, values := range []string{"speaker: {ipvs: {enabled: true, tunnelPrefix: 100.127.0.0/16}}",
			"speaker: {ipvs: {enabled: true, tunnelPrefix: 100.127.0.0/16, connSync: {transport: relay, interface: none}}}"} {
			r := render(t, values)
			spec := checkSpeaker(t, r, "3s", 3).Spec.Template.Spec
			if _, ok := arg(spec.Containers[0].Args, "--conn-sync-key-dir"); ok || len(spec.Volumes) != 0 || len(r.Find("Secret", "vipcast-speaker-conn-sync-keys")) != 0 {
				t.Errorf("%s: a key directory, volume or Secret without the relay", values)
			}
		}
		def := checkSpeaker(t, render(t, ""), "3s", 3).Spec.Template.Spec
		if _, ok := arg(def.Containers[0].Args, "--tunnel-prefix"); ok || !slices.Equal(def.InitContainers[0].Args, []string{"prepare-node"}) {
			t.Errorf("default: args %q, init args %q: want one tier", def.Containers[0].Args, def.InitContainers[0].Args)
		}
		// Back to one tier with another sync ID: the speaker is told the
		// ID, so it stops the daemons the two-tier run started.
		back := checkSpeaker(t, render(t, "speaker: {ipvs: {enabled: true, connSync: {id: 7}}}"), "3s", 3).Spec.Template.Spec
		wantArg(t, "speaker", back.Containers[0].Args, "--conn-sync-id", "7")
		for bad, key := range map[string]string{"tunnelPrefix: 100.127.0.0": "tunnelPrefix", "tunnelPrefix: 100.127.0.0/31": "tunnelPrefix", "tunnelMTU: 100": "tunnelMTU",
			`tunnelPrefix: "100.127.0.0/16,10.0.0.0/8"`: "tunnelPrefix", `tunnelPrefix: "100.127.0.0/16,fd00:7f::"`: "tunnelPrefix",
			`tunnelPrefix: "100.127.0.0/16,fd00:7f::/127"`: "tunnelPrefix", `tunnelPrefix: "fd00:7f::/64"`: "tunnelPrefix",
			"connSync: {id: 256}": "connSync", "connSync: {interface: a/b}": "connSync", "connSync: {interface: \"\"}": "connSync",
			"connSync: {transport: unicast}": "transport", "connSync: {relayPort: 0}": "relayPort",
			"connSync: {transport: relay, interface: eth0}": "interface", "connSync: {keySecret: Bad_Name}": "keySecret"} {
			if _, err := Render(release, namespace, []byte("speaker: {ipvs: {enabled: true, "+bad+"}}")); err == nil || !strings.Contains(err.Error(), key) {
				t.Errorf("%s: err = %v, want one naming %s", bad, err, key)
			}
		}
	})
	t.Run("delay in ms and minutes", func(t *testing.T) {
		for delay, grace := range map[string]int64{"1500ms": 37, "2m": 155, "0s": 35} {
			r := render(t, "speaker: {convergenceDelay: "+delay+"}")
			ds := one[appsv1.DaemonSet](t, r, "DaemonSet", "vipcast-speaker")
			if g := *ds.Spec.Template.Spec.TerminationGracePeriodSeconds; g != grace {
				t.Errorf("delay %s: grace %d, want %d", delay, g, grace)
			}
		}
	})
	t.Run("grace period too short", func(t *testing.T) {
		_, err := Render(release, namespace, []byte("speaker: {convergenceDelay: 10s, terminationGracePeriodSeconds: 12}"))
		if err == nil || !strings.Contains(err.Error(), "speaker.terminationGracePeriodSeconds") || !strings.Contains(err.Error(), "at least 16") {
			t.Errorf("err = %v, want one naming speaker.terminationGracePeriodSeconds and the minimum", err)
		}
	})
	t.Run("PDB that would block drains", func(t *testing.T) {
		_, err := Render(release, namespace, []byte("ccm: {replicas: 2, podDisruptionBudget: {enabled: true, minAvailable: 2}}"))
		if err == nil || !strings.Contains(err.Error(), "ccm.podDisruptionBudget.minAvailable=2 must be below ccm.replicas=2") {
			t.Errorf("err = %v, want one naming ccm.podDisruptionBudget.minAvailable", err)
		}
		if _, err := Render(release, namespace, []byte("ccm: {replicas: 1, podDisruptionBudget: {enabled: false}}")); err != nil {
			t.Errorf("one replica without a PDB: %v", err)
		}
	})
	t.Run("ipvs.clusterCIDRs passed on as --cluster-cidr; none by default", func(t *testing.T) {
		r := render(t, "speaker: {ipvs: {enabled: true, clusterCIDRs: [10.244.0.0/16, \"fd00:10:244::/56\"]}}")
		c := checkSpeaker(t, r, "3s", 3).Spec.Template.Spec.Containers[0]
		wantArg(t, "speaker", c.Args, "--cluster-cidr", "10.244.0.0/16,fd00:10:244::/56")
		if v, ok := arg(checkSpeaker(t, render(t, ""), "3s", 3).Spec.Template.Spec.Containers[0].Args, "--cluster-cidr"); ok {
			t.Errorf("defaults pass --cluster-cidr=%s, want none", v)
		}
	})
	t.Run("metrics: allowed sources passed on; a ServiceMonitor needs them", func(t *testing.T) {
		r := render(t, "speaker: {metrics: {enabled: true, port: 7473, allowedSources: [10.244.0.0/16, \"fd00::/56\"]}}")
		c := checkSpeaker(t, r, "3s", 3).Spec.Template.Spec.Containers[0]
		wantArg(t, "speaker", c.Args, "--metrics-allowed-sources", "10.244.0.0/16,fd00::/56")
		if v, ok := arg(checkSpeaker(t, render(t, ""), "3s", 3).Spec.Template.Spec.Containers[0].Args, "--metrics-allowed-sources"); ok {
			t.Errorf("defaults pass --metrics-allowed-sources=%s, want none (the node itself only)", v)
		}
		_, err := Render(release, namespace, []byte("serviceMonitor: {enabled: true}"))
		if err == nil || !strings.Contains(err.Error(), "set speaker.metrics.allowedSources to the pod CIDR(s) Prometheus runs in") {
			t.Errorf("ServiceMonitor without allowed sources: err = %v, want one naming speaker.metrics.allowedSources", err)
		}
		for _, values := range []string{
			"serviceMonitor: {enabled: true}\nspeaker: {metrics: {enabled: true, port: 7473, allowedSources: [10.244.0.0/16]}}",
			"serviceMonitor: {enabled: true}\nspeaker: {ipvs: {enabled: false}}", // no IPVS, no guard
		} {
			if _, err := Render(release, namespace, []byte(values)); err != nil {
				t.Errorf("%q: %v", values, err)
			}
		}
	})
	t.Run("metrics off: no probes", func(t *testing.T) {
		r := render(t, "speaker: {metrics: {enabled: false, port: 7473}}")
		c := checkSpeaker(t, r, "3s", 3).Spec.Template.Spec.Containers[0]
		wantArg(t, "speaker", c.Args, "--metrics-bind-address", "0")
		if c.LivenessProbe != nil || c.ReadinessProbe != nil || len(c.Ports) != 0 {
			t.Errorf("probes or ports without metrics: %+v %+v %+v", c.LivenessProbe, c.ReadinessProbe, c.Ports)
		}
	})
	t.Run("no password Secrets: no Secret access at all", func(t *testing.T) {
		r := render(t, "speaker: {bgpPasswordSecrets: {secrets: []}}")
		c := checkSpeaker(t, r, "3s", 3).Spec.Template.Spec.Containers[0]
		wantArg(t, "speaker", c.Args, "--bgp-password-secrets", "")
		if got := passwordSecrets(t, r); len(got) != 0 || len(r.Find("Namespace", "")) != 0 {
			t.Errorf("Secrets %v, Namespaces %v: want none", got, r.Find("Namespace", ""))
		}
	})
	t.Run("namespaces created elsewhere", func(t *testing.T) {
		r := render(t, "speaker: {bgpPasswordSecrets: {secrets: [b/tor-b, a/tor-a.md5, a/bfd], createNamespaces: false}}")
		checkCommon(t, r)
		if got := fmt.Sprint(passwordSecrets(t, r)); got != "[a/bfd a/tor-a.md5 b/tor-b]" || len(r.Find("Namespace", "")) != 0 {
			t.Errorf("Secrets %v, %d Namespaces: want [a/bfd a/tor-a.md5 b/tor-b] and none created", got, len(r.Find("Namespace", "")))
		}
		a := r.Find("Role", "vipcast-speaker-bgp-passwords")
		if len(a) != 2 {
			t.Fatalf("%d password Roles, want 2 (namespaces a and b)", len(a))
		}
		wantArg(t, "speaker", checkSpeaker(t, r, "3s", 3).Spec.Template.Spec.Containers[0].Args, "--bgp-password-secrets", "b/tor-b,a/tor-a.md5,a/bfd")
	})
	t.Run("a BGPPeer of the values naming a Secret not in the list", func(t *testing.T) {
		const peers = `bgpPeers:
  - name: tor-a
    spec:
      peerAddress: 192.0.2.1
      peerASN: 64500
      localASN: 64501
      passwordSecretRef: {namespace: bgp, name: tor-a-md5}
      bfd: {authentication: {type: KeyedSHA1, keyID: 1, secretRef: {namespace: bgp, name: tor-a-bfd, key: key}}}
`
		if _, err := Render(release, namespace, []byte(peers+"speaker: {bgpPasswordSecrets: {secrets: [bgp/tor-a-md5, bgp/tor-a-bfd]}}")); err != nil {
			t.Errorf("both Secrets named: %v", err)
		}
		for secrets, want := range map[string]string{
			"[bgp/tor-a-bfd]":            "bgpPeers[0] (tor-a): spec.passwordSecretRef names the Secret bgp/tor-a-md5, which the speaker may not read: add bgp/tor-a-md5 to speaker.bgpPasswordSecrets.secrets",
			"[bgp/tor-a-md5, bgp/other]": "bgpPeers[0] (tor-a): spec.bfd.authentication.secretRef names the Secret bgp/tor-a-bfd, which the speaker may not read: add bgp/tor-a-bfd to speaker.bgpPasswordSecrets.secrets",
		} {
			_, err := Render(release, namespace, []byte(peers+"speaker: {bgpPasswordSecrets: {secrets: "+secrets+"}}"))
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("secrets %s: err = %v, want %q", secrets, err, want)
			}
		}
	})
	t.Run("release namespace refused", func(t *testing.T) {
		for _, list := range []string{"[vipcast-system/tor-a-md5]", "[vipcast-bgp-passwords/tor-a-md5, vipcast-system/sh.helm.release.v1.vipcast.v1]"} {
			_, err := Render(release, namespace, []byte("speaker: {bgpPasswordSecrets: {secrets: "+list+"}}"))
			if err == nil || !strings.Contains(err.Error(), "speaker.bgpPasswordSecrets.secrets names vipcast-system/") ||
				!strings.Contains(err.Error(), `in the release namespace "vipcast-system"`) || !strings.Contains(err.Error(), "sh.helm.release.v1") {
				t.Errorf("secrets %s: err = %v, want one naming the key, the Secret, the release namespace and Helm's release Secrets", list, err)
			}
		}
	})
}

// TestSchemaRejectsWrongType checks that values.schema.json stops bad values
// at install time with a message naming the key.
func TestSchemaRejectsWrongType(t *testing.T) {
	for _, tc := range []struct {
		name, values string
		want         []string // substrings of the error
	}{
		{"delay is a number", "speaker: {convergenceDelay: 5}", []string{"/speaker/convergenceDelay", "string"}},
		{"replicas is a string", `ccm: {replicas: "two"}`, []string{"/ccm/replicas", "integer"}},
		{"replicas zero", "ccm: {replicas: 0}", []string{"/ccm/replicas"}},
		{"typo in a key", "ccm: {replica: 2}", []string{"/ccm", "replica"}},
		{"unknown top-level key", "speakers: {}", []string{"speakers"}},
		{"delay with two units", "speaker: {convergenceDelay: 1m30s}", []string{"/speaker/convergenceDelay"}},
		{"bad pull policy", "speaker: {image: {pullPolicy: Sometimes}}", []string{"/speaker/image/pullPolicy"}},
		{"port out of range", "speaker: {metrics: {enabled: true, port: 70000}}", []string{"/speaker/metrics/port"}},
		{"metrics source not a prefix", "speaker: {metrics: {enabled: true, port: 7473, allowedSources: [10.244.0.0]}}", []string{"/speaker/metrics/allowedSources/0"}},
		{"ipvs link too long", "speaker: {ipvs: {link: averyveryverylonglinkname}}", []string{"/speaker/ipvs/link"}},
		{"pool without spec", "ipPools: [{name: public}]", []string{"/ipPools/0", "spec"}},
		{"password Secret without namespace", "speaker: {bgpPasswordSecrets: {secrets: [tor-a-md5]}}", []string{"/speaker/bgpPasswordSecrets/secrets/0"}},
		{"password Secret namespace not a name", "speaker: {bgpPasswordSecrets: {secrets: [Not_A_Namespace/tor]}}", []string{"/speaker/bgpPasswordSecrets/secrets/0"}},
		{"password Secret name not a name", "speaker: {bgpPasswordSecrets: {secrets: [bgp/Tor_A]}}", []string{"/speaker/bgpPasswordSecrets/secrets/0"}},
		{"password Secret named twice", "speaker: {bgpPasswordSecrets: {secrets: [bgp/tor, bgp/tor]}}", []string{"/speaker/bgpPasswordSecrets/secrets"}},
		{"router ID not IPv4", "speaker: {routerID: 2001:db8::1}", []string{"/speaker/routerID"}},
		{"router ID malformed", "speaker: {routerID: 10.0.0}", []string{"/speaker/routerID"}},
		{"router ID out of range", "speaker: {routerID: 10.0.0.256}", []string{"/speaker/routerID"}},
		// What the binaries refuse at start, refused at install time.
		{"speaker QPS zero", "speaker: {kubeAPIQPS: 0}", []string{"/speaker/kubeAPIQPS"}},
		{"speaker burst zero", "speaker: {kubeAPIBurst: 0}", []string{"/speaker/kubeAPIBurst"}},
		{"CCM QPS negative", "ccm: {kubeAPIQPS: -1}", []string{"/ccm/kubeAPIQPS"}},
		{"CCM burst zero", "ccm: {kubeAPIBurst: 0}", []string{"/ccm/kubeAPIBurst"}},
		{"CCM service syncs zero", "ccm: {concurrentServiceSyncs: 0}", []string{"/ccm/concurrentServiceSyncs"}},
		{"delay negative", "speaker: {convergenceDelay: -1s}", []string{"/speaker/convergenceDelay"}},
		{"resync below 1s", "speaker: {resyncPeriod: 500ms}", []string{"/speaker/resyncPeriod"}},
		{"resync zero", "speaker: {resyncPeriod: 0s}", []string{"/speaker/resyncPeriod"}},
		{"resync 999ms", "speaker: {resyncPeriod: 999ms}", []string{"/speaker/resyncPeriod"}},
		{"resync in ns", "speaker: {resyncPeriod: 5000000000ns}", []string{"/speaker/resyncPeriod"}},
		{"status interval below 1s", "speaker: {statusInterval: 500ms}", []string{"/speaker/statusInterval"}},
		{"outage settle not a duration", "speaker: {outageSettle: 2 minutes}", []string{"/speaker/outageSettle"}},
		{"prefix warning negative", "speaker: {announcedPrefixesWarning: -1}", []string{"/speaker/announcedPrefixesWarning"}},
		{"dataplane resync below 1s", "speaker: {ipvs: {enabled: true, resyncPeriod: 100ms}}", []string{"/speaker/ipvs/resyncPeriod"}},
		{"dataplane resync zero", "speaker: {ipvs: {enabled: true, resyncPeriod: 0m}}", []string{"/speaker/ipvs/resyncPeriod"}},
		// Keys that no longer exist name themselves.
		{"old key speaker.privileged", "speaker: {privileged: false}", []string{"/speaker", "privileged"}},
		{"old key clusterWide", "speaker: {bgpPasswordSecrets: {clusterWide: true}}", []string{"/speaker/bgpPasswordSecrets", "clusterWide"}},
		{"old key namespaces", "speaker: {bgpPasswordSecrets: {namespaces: [vipcast-bgp-passwords]}}", []string{"/speaker/bgpPasswordSecrets", "namespaces"}},
		{"prepareNode not a boolean", "speaker: {ipvs: {enabled: true, prepareNode: yes please}}", []string{"/speaker/ipvs/prepareNode"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Render(release, namespace, []byte(tc.values))
			if err == nil {
				t.Fatalf("values %q rendered; want a schema error", tc.values)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not mention %q:\n%v", w, err)
				}
			}
			t.Logf("%s → %v", tc.values, err)
		})
	}
}

// TestSchemaAcceptsMinimums checks the edges the binaries accept.
func TestSchemaAcceptsMinimums(t *testing.T) {
	for _, v := range []string{
		"speaker: {resyncPeriod: 1s, ipvs: {enabled: true, resyncPeriod: 1000ms}}",
		"speaker: {resyncPeriod: 2h, ipvs: {enabled: true, resyncPeriod: 90s}}",
		"speaker: {convergenceDelay: 0s, kubeAPIQPS: 0.5, kubeAPIBurst: 1, routerID: 10.0.0.1}",
	} {
		if _, err := Render(release, namespace, []byte(v)); err != nil {
			t.Errorf("values %q: %v", v, err)
		}
	}
}

// TestTemplatesHaveNoRegistryHost keeps registry host names out of the
// chart: images default to plain repository names.
func TestTemplatesHaveNoRegistryHost(t *testing.T) {
	r := render(t, "")
	for _, k := range []string{"Deployment", "DaemonSet"} {
		for _, u := range r.Find(k, "") {
			containers, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "containers")
			for _, c := range containers {
				img := c.(map[string]any)["image"].(string)
				if first, _, _ := strings.Cut(img, "/"); strings.ContainsAny(first, ".:") {
					t.Errorf("%s %s image %q names a registry host", k, u.GetName(), img)
				}
			}
		}
	}
}

// TestRenderLoadBalancerClass checks that the CCM and the speakers get the
// same class flags, and that the CCM's Lease (argument and RBAC) is named
// after the class unless set.
func TestRenderLoadBalancerClass(t *testing.T) {
	for _, tc := range []struct {
		values, class, classless, lease string
	}{
		{"", "", "", "vipcast-ccm"},
		{"loadBalancerClass: vipcast.io/bgp", "vipcast.io/bgp", "", "vipcast-ccm-vipcast.io-bgp"},
		{"{loadBalancerClass: example.com/Edge_V2, serveClasslessServices: true}", "example.com/Edge_V2", "true", "vipcast-ccm-example.com-edge-v2"},
		{"{loadBalancerClass: vipcast.io/bgp, ccm: {leaderElection: {resourceName: mine}}}", "vipcast.io/bgp", "", "mine"},
	} {
		r := render(t, tc.values)
		ccm := one[appsv1.Deployment](t, r, "Deployment", "vipcast-ccm").Spec.Template.Spec.Containers[0]
		speaker := one[appsv1.DaemonSet](t, r, "DaemonSet", "vipcast-speaker").Spec.Template.Spec.Containers[0]
		for what, args := range map[string][]string{"CCM": ccm.Args, "speaker": speaker.Args} {
			for flag, want := range map[string]string{"--load-balancer-class": tc.class, "--serve-classless-services": tc.classless} {
				if got, _ := arg(args, flag); got != want {
					t.Errorf("%q: %s %s=%q, want %q", tc.values, what, flag, got, want)
				}
			}
		}
		wantArg(t, "CCM", ccm.Args, "--leader-elect-resource-name", tc.lease)
		role := one[rbacv1.Role](t, r, "Role", "vipcast-ccm-leader-election")
		if !slices.ContainsFunc(role.Rules, func(p rbacv1.PolicyRule) bool { return slices.Contains(p.ResourceNames, tc.lease) }) {
			t.Errorf("%q: leader-election Role %+v does not name Lease %s", tc.values, role.Rules, tc.lease)
		}
	}
}

// TestSchemaRejectsBadClass checks loadBalancerClass as the API server and
// the binaries do: a domain-prefixed qualified name, and some Service served.
func TestSchemaRejectsBadClass(t *testing.T) {
	for _, v := range []string{
		"loadBalancerClass: bgp",
		"loadBalancerClass: Vipcast.io/bgp",
		"loadBalancerClass: vipcast.io/",
		"loadBalancerClass: vipcast.io/a/b",
		"loadBalancerClass: vipcast.io/-bgp",
		"serveClasslessServices: false",
		"serveClasslessServices: no please",
	} {
		_, err := Render(release, namespace, []byte(v))
		if err == nil {
			t.Errorf("values %q rendered; want a schema error", v)
			continue
		}
		if !strings.Contains(err.Error(), "loadBalancerClass") && !strings.Contains(err.Error(), "serveClasslessServices") {
			t.Errorf("values %q: error does not name the key: %v", v, err)
		}
	}
	if _, err := Render(release, namespace, []byte("{loadBalancerClass: vipcast.io/bgp, serveClasslessServices: false}")); err != nil {
		t.Errorf("a class without class-less Services: %v", err)
	}
}
