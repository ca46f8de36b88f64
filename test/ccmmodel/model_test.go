//go:build controlplane

package ccmmodel

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/util/retry"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/poolspec"
	"github.com/vipcast/vipcast/test/ccmtest"
)

// The model test's knobs: `make test` runs the default number of steps
// with a seed from the clock; a failure prints the seed to run again with
// -args -vipcast.model-seed=N (and more steps with -vipcast.model-steps).
var (
	modelSeed  = flag.Uint64("vipcast.model-seed", 0, "seed of TestCCMModel; 0 picks one from the clock")
	modelSteps = flag.Int("vipcast.model-steps", 200, "steps of TestCCMModel")
)

// The model's universe: two namespaces, four pools each owning a /26 of
// which its spec holds a random non-empty set of /28 blocks, and twelve
// Service names.
const (
	modelPools    = 4
	modelServices = 12
	modelBlocks   = 4 // /28 blocks in a pool's /26
)

var modelNamespaces = []string{"m1", "m2"}

// TestCCMModel is a randomized model-based test of vipcast-ccm against the
// real API server: random sequences of pool create, edit (widen or narrow)
// and delete; Service create, edit (type, class, annotations, ports,
// traffic policy) and delete; and CCM kills and leader changes. After each
// step settles, the invariants hold (see checkInvariants).
func TestCCMModel(t *testing.T) {
	t.Parallel() // control plane and vipcast-ccm only (see TestMain)
	seed := *modelSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("TestCCMModel seed %d, %d steps (again: go test ./test/e2e/ -run TestCCMModel -args -vipcast.model-seed=%d)", seed, *modelSteps, seed)
	runModel(t, seed, *modelSteps)
}

// TestCCMModelRegression replays seeds that once found a bug, for at least
// as many steps as the bug needed.
func TestCCMModelRegression(t *testing.T) {
	t.Parallel() // control plane and vipcast-ccm only (see TestMain)
	for _, tc := range []struct {
		seed  uint64
		steps int
		bug   string
	}{
		// Step 145: m1/s9, sharing 10.200.2.32 with m1/s11 under key k2,
		// dropped its key; both kept the VIP.
		{1795762305012777268, 150, "a Service whose request stops allowing a share kept the shared VIP"},
	} {
		t.Run(fmt.Sprint(tc.seed), func(t *testing.T) {
			t.Logf("seed %d, %d steps: %s", tc.seed, tc.steps, tc.bug)
			runModel(t, tc.seed, tc.steps)
		})
	}
}

// runModel runs the model from seed for steps steps against a control
// plane of its own.
func runModel(t *testing.T, seed uint64, steps int) {
	m := &model{e: ccmtest.New(t, ccmBinary), rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), seed: seed}
	for _, ns := range modelNamespaces {
		m.e.Namespace(ns, nil)
	}
	m.ccms = []*ccmtest.CCM{m.e.StartCCM("model-0")}
	m.waitLeader()
	m.prev = m.snapshot()
	for m.step = 1; m.step <= steps; m.step++ {
		what, touched := m.randomStep()
		cur := m.settle()
		if err := checkInvariants(m.prev, cur, touched); err != nil {
			t.Fatalf("seed %d, step %d (%s): %v\nhistory:\n%s", seed, m.step, what, err, strings.Join(m.history, "\n"))
		}
		m.history = append(m.history, fmt.Sprintf("%3d %s", m.step, what))
		m.prev = cur
	}
	// settle trusts the CCM's own account of its pending work; a final
	// quiet period, longer than any of the CCM's delays, shows that nothing
	// it had not accounted for changed a VIP or a count afterwards.
	if err := checkInvariants(m.prev, m.quiet(finalQuiet), nil); err != nil {
		t.Fatalf("seed %d, after the last step and %v of quiet: %v\nhistory:\n%s", seed, finalQuiet, err, strings.Join(m.history, "\n"))
	}
	t.Logf("seed %d: %d steps, invariants held; %s", seed, steps, m.prev.summary())
}

