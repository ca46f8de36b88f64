//go:build routing

package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/test/controlplane"
	"github.com/vipcast/vipcast/test/netns"
	"github.com/vipcast/vipcast/test/proc"
)

var (
	scaleNodes    = flag.String("scale-nodes", "10,50", "BenchmarkScale: comma-separated numbers of speakers to run, one measurement each")
	scaleServices = flag.Int("scale-services", 10000, "BenchmarkScale: LoadBalancer Services published")
	scaleChurn    = flag.Int("scale-churn", 100, "BenchmarkScale: endpoint changes per second during each window")
	scaleWindow   = flag.Duration("scale-window", 90*time.Second, "BenchmarkScale: length of each measured window (three status intervals)")
	scaleSpeaker  = flag.String("scale-speaker", "", "BenchmarkScale: the vipcast-speaker binary to measure (default: this tree's), such as one built from an older commit")
)

// BenchmarkScale measures what vipcast's speakers cost the control plane,
// against the real API server and etcd, next to the real kube-proxy
// v1.37.1 watching the same API server: with -scale-services LoadBalancer
// Services published (status and one ready endpoint each) and
// -scale-churn endpoint changes a second (a ready endpoint turning not
// ready and back, which changes every node's routes), for each N of
// -scale-nodes it runs N vipcast-speaker processes (routing only: no
// IPVS, no BGPPeer), each its own node, and records over -scale-window:
//
//   - the bytes the API server sends each speaker, and kube-proxy
//     (metered relays in front of the API server: TLS records included,
//     for both), a second and to sync;
//   - the SpeakerStatus writes (a watch: events and their JSON bytes);
//   - etcd's WAL bytes a second and its revisions in the window, and its
//     database size, next to the churn alone (a window without speakers);
//   - each speaker's resident memory, and kube-proxy's.
//
// kube-proxy runs in nftables mode in a network namespace of its own.
// Run with -benchtime=1x (make bench).
func BenchmarkScale(b *testing.B) {
	netns.Require(b)
	var counts []int
	for _, f := range strings.Split(*scaleNodes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			b.Fatalf("-scale-nodes=%q: want numbers of speakers such as 10,100", *scaleNodes)
		}
		counts = append(counts, n)
	}
	bin := speakerBinary
	if *scaleSpeaker != "" {
		bin = *scaleSpeaker
	}
	for range b.N {
		e := newEnv(b)
		e.mustApplyPools("apiVersion: vipcast.io/v1alpha1\nkind: IPPool\nmetadata: {name: bench}\nspec: {addresses: [10.200.0.0/16]}\n")
		e.publishBench(*scaleServices)
		e.node("scale-proxy", nil, "10.0.0.250")
		kp := e.startKubeProxy("scale-proxy")
		kpSync := e.settled("kube-proxy", kp.down)

		next := 0 // the churn's next change
		base := e.scaleWindow(nil, kp, &next)
		fmt.Printf("BENCH scale-base: %d Services, %d endpoint changes/s, no speaker: etcd WAL %.0f B/s, %d revisions in %v; kube-proxy %.0f B/s (sync %.1f MB), RSS %.0f MB\n",
			*scaleServices, base.churn, base.walPerSec, base.revisions, *scaleWindow, base.proxyPerSec, float64(kpSync)/1e6, base.proxyRSS/1e6)

		var first *scaleResult
		for _, n := range counts {
			spk := e.startScaleSpeakers(bin, n)
			r := e.scaleWindow(spk, kp, &next)
			for _, s := range spk {
				s.proc.Stop(10 * time.Second)
			}
			// The API server answers each status write with the object: what
			// the speaker receives besides its watches.
			watches := r.perNodePerSec - r.statusBytesPerSec/float64(n)
			fmt.Printf("BENCH scale-speakers N=%d: per node: API %.0f B/s, of which watches %.0f B/s (kube-proxy %.0f B/s, ratio %.2f), sync %.1f MB (kube-proxy %.1f MB); RSS %.0f MB (kube-proxy %.0f MB)\n",
				n, r.perNodePerSec, watches, r.proxyPerSec, watches/r.proxyPerSec, r.perNodeSync/1e6, float64(kpSync)/1e6, r.rss/1e6, r.proxyRSS/1e6)
			fmt.Printf("BENCH scale-status N=%d: %.2f SpeakerStatus writes/s (%.3f per node), %.0f B/s (%.0f per node, objects of %.0f B); etcd WAL %.0f B/s (%.0f over the churn alone), %d revisions in %v (%d over), db %.1f MB\n",
				n, r.statusPerSec, r.statusPerSec/float64(n), r.statusBytesPerSec, r.statusBytesPerSec/float64(n), r.statusObject,
				r.walPerSec, r.walPerSec-base.walPerSec, r.revisions, *scaleWindow, r.revisions-base.revisions, r.dbSize/1e6)
			b.ReportMetric(r.perNodePerSec, fmt.Sprintf("B/s/node-N%d", n))
			b.ReportMetric(watches/r.proxyPerSec, fmt.Sprintf("x-kube-proxy-N%d", n))
			// The two sides of that ratio, for the page make bench writes
			// (a speaker's watches against their floor, kube-proxy's).
			b.ReportMetric(watches, fmt.Sprintf("watch-B/s/node-N%d", n))
			b.ReportMetric(r.proxyPerSec, fmt.Sprintf("kube-proxy-B/s/node-N%d", n))
			b.ReportMetric(r.statusBytesPerSec/float64(n), fmt.Sprintf("status-B/s/node-N%d", n))
			b.ReportMetric(r.rss/1e6, fmt.Sprintf("MB-RSS-N%d", n))
			if first == nil {
				first = &r
				continue
			}
			grow := float64(n) / float64(counts[0])
			fmt.Printf("BENCH scale-growth N=%d→%d (x%.0f): per-node API bytes x%.2f, status bytes x%.2f, etcd WAL over the churn x%.2f\n",
				counts[0], n, grow, r.perNodePerSec/first.perNodePerSec, r.statusBytesPerSec/first.statusBytesPerSec,
				(r.walPerSec-base.walPerSec)/(first.walPerSec-base.walPerSec))
		}
	}
}

