//go:build controlplane

package e2e

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/vipcast/vipcast/test/ccmtest"
)

// ccmServices is how many Services BenchmarkCCMAllocation creates.
var ccmServices = flag.Int("ccm-services", 1000, "BenchmarkCCMAllocation: Services created at once (above 2,000 they allocate no node ports, which would run out)")

// benchService is bench Service name in ns, without node ports when the
// run creates more Services than the node port range holds.
func benchService(ns, name string) *v1.Service {
	s := ccmtest.LBService(ns, name)
	if *ccmServices > 2000 {
		s.Spec.AllocateLoadBalancerNodePorts = ptr.To(false)
	}
	return s
}

// BenchmarkCCMAllocation measures, against the real API server, the time
// until 1,000 Services (-ccm-services) created at once all have VIPs from vipcast-ccm (with
// the binary's default flags), next to the floor measured on the same API
// server in the same run: the same 1,000 Services created and their status
// written directly with client-go from 8 workers. Run with -benchtime=1x
// (make bench); it prints the figures and the ratio. VIPCAST_BENCH_CCM_FLAGS
// adds flags to the CCM, to compare settings.
func BenchmarkCCMAllocation(b *testing.B) {
	for range b.N {
		e := newEnv(b)
		// A real cluster has nodes; without any, the service controller adds
		// an UnAvailableLoadBalancer warning Event to every Service.
		e.readyNodes("node-a", "node-b")
		e.mustApplyPools("apiVersion: vipcast.io/v1alpha1\nkind: IPPool\nmetadata: {name: bench}\nspec: {addresses: [10.90.0.0/17]}\n")

		// Warm the API server up (first requests pay for caches and
		// connections) so the floor is not measured cold.
		e.Namespace("warm", nil)
		e.runWorkers(200, 8, func(i int) error {
			name := fmt.Sprintf("w-%04d", i)
			if _, err := e.CP.Client.CoreV1().Services("warm").Create(context.Background(), ccmtest.LBService("warm", name), metav1.CreateOptions{}); err != nil {
				return err
			}
			return e.CP.Client.CoreV1().Services("warm").Delete(context.Background(), name, metav1.DeleteOptions{})
		})

		// Floor: client-go writes what the CCM would write, 8 workers, timed
		// by the same watch as the CCM run. Measured twice; the faster run
		// is the floor, which makes the ratio conservative.
		var floor, floorP50, floorP99 time.Duration
		for round := range 2 {
			ns := fmt.Sprintf("floor-%d", round)
			d, p50, p99 := e.floorRun(b, ns, false)
			if round == 0 || d < floor {
				floor, floorP50, floorP99 = d, p50, p99
			}
		}
		// Reference, not a target: the writes the stock service controller
		// itself makes per Service (finalizer patch, two Events, status
		// patch), done directly. vipcast-ccm cannot beat this by itself.
		stockPattern, _, _ := e.floorRun(b, "stock-pattern", true)

		// vipcast-ccm with its defaults; wait until it leads and is idle.
		c := e.StartCCMWith("bench", strings.Fields(os.Getenv("VIPCAST_BENCH_CCM_FLAGS"))...)
		e.Eventually(30*time.Second, "the CCM to lead", func() (bool, error) { return c.IsLeader(), nil })
		e.Namespace("ccm", nil)
		e.createService(ccmtest.LBService("ccm", "warmup"))
		e.waitAllAllocated(30*time.Second, "ccm", func(*v1.Service) int { return 1 })

		w := e.watchAllocations("ccm", *ccmServices)
		start := time.Now()
		e.runWorkers(*ccmServices, 8, func(i int) error {
			name := fmt.Sprintf("s-%05d", i)
			w.created(name)
			_, err := e.CP.Client.CoreV1().Services("ccm").Create(context.Background(), benchService("ccm", name), metav1.CreateOptions{})
			return err
		})
		w.wait(b)
		total := time.Since(start)
		p50, p99 := w.percentiles()
		ratio := total.Seconds() / floor.Seconds()
		fmt.Printf("BENCH ccm-allocation: %d Services: vipcast-ccm %.2fs (p50 %s, p99 %s per Service); floor (create + status write, 8 workers) %.2fs (p50 %s, p99 %s); ratio %.2fx\n",
			*ccmServices, total.Seconds(), p50.Round(time.Millisecond), p99.Round(time.Millisecond),
			floor.Seconds(), floorP50.Round(time.Millisecond), floorP99.Round(time.Millisecond), ratio)
		fmt.Printf("BENCH ccm-allocation: reference: the stock service controller's writes done directly (create, finalizer patch, 2 Events, status patch; 8 workers) %.2fs = %.2fx the floor; vipcast-ccm / that = %.2fx\n",
			stockPattern.Seconds(), stockPattern.Seconds()/floor.Seconds(), total.Seconds()/stockPattern.Seconds())
		b.ReportMetric(total.Seconds(), "s-total")
		b.ReportMetric(floor.Seconds(), "s-floor")
		b.ReportMetric(ratio, "x-floor")
		b.ReportMetric(float64(p50.Milliseconds()), "ms-p50")
		b.ReportMetric(float64(p99.Milliseconds()), "ms-p99")
	}
}

// allocationWatch times, per Service, creation to first status with an
// address, as seen through one watch on a namespace.
type allocationWatch struct {
	w         watch.Interface
	want      int
	mu        sync.Mutex
	createdAt map[string]time.Time
	seenAt    map[string]time.Time
	done      chan struct{}
}