// model drives the API server and the CCMs.
type model struct {
	e       *ccmtest.Env
	rng     *rand.Rand
	seed    uint64
	step    int
	ccms    []*ccmtest.CCM // the running CCMs, oldest first
	started int
	prev    *modelState
	history []string
}

// randomStep makes one random change and returns what it did and the keys
// of the Services whose own request it changed (their VIP may change).
func (m *model) randomStep() (string, map[string]bool) {
	switch r := m.rng.IntN(100); {
	case r < 22:
		return m.putPool(), nil
	case r < 27:
		return m.deletePool(), nil
	case r < 55:
		return m.putService()
	case r < 68:
		return m.deleteService()
	case r < 94:
		return m.putService()
	case r < 97:
		return m.killCCM(), nil
	default:
		return m.leaderChange(), nil
	}
}

// poolName and poolBlock name the universe's pools and their /28 blocks.
func poolName(i int) string { return fmt.Sprintf("model-p%d", i) }

func poolBlock(pool, block int) string {
	return fmt.Sprintf("10.200.%d.%d/28", pool, block*16)
}

// putPool creates or edits a random pool with a random non-empty set of
// its blocks.
func (m *model) putPool() string {
	i := m.rng.IntN(modelPools)
	var blocks []string
	for b := range modelBlocks {
		if m.rng.IntN(2) == 0 {
			blocks = append(blocks, poolBlock(i, b))
		}
	}
	if len(blocks) == 0 {
		blocks = []string{poolBlock(i, m.rng.IntN(modelBlocks))}
	}
	res := m.e.CP.Dynamic.Resource(vipcastv1alpha1.IPPoolsResource)
	ctx := context.Background()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		u, err := res.Get(ctx, poolName(i), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			u = &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "vipcast.io/v1alpha1", "kind": "IPPool",
				"metadata": map[string]any{"name": poolName(i)},
			}}
			if err := unstructured.SetNestedStringSlice(u.Object, blocks, "spec", "addresses"); err != nil {
				return err
			}
			_, err = res.Create(ctx, u, metav1.CreateOptions{})
			return err
		}
		if err != nil {
			return err
		}
		if err := unstructured.SetNestedStringSlice(u.Object, blocks, "spec", "addresses"); err != nil {
			return err
		}
		_, err = res.Update(ctx, u, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		m.e.T.Fatalf("step %d: pool %s: %v", m.step, poolName(i), err)
	}
	return fmt.Sprintf("pool %s addresses %v", poolName(i), blocks)
}

// deletePool deletes a random pool (a pool still in use stays until its
// holders let go).
func (m *model) deletePool() string {
	name := poolName(m.rng.IntN(modelPools))
	err := m.e.CP.Dynamic.Resource(vipcastv1alpha1.IPPoolsResource).Delete(context.Background(), name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		m.e.T.Fatalf("step %d: deleting pool %s: %v", m.step, name, err)
	}
	return "delete pool " + name
}

// serviceName returns a random Service of the universe.
func (m *model) serviceName() (ns, name string) {
	return modelNamespaces[m.rng.IntN(len(modelNamespaces))], fmt.Sprintf("s%d", m.rng.IntN(modelServices))
}

// putService creates a random Service or changes one thing of it.
func (m *model) putService() (string, map[string]bool) {
	ns, name := m.serviceName()
	key := ns + "/" + name
	svcs := m.e.CP.Client.CoreV1().Services(ns)
	ctx := context.Background()
	var what string
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		s, err := svcs.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			s = ccmtest.LBService(ns, name)
			m.randomize(s, "ports")
			m.randomize(s, "policy")
			m.randomize(s, "sharing")
			what = fmt.Sprintf("create %s %s", key, describe(s))
			_, err = svcs.Create(ctx, s, metav1.CreateOptions{})
			return err
		}
		if err != nil {
			return err
		}
		aspects := []string{"ports", "policy", "sharing", "across", "pool", "ips", "type", "class"}
		aspect := aspects[m.rng.IntN(len(aspects))]
		m.randomize(s, aspect)
		what = fmt.Sprintf("edit %s %s → %s", key, aspect, describe(s))
		_, err = svcs.Update(ctx, s, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		// The API server's own validation refuses some combinations
		// (e.g. a class on a ClusterIP Service): nothing changed.
		if apierrors.IsInvalid(err) {
			return what + " (refused by the API server)", nil
		}
		m.e.T.Fatalf("step %d: %s: %v", m.step, what, err)
	}
	return what, map[string]bool{key: true}
}