// settled waits until m has passed something and then nothing for five
// seconds (a client's initial lists are done), and returns its count.
func (e *env) settled(what string, m *atomic.Int64) int64 {
	e.T.Helper()
	last := int64(-1)
	e.Eventually(10*time.Minute, what+" synced", func() (bool, error) {
		cur := m.Load()
		ok := cur > 0 && cur == last
		last = cur
		if !ok {
			time.Sleep(5 * time.Second)
		}
		return ok, fmt.Errorf("%d bytes received", cur)
	})
	return last
}

// apiAddr is the API server's host:port.
func (e *env) apiAddr() string {
	return strings.TrimPrefix(e.CP.Config.Host, "https://")
}

// scaleProc is a process behind a metered relay (netns.Metered), and the
// bytes the API server sent it.
type scaleProc struct {
	proc *proc.Process
	down *atomic.Int64
}

// startKubeProxy runs kube-proxy v1.37.1 as node in a network namespace of
// its own, in nftables mode, through a metered relay.
func (e *env) startKubeProxy(node string) *scaleProc {
	e.T.Helper()
	ns := netns.New(e.T, "kp")
	addr, m := netns.Metered(e.T, ns, "127.0.0.1:0", e.apiAddr())
	kc := e.kubeconfigVia(addr)
	args := ns.Command(filepath.Join(controlplane.BinDir(), "kube-proxy"), "--kubeconfig", kc, "--proxy-mode", "nftables",
		"--hostname-override", node, "--cluster-cidr", "10.244.0.0/16", "--conntrack-max-per-core", "0",
		"--metrics-bind-address", "127.0.0.1:10249", "--healthz-bind-address", "127.0.0.1:10256", "-v", "0")
	log := filepath.Join(e.CP.Dir, "kube-proxy.log")
	p, err := proc.Start(log, args[0], args[1:]...)
	if err != nil {
		e.T.Fatal(err)
	}
	e.T.Cleanup(func() { p.Stop(10 * time.Second) })
	return &scaleProc{proc: p, down: m}
}

// startScaleSpeakers runs n speakers (binary bin), each a node of its
// own, routing only, and waits until every one has written a
// SpeakerStatus that counts every Service, announced or not.
func (e *env) startScaleSpeakers(bin string, n int) []*scaleProc {
	e.T.Helper()
	out := make([]*scaleProc, n)
	for i := range n {
		name := fmt.Sprintf("scale-%03d", i)
		if _, err := e.CP.Client.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{}); err != nil {
			e.node(name, nil, fmt.Sprintf("10.0.%d.%d", 1+i/250, 1+i%250))
		}
		addr, m := netns.Metered(e.T, nil, "127.0.0.1:0", e.apiAddr())
		p, err := proc.Start(filepath.Join(e.CP.Dir, name+".log"), bin, "--kubeconfig", e.kubeconfigVia(addr), "--node-name", name,
			"--metrics-bind-address", "0", "--ipvs=false", "-v", "0")
		if err != nil {
			e.T.Fatal(err)
		}
		e.T.Cleanup(func() { p.Stop(10 * time.Second) })
		out[i] = &scaleProc{proc: p, down: m}
	}
	e.Eventually(15*time.Minute, fmt.Sprintf("%d speakers counting %d Services each", n, *scaleServices), func() (bool, error) {
		list, err := e.CP.Dynamic.Resource(vipcastv1alpha1.SpeakerStatusesResource).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		done := 0
		for _, u := range list.Items {
			yes, _, _ := unstructured.NestedInt64(u.Object, "status", "announcedCount")
			no, _, _ := unstructured.NestedInt64(u.Object, "status", "notAnnouncedCount")
			if yes+no == int64(*scaleServices) && strings.HasPrefix(u.GetName(), "scale-") {
				done++
			}
		}
		return done >= n, fmt.Errorf("%d of %d", done, n)
	})
	return out
}