func (e *env) watchAllocations(ns string, want int) *allocationWatch {
	e.T.Helper()
	w, err := e.CP.Client.CoreV1().Services(ns).Watch(context.Background(), metav1.ListOptions{})
	if err != nil {
		e.T.Fatal(err)
	}
	aw := &allocationWatch{w: w, want: want, createdAt: map[string]time.Time{}, seenAt: map[string]time.Time{}, done: make(chan struct{})}
	go func() {
		defer close(aw.done)
		for ev := range w.ResultChan() {
			s, ok := ev.Object.(*v1.Service)
			if !ok || ev.Type == watch.Deleted || len(s.Status.LoadBalancer.Ingress) == 0 {
				continue
			}
			aw.mu.Lock()
			if _, counted := aw.createdAt[s.Name]; counted {
				if _, seen := aw.seenAt[s.Name]; !seen {
					aw.seenAt[s.Name] = time.Now()
				}
			}
			n := len(aw.seenAt)
			aw.mu.Unlock()
			if n == want {
				return
			}
		}
	}()
	return aw
}

func (aw *allocationWatch) created(name string) {
	aw.mu.Lock()
	aw.createdAt[name] = time.Now()
	aw.mu.Unlock()
}

func (aw *allocationWatch) wait(b testing.TB) {
	defer aw.w.Stop()
	select {
	case <-aw.done:
	case <-time.After(5 * time.Minute):
		aw.mu.Lock()
		defer aw.mu.Unlock()
		b.Fatalf("only %d of %d Services got VIPs within 5 minutes", len(aw.seenAt), aw.want)
	}
}

func (aw *allocationWatch) percentiles() (p50, p99 time.Duration) {
	aw.mu.Lock()
	defer aw.mu.Unlock()
	var lat []time.Duration
	for name, at := range aw.seenAt {
		lat = append(lat, at.Sub(aw.createdAt[name]))
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return lat[len(lat)/2], lat[len(lat)*99/100]
}

// floorRun creates -ccm-services Services in ns and writes their status
// directly from 8 workers; it returns the time until the watch saw every
// status and the per-Service p50/p99, then deletes the Services. With
// stockWrites it also makes the other writes the stock service controller
// makes per Service: a finalizer patch and two Events.
func (e *env) floorRun(b testing.TB, ns string, stockWrites bool) (total, p50, p99 time.Duration) {
	e.Namespace(ns, nil)
	w := e.watchAllocations(ns, *ccmServices)
	start := time.Now()
	e.runWorkers(*ccmServices, 8, func(i int) error {
		s := benchService(ns, fmt.Sprintf("s-%05d", i))
		w.created(s.Name)
		created, err := e.CP.Client.CoreV1().Services(ns).Create(context.Background(), s, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		if stockWrites {
			if created, err = e.stockControllerWrites(created); err != nil {
				return err
			}
		}
		created.Status.LoadBalancer = *lbStatusFor(fmt.Sprintf("10.91.%d.%d", i/256, i%256))
		_, err = e.CP.Client.CoreV1().Services(ns).UpdateStatus(context.Background(), created, metav1.UpdateOptions{})
		return err
	})
	w.wait(b)
	total = time.Since(start)
	p50, p99 = w.percentiles()
	e.runWorkers(*ccmServices, 8, func(i int) error {
		name := fmt.Sprintf("s-%05d", i)
		if stockWrites {
			// Drop the finalizer ourselves, or the CCM started next would
			// spend the measured run cleaning these Services up.
			if _, err := e.CP.Client.CoreV1().Services(ns).Patch(context.Background(), name, types.MergePatchType,
				[]byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{}); err != nil {
				return err
			}
		}
		return e.CP.Client.CoreV1().Services(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	e.Eventually(time.Minute, "the "+ns+" Services to be gone", func() (bool, error) {
		n := len(e.ListServices(ns))
		return n == 0, fmt.Errorf("%d left", n)
	})
	return total, p50, p99
}

// stockControllerWrites makes, for svc, the writes the cloud-provider
// service controller makes besides the status: the finalizer patch (on the
// status subresource, as it does) and its two Normal Events. It returns the
// patched Service.
func (e *env) stockControllerWrites(svc *v1.Service) (*v1.Service, error) {
	patch := []byte(`{"metadata":{"finalizers":["service.kubernetes.io/load-balancer-cleanup"]}}`)
	patched, err := e.CP.Client.CoreV1().Services(svc.Namespace).Patch(context.Background(), svc.Name,
		types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	if err != nil {
		return nil, err
	}
	for _, reason := range []string{"EnsuringLoadBalancer", "EnsuredLoadBalancer"} {
		ev := &v1.Event{
			ObjectMeta:     metav1.ObjectMeta{GenerateName: svc.Name + ".", Namespace: svc.Namespace},
			InvolvedObject: v1.ObjectReference{Kind: "Service", APIVersion: "v1", Namespace: svc.Namespace, Name: svc.Name, UID: svc.UID},
			Reason:         reason, Message: reason, Type: v1.EventTypeNormal,
			Source:         v1.EventSource{Component: "service-controller"},
			FirstTimestamp: metav1.Now(), LastTimestamp: metav1.Now(), Count: 1,
		}
		if _, err := e.CP.Client.CoreV1().Events(svc.Namespace).Create(context.Background(), ev, metav1.CreateOptions{}); err != nil {
			return nil, err
		}
	}
	return patched, nil
}