// randomize changes one aspect of a Service at random.
func (m *model) randomize(s *v1.Service, aspect string) {
	pick := func(opts ...string) string { return opts[m.rng.IntN(len(opts))] }
	setAnn := func(k, v string) {
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		if v == "" {
			delete(s.Annotations, k)
			return
		}
		s.Annotations[k] = v
	}
	switch aspect {
	case "ports":
		all := []v1.ServicePort{{Name: "http", Port: 80}, {Name: "https", Port: 443}, {Name: "alt", Port: 8080}, {Name: "dns", Port: 53, Protocol: v1.ProtocolUDP}}
		m.rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
		s.Spec.Ports = all[:1+m.rng.IntN(2)]
		for i := range s.Spec.Ports {
			if s.Spec.Ports[i].Protocol == "" {
				s.Spec.Ports[i].Protocol = v1.ProtocolTCP
			}
		}
	case "policy":
		if s.Spec.Type == v1.ServiceTypeLoadBalancer {
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicy(pick("Cluster", "Local"))
		}
	case "sharing":
		setAnn(annSharingKey, pick("", "", "k1", "k2"))
	case "across":
		if s.Annotations[annSharingKey] != "" {
			// The other namespace (both, sometimes), or a namespace of
			// none of the model's Services.
			setAnn(annAcrossNamespaces, pick("", "m1,m2", otherModelNamespace(s.Namespace), "m3"))
		} else {
			setAnn(annAcrossNamespaces, "")
		}
	case "pool":
		setAnn("vipcast.io/pool", pick("", "", poolName(m.rng.IntN(modelPools))))
	case "ips":
		ip := netip.MustParsePrefix(poolBlock(m.rng.IntN(modelPools), m.rng.IntN(modelBlocks))).Addr()
		for range 1 + m.rng.IntN(14) {
			ip = ip.Next()
		}
		setAnn("vipcast.io/ips", pick("", "", ip.String()))
	case "type":
		m.setType(s, v1.ServiceType(pick("LoadBalancer", "LoadBalancer", "ClusterIP")))
	case "class":
		if s.Spec.Type == v1.ServiceTypeLoadBalancer && s.Spec.LoadBalancerClass == nil && m.rng.IntN(3) == 0 {
			// The class is immutable on a LoadBalancer Service: only a new
			// one (below, a type change back) can drop it.
			c := "example.com/other"
			s.Spec.LoadBalancerClass = &c
		}
	}
}

// setType switches a Service between LoadBalancer and ClusterIP, clearing
// the fields the API server refuses on ClusterIP.
func (m *model) setType(s *v1.Service, typ v1.ServiceType) {
	s.Spec.Type = typ
	if typ == v1.ServiceTypeClusterIP {
		s.Spec.ExternalTrafficPolicy = ""
		s.Spec.LoadBalancerClass = nil
		s.Spec.AllocateLoadBalancerNodePorts = nil
		for i := range s.Spec.Ports {
			s.Spec.Ports[i].NodePort = 0
		}
		return
	}
	s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyCluster
}