// scaleResult is one window's figures.
type scaleResult struct {
	churn                                         int // endpoint changes made a second
	perNodePerSec, perNodeSync, rss               float64
	proxyPerSec, proxyRSS                         float64
	statusPerSec, statusBytesPerSec, statusObject float64
	walPerSec, dbSize                             float64
	revisions                                     int64
}

// scaleWindow makes -scale-churn endpoint changes a second for
// -scale-window and measures what the speakers (none: the churn alone)
// and kube-proxy received, the status writes and etcd's.
func (e *env) scaleWindow(spk []*scaleProc, kp *scaleProc, next *int) scaleResult {
	e.T.Helper()
	var r scaleResult
	sync := make([]int64, len(spk))
	for i, s := range spk {
		sync[i] = s.down.Load()
		r.perNodeSync += float64(sync[i]) / float64(len(spk))
	}
	kpStart := kp.down.Load()
	etcdBefore := e.etcdMetrics()

	// The status writes, as a watch sees them.
	var writes, statusBytes atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), *scaleWindow)
	defer cancel()
	w, err := e.CP.Dynamic.Resource(vipcastv1alpha1.SpeakerStatusesResource).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		e.T.Fatal(err)
	}
	go func() {
		// A watch from no resource version starts with an ADDED event per
		// object: only the MODIFIED ones are writes.
		for ev := range w.ResultChan() {
			if ev.Type == watch.Modified {
				data, _ := json.Marshal(ev.Object)
				writes.Add(1)
				statusBytes.Add(int64(len(data)))
			}
		}
	}()

	start := time.Now()
	made := e.churn(ctx, next)
	elapsed := time.Since(start).Seconds()
	w.Stop()

	etcdAfter := e.etcdMetrics()
	for i, s := range spk {
		r.perNodePerSec += float64(s.down.Load()-sync[i]) / elapsed / float64(len(spk))
		r.rss += rss(s.proc.Pid()) / float64(len(spk))
	}
	r.churn = int(float64(made) / elapsed)
	r.proxyPerSec = float64(kp.down.Load()-kpStart) / elapsed
	r.proxyRSS = rss(kp.proc.Pid())
	r.statusPerSec = float64(writes.Load()) / elapsed
	r.statusBytesPerSec = float64(statusBytes.Load()) / elapsed
	if writes.Load() > 0 {
		r.statusObject = float64(statusBytes.Load()) / float64(writes.Load())
	}
	r.walPerSec = (etcdAfter["etcd_disk_wal_write_bytes_total"] - etcdBefore["etcd_disk_wal_write_bytes_total"]) / elapsed
	r.revisions = int64(etcdAfter["etcd_debugging_mvcc_current_revision"] - etcdBefore["etcd_debugging_mvcc_current_revision"])
	r.dbSize = etcdAfter["etcd_mvcc_db_total_size_in_bytes"]
	return r
}

// churn turns the endpoints of the bench Services not ready and ready
// again, -scale-churn changes a second, one JSON patch each, until ctx
// ends, going on from change *next (each pass over the Services flips
// every one); it returns how many it made.
func (e *env) churn(ctx context.Context, next *int) int64 {
	var made atomic.Int64
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				ready := (i / *scaleServices)%2 == 1 // each pass flips every one
				patch := fmt.Sprintf(`[{"op":"replace","path":"/endpoints/0/conditions/ready","value":%t}]`, ready)
				name := fmt.Sprintf("s-%05d-1", i%*scaleServices)
				_, err := e.CP.Client.DiscoveryV1().EndpointSlices("bench").Patch(ctx, name, types.JSONPatchType, []byte(patch), metav1.PatchOptions{})
				if err == nil {
					made.Add(1)
				}
			}
		}()
	}
	tick := time.NewTicker(time.Second / time.Duration(*scaleChurn))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			close(jobs)
			wg.Wait()
			return made.Load()
		case <-tick.C:
			select {
			case jobs <- *next:
				*next++
			default: // the workers are behind: the rate made is reported
			}
		}
	}
}

// etcdMetrics reads etcd's unlabelled metrics.
func (e *env) etcdMetrics() map[string]float64 {
	e.T.Helper()
	resp, err := http.Get(e.CP.EtcdURL + "/metrics")
	if err != nil {
		e.T.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && !strings.HasPrefix(f[0], "#") && !strings.Contains(f[0], "{") {
			if v, err := strconv.ParseFloat(f[1], 64); err == nil {
				out[f[0]] = v
			}
		}
	}
	return out
}

// rss is a process's resident memory in bytes (0 when it is gone).
func rss(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb * 1024
		}
	}
	return 0
}