// describe is a short account of a Service's request.
func describe(s *v1.Service) string {
	var ports []string
	for _, p := range s.Spec.Ports {
		ports = append(ports, fmt.Sprintf("%d/%s", p.Port, p.Protocol))
	}
	class := ""
	if s.Spec.LoadBalancerClass != nil {
		class = " class=" + *s.Spec.LoadBalancerClass
	}
	return fmt.Sprintf("{%s%s %s ports=%s ann=%v}", s.Spec.Type, class, s.Spec.ExternalTrafficPolicy, strings.Join(ports, ","), vipcastAnnotations(s))
}

func vipcastAnnotations(s *v1.Service) map[string]string {
	out := map[string]string{}
	for k, v := range s.Annotations {
		if strings.HasPrefix(k, "vipcast.io/") {
			out[k] = v
		}
	}
	return out
}

// deleteService deletes a random Service.
func (m *model) deleteService() (string, map[string]bool) {
	ns, name := m.serviceName()
	err := m.e.CP.Client.CoreV1().Services(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		m.e.T.Fatalf("step %d: deleting Service %s/%s: %v", m.step, ns, name, err)
	}
	return fmt.Sprintf("delete %s/%s", ns, name), map[string]bool{ns + "/" + name: true}
}

// killCCM kills the leader without letting it release its lease and
// starts a replacement, as a crash and a Deployment's restart would.
func (m *model) killCCM() string {
	old := m.ccms[len(m.ccms)-1]
	old.Kill()
	m.ccms = m.ccms[:len(m.ccms)-1]
	m.started++
	m.ccms = append(m.ccms, m.e.StartCCM(fmt.Sprintf("model-%d", m.started)))
	m.waitLeader()
	return "kill the CCM and start another"
}

// leaderChange starts a second CCM, stops the leader gracefully and waits
// for the second to take over.
func (m *model) leaderChange() string {
	m.started++
	next := m.e.StartCCM(fmt.Sprintf("model-%d", m.started))
	for _, c := range m.ccms {
		c.Stop(5 * time.Second)
	}
	m.ccms = []*ccmtest.CCM{next}
	m.waitLeader()
	return "leader change (graceful)"
}

// waitLeader waits until the newest CCM holds the lease.
func (m *model) waitLeader() {
	c := m.ccms[len(m.ccms)-1]
	m.e.Eventually(30*time.Second, "the new CCM to lead", func() (bool, error) { return c.IsLeader(), nil })
}

// settle waits until the CCM has done everything the step gave it to do,
// and returns the state it left: the leader reports no work queued, in
// flight or scheduled (ccmIdle), and the Services and pools stayed
// unchanged from one idle report to the next and for at least settleQuiet,
// in which the API server's watch brings the step's writes to the CCM (on
// loopback, in milliseconds). Every write the CCM makes in response goes
// through its workqueues or the pools' status refresh, which ccmIdle
// covers. The state returned is the one read between two idle reports, so
// a write the CCM starts after settle returns (a back-off retry) cannot
// tear it. Retries of a failed sync are not waited for: when a pool changes
// or a VIP is released the CCM retries failed Services at once, through
// its queue, and a back-off retry repeats what failed against unchanged
// input.
func (m *model) settle() *modelState {
	const settleQuiet = 300 * time.Millisecond
	last, since, idleAt, why := "", time.Now(), "", ""
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		st := m.snapshot()
		fp := st.fingerprint()
		if fp != last {
			last, since = fp, time.Now()
		}
		var idle bool
		if idle, why = m.ccmIdle(); idle && fp == idleAt && time.Since(since) >= settleQuiet {
			return st
		}
		idleAt = ""
		if idle {
			idleAt = fp
		}
		time.Sleep(50 * time.Millisecond)
	}
	m.e.T.Fatalf("seed %d, step %d: the CCM did not settle in 30s (%s)", m.seed, m.step, why)
	return nil
}

// finalQuiet is the quiet period at the end of a run: longer than the
// CCM's own delays (pool annotations after 0.5 s without allocations, pool
// status writes coalesced over 1 s, the first retry of a failed sync 5 s
// later).
const finalQuiet = 6 * time.Second

// quiet waits until no Service or pool has changed for d and returns that
// state.
func (m *model) quiet(d time.Duration) *modelState {
	last, since := "", time.Now()
	deadline := time.Now().Add(d + 30*time.Second)
	for time.Now().Before(deadline) {
		st := m.snapshot()
		fp := st.fingerprint()
		if fp != last {
			last, since = fp, time.Now()
		} else if time.Since(since) >= d {
			return st
		}
		time.Sleep(100 * time.Millisecond)
	}
	m.e.T.Fatalf("seed %d: the CCM kept writing for %v after the last step", m.seed, d+30*time.Second)
	return nil
}

// ccmQueues are the leader's workqueues whose work writes Services or
// IPPools.
var ccmQueues = []string{"service", "ippools", "pool-annotations"}

// ccmIdle reads the leader's /metrics: it is idle when each of ccmQueues
// has processed every item added to it (nothing queued or in flight:
// workqueue_adds_total equals workqueue_work_duration_seconds_count, both
// counted as the item enters and leaves) and no IPPool status refresh is
// scheduled (vipcast_ipam_pool_status_refresh_pending). Otherwise it says
// what is pending.
func (m *model) ccmIdle() (bool, string) {
	c := m.ccms[len(m.ccms)-1]
	body, err := c.Metrics(m.e.CP.Token)
	if err != nil {
		return false, err.Error()
	}
	values := map[string]string{}
	for _, line := range strings.Split(body, "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && !strings.HasPrefix(line, "#") {
			values[k] = v
		}
	}
	for _, q := range ccmQueues {
		adds, done := values[`workqueue_adds_total{name="`+q+`"}`], values[`workqueue_work_duration_seconds_count{name="`+q+`"}`]
		if adds == "" || done == "" {
			return false, "no workqueue metrics for queue " + q
		}
		if adds != done {
			return false, fmt.Sprintf("queue %s: %s added, %s done", q, adds, done)
		}
	}
	if v := values["vipcast_ipam_pool_status_refresh_pending"]; v != "0" {
		return false, "pool status refresh pending: " + v
	}
	return true, ""
}

// fingerprint is the resourceVersions of every Service and pool.
func (st *modelState) fingerprint() string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(st.services)) {
		b.WriteString(k + "@" + st.services[k].ResourceVersion + ",")
	}
	for _, p := range st.pools {
		b.WriteString(p.Name + "@" + p.ResourceVersion + ",")
	}
	return b.String()
}

// modelState is what the invariants read: every Service and pool.
type modelState struct {
	services map[string]*v1.Service
	pools    []*vipcastv1alpha1.IPPool
}

func (m *model) snapshot() *modelState {
	st := &modelState{services: m.e.ListServices(modelNamespaces...)}
	l, err := m.e.CP.Dynamic.Resource(vipcastv1alpha1.IPPoolsResource).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		m.e.T.Fatal(err)
	}
	for _, u := range l.Items {
		p := &vipcastv1alpha1.IPPool{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, p); err != nil {
			m.e.T.Fatal(err)
		}
		st.pools = append(st.pools, p)
	}
	return st
}

// vips returns the published addresses of the Services vipcast serves,
// by Service key.
func (st *modelState) vips() map[string][]netip.Addr {
	out := map[string][]netip.Addr{}
	for k, s := range st.services {
		if s.Spec.Type != v1.ServiceTypeLoadBalancer || s.Spec.LoadBalancerClass != nil {
			continue
		}
		for _, ing := range s.Status.LoadBalancer.Ingress {
			if ip, err := netip.ParseAddr(ing.IP); err == nil {
				out[k] = append(out[k], ip)
			}
		}
		slices.SortFunc(out[k], netip.Addr.Compare)
	}
	return out
}

func (st *modelState) summary() string {
	held := 0
	for _, ips := range st.vips() {
		if len(ips) > 0 {
			held++
		}
	}
	return fmt.Sprintf("at the end %d Services (%d with a VIP), %d pools", len(st.services), held, len(st.pools))
}

// checkInvariants checks the state after a step against the one before;
// touched are the Services whose own request the step changed.
func checkInvariants(prev, cur *modelState, touched map[string]bool) error {
	for _, check := range []func() error{
		func() error { return noDoubleHolders(prev, cur) },
		func() error { return vipsStable(prev, cur, touched) },
		func() error { return vipsAnnounceable(cur) },
		func() error { return poolCountsExact(cur) },
	} {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// noDoubleHolders: no two Services hold one VIP unless they may share it,
// or unless they held it together before this step and one of them now
// asks for sharing in a way the CCM refuses (refusedSharing): a refused
// request keeps what it had, and takes nothing from the other.
func noDoubleHolders(prev, st *modelState) error {
	holders := holdersOf(st)
	before := holdersOf(prev)
	for ip, keys := range holders {
		for i := range keys {
			for j := i + 1; j < len(keys); j++ {
				a, b := st.services[keys[i]], st.services[keys[j]]
				kept := (refusedSharing(a) || refusedSharing(b)) &&
					slices.Contains(before[ip], keys[i]) && slices.Contains(before[ip], keys[j])
				if !mayShare(a, b) && !kept {
					return fmt.Errorf("%s is held by %s %s and %s %s, which may not share it", ip,
						keys[i], describe(st.services[keys[i]]), keys[j], describe(st.services[keys[j]]))
				}
			}
		}
	}
	return nil
}

// holdersOf lists the Services holding each VIP, sorted.
func holdersOf(st *modelState) map[netip.Addr][]string {
	holders := map[netip.Addr][]string{}
	for k, ips := range st.vips() {
		for _, ip := range ips {
			holders[ip] = append(holders[ip], k)
		}
	}
	for _, keys := range holders {
		sort.Strings(keys)
	}
	return holders
}

// refusedSharing reports whether s asks to share across namespaces without
// a sharing key, which the CCM refuses with a Warning Event (the model
// makes it when a "sharing" edit drops the key of a Service that opted in
// across namespaces).
func refusedSharing(s *v1.Service) bool {
	return s.Annotations[annAcrossNamespaces] != "" && s.Annotations[annSharingKey] == ""
}

// otherModelNamespace is the model's namespace that is not ns.
func otherModelNamespace(ns string) string {
	if ns == modelNamespaces[0] {
		return modelNamespaces[1]
	}
	return modelNamespaces[0]
}

// namesNamespace reports whether s agrees to share with Services of ns.
func namesNamespace(s *v1.Service, ns string) bool {
	return slices.Contains(strings.Split(s.Annotations[annAcrossNamespaces], ","), ns)
}

// mayShare reports whether two Services may hold one VIP: the same
// sharing key; the same namespace, or each naming the other's namespace
// and neither Local; no common port; the same traffic policy, and for Local the
// same pods.
func mayShare(a, b *v1.Service) bool {
	key := a.Annotations[annSharingKey]
	across := namesNamespace(a, b.Namespace) && namesNamespace(b, a.Namespace) &&
		a.Spec.ExternalTrafficPolicy != v1.ServiceExternalTrafficPolicyLocal
	return key != "" && key == b.Annotations[annSharingKey] &&
		(a.Namespace == b.Namespace || across) &&
		!portsClash(a, b) &&
		a.Spec.ExternalTrafficPolicy == b.Spec.ExternalTrafficPolicy &&
		(a.Spec.ExternalTrafficPolicy != v1.ServiceExternalTrafficPolicyLocal || maps.Equal(a.Spec.Selector, b.Spec.Selector))
}

// portsClash reports whether a and b use a common port (protocol and
// number).
func portsClash(a, b *v1.Service) bool {
	for _, p := range a.Spec.Ports {
		for _, q := range b.Spec.Ports {
			if p.Port == q.Port && p.Protocol == q.Protocol {
				return true
			}
		}
	}
	return false
}

// The sharing annotations the model sets.
const (
	annSharingKey       = "vipcast.io/sharing-key"
	annAcrossNamespaces = "vipcast.io/allow-shared-ip-across-namespaces"
)

// vipsStable: a Service whose own request the step did not change, and
// whose VIPs satisfied that request, keeps its VIPs — through pool edits,
// deletions, CCM kills and leader changes. (A Service still waiting for
// what it asked, say a pool that did not exist yet, may move once it can.)
func vipsStable(prev, cur *modelState, touched map[string]bool) error {
	now := cur.vips()
	adm := poolspec.Admit(prev.pools)
	for k, before := range prev.vips() {
		if touched[k] || len(before) == 0 || !satisfies(adm, prev.services[k], before) {
			continue
		}
		if _, exists := cur.services[k]; !exists {
			return fmt.Errorf("%s disappeared without being deleted", k)
		}
		if !slices.Equal(before, now[k]) {
			return fmt.Errorf("%s %s changed VIPs from %v to %v though its request did not change", k, describe(cur.services[k]), before, now[k])
		}
	}
	return nil
}

// satisfies reports whether ips are what svc asks for: the addresses its
// vipcast.io/ips names, if any, held by the pool its vipcast.io/pool
// names, if any.
func satisfies(adm *poolspec.Admission, svc *v1.Service, ips []netip.Addr) bool {
	named := svc.Annotations[poolspec.AnnotationPool]
	want := svc.Annotations["vipcast.io/ips"]
	for _, ip := range ips {
		if want != "" && !slices.Contains(strings.Split(want, ","), ip.String()) {
			return false
		}
		if h, ok := adm.Holder(ip, poolspec.HeldBy(svc.Annotations)); named != "" && (!ok || h.Pool != named) {
			return false
		}
	}
	return true
}

// vipsAnnounceable: every published VIP lies in an address range the
// speakers announce: a pool holds it (poolspec's holding rule, which the
// speakers use) — in its spec, or held outside it by the pool the CCM
// recorded for the Service (poolspec.HeldBy) — whatever the Service's own
// request asks meanwhile.
func vipsAnnounceable(st *modelState) error {
	adm := poolspec.Admit(st.pools)
	for k, ips := range st.vips() {
		named := poolspec.HeldBy(st.services[k].Annotations)
		for _, ip := range ips {
			if _, ok := adm.Holder(ip, named); !ok {
				return fmt.Errorf("%s %s publishes %s, which no pool holds: the speakers would not announce it", k, describe(st.services[k]), ip)
			}
		}
	}
	return nil
}

// poolCountsExact: each pool's status counts the distinct published
// addresses it holds: in its spec (ipv4.inUse) and outside it
// (heldOutsideSpec).
func poolCountsExact(st *modelState) error {
	adm := poolspec.Admit(st.pools)
	inSpec, outside := map[string]map[netip.Addr]bool{}, map[string]map[netip.Addr]bool{}
	for k, ips := range st.vips() {
		for _, ip := range ips {
			h, ok := adm.Holder(ip, poolspec.HeldBy(st.services[k].Annotations))
			if !ok {
				continue
			}
			into := outside
			if h.InSpec {
				into = inSpec
			}
			if into[h.Pool] == nil {
				into[h.Pool] = map[netip.Addr]bool{}
			}
			into[h.Pool][ip] = true
		}
	}
	for _, p := range st.pools {
		got := int64(0)
		if f := p.Status.IPv4; f != nil {
			got = f.InUse
		}
		if got != int64(len(inSpec[p.Name])) || p.Status.HeldOutsideSpec != int64(len(outside[p.Name])) {
			return fmt.Errorf("pool %s status says %d addresses in use and %d held outside its spec; Services publish %d in it and %d outside it",
				p.Name, got, p.Status.HeldOutsideSpec, len(inSpec[p.Name]), len(outside[p.Name]))
		}
	}
	return nil
}
