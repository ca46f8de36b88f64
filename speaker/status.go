package speaker

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/klog/v2"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/bgp"
)

// The node's SpeakerStatus: what it announces, why it does not announce
// the rest, and its sessions. The worker goroutine computes it at most
// every statusInterval (keyStatus, queued with that delay after every
// change), and a writer goroutine writes it when it changed, so an API
// server that is slow or gone never holds up the dataplane or BGP.
const (
	statusInterval = 2 * time.Second
	// statusCallTimeout bounds each request of the status writer.
	statusCallTimeout = 10 * time.Second
	// statusRetry is the first wait after a failed write; it doubles up
	// to statusRetryMax while writes fail.
	statusRetry    = time.Second
	statusRetryMax = time.Minute
)

// BuildSpeakerStatus computes a node's SpeakerStatus from its sessions, the
// prefixes it announces and, by Service key, why it announces no route for
// a Service vipcast serves that has a VIP (only Services with a reason).
// Lists are sorted and bounded (MaxSpeakerStatusAnnounced,
// MaxSpeakerStatusNotAnnouncedBytes); counts are exact. LastUpdateTime is
// left to the writer.
func BuildSpeakerStatus(sessions []bgp.SessionState, announced []netip.Prefix, notAnnounced map[string]string) vipcastv1alpha1.SpeakerStatusStatus {
	st := vipcastv1alpha1.SpeakerStatusStatus{
		SessionsConfigured: int32(len(sessions)),     //nolint:gosec // bounded by the BGPPeers of one node
		AnnouncedCount:     int32(len(announced)),    //nolint:gosec // bounded by the Services
		NotAnnouncedCount:  int32(len(notAnnounced)), //nolint:gosec // bounded by the Services
	}
	for _, s := range sessions {
		out := vipcastv1alpha1.SpeakerSession{
			Peer: s.Peer, Address: s.Address.String(), State: s.State, LastError: s.Reason,
			PrefixesSent: int32(s.Announced), //nolint:gosec // bounded by the Services
			BFD:          s.BFD, BFDDiagnostic: s.BFDDiag,
		}
		if !s.Since.IsZero() {
			out.Since = &metav1.Time{Time: s.Since.Truncate(time.Second)}
		}
		if s.Established() {
			st.SessionsEstablished++
			out.LastError = ""
		}
		st.Sessions = append(st.Sessions, out)
	}
	slices.SortFunc(st.Sessions, func(a, b vipcastv1alpha1.SpeakerSession) int { return cmp.Compare(a.Peer, b.Peer) })

	prefixes := slices.SortedFunc(slices.Values(announced), comparePrefix)
	for _, p := range prefixes[:min(len(prefixes), vipcastv1alpha1.MaxSpeakerStatusAnnounced)] {
		st.Announced = append(st.Announced, p.String())
	}

	// Services in key order, grouped by reason, up to the byte bound
	// (a name and its JSON quoting; a reason and its group's keys).
	byReason := map[string][]string{}
	budget := vipcastv1alpha1.MaxSpeakerStatusNotAnnouncedBytes
	for _, key := range slices.Sorted(maps.Keys(notAnnounced)) {
		why := notAnnounced[key]
		cost := len(key) + 3
		if _, ok := byReason[why]; !ok {
			cost += len(why) + 30
		}
		if budget -= cost; budget < 0 {
			break
		}
		byReason[why] = append(byReason[why], key)
	}
	for _, why := range slices.Sorted(maps.Keys(byReason)) {
		st.NotAnnounced = append(st.NotAnnounced, vipcastv1alpha1.NotAnnounced{Reason: why, Services: byReason[why]})
	}
	return st
}

// speakerStatus is what the writer is asked to write: the node it is for
// (its owner) and the status.
type speakerStatus struct {
	node   *v1.Node
	status vipcastv1alpha1.SpeakerStatusStatus
}

// statusWriter writes the node's SpeakerStatus: the latest status it was
// given, when it differs from what it last wrote, retrying with backoff.
type statusWriter struct {
	client dynamic.NamespaceableResourceInterface
	now    func() time.Time

	kick chan struct{}

	mu      sync.Mutex
	pending *speakerStatus
	last    *speakerStatus // the last one set

	writing sync.Mutex                           // one write at a time
	written *vipcastv1alpha1.SpeakerStatusStatus // under writing
	final   bool                                 // under writing: the stop is written, nothing after it
}

func newStatusWriter(dyn dynamic.Interface) *statusWriter {
	return &statusWriter{
		client: dyn.Resource(vipcastv1alpha1.SpeakerStatusesResource),
		now:    time.Now,
		kick:   make(chan struct{}, 1),
	}
}

// set hands the writer the status to write, replacing one not yet
// written.
func (w *statusWriter) set(node *v1.Node, st vipcastv1alpha1.SpeakerStatusStatus) {
	w.mu.Lock()
	w.pending = &speakerStatus{node: node, status: st}
	w.last = w.pending
	w.mu.Unlock()
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// run writes until ctx ends.
func (w *statusWriter) run(ctx context.Context) {
	retry := statusRetry
	failing := false
	var wait <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.kick:
		case <-wait:
		}
		w.mu.Lock()
		next := w.pending
		w.mu.Unlock()
		if next == nil {
			continue
		}
		if err := w.write(ctx, next, false); err != nil {
			if ctx.Err() != nil {
				return
			}
			// The first failure of a run is logged for everyone (an RBAC
			// refusal, say); the retries of an outage only at -v=2.
			logger := klog.FromContext(ctx)
			if !failing {
				logger.Error(err, "Writing this node's SpeakerStatus failed; retrying", "node", next.node.Name)
			} else {
				logger.V(2).Info("Writing this node's SpeakerStatus failed; retrying", "node", next.node.Name, "in", retry, "err", err)
			}
			failing = true
			wait = time.After(retry)
			retry = min(2*retry, statusRetryMax)
			continue
		}
		wait, retry, failing = nil, statusRetry, false
		w.mu.Lock()
		if w.pending == next {
			w.pending = nil
		}
		w.mu.Unlock()
	}
}

// stopped writes, once the speaker has closed its sessions, that it
// announces nothing and its sessions are Idle; nothing when it never set a
// status (it never synced).
func (w *statusWriter) stopped(ctx context.Context) error {
	w.mu.Lock()
	last := w.last
	w.mu.Unlock()
	if last == nil {
		return nil
	}
	st := vipcastv1alpha1.SpeakerStatusStatus{SessionsConfigured: last.status.SessionsConfigured}
	since := &metav1.Time{Time: w.now().Truncate(time.Second)}
	for _, s := range last.status.Sessions {
		st.Sessions = append(st.Sessions, vipcastv1alpha1.SpeakerSession{
			Peer: s.Peer, Address: s.Address, State: "Idle", Since: since, LastError: "vipcast-speaker stopped",
		})
	}
	return w.write(ctx, &speakerStatus{node: last.node, status: st}, true)
}

// write makes the node's SpeakerStatus hold want's status, creating the
// object (owned by the Node) if it does not exist.
// With final it is the stop's write; after it nothing is written.
func (w *statusWriter) write(ctx context.Context, want *speakerStatus, final bool) error {
	w.writing.Lock()
	defer w.writing.Unlock()
	if w.final {
		return nil
	}
	w.final = final
	if w.written != nil && reflect.DeepEqual(*w.written, want.status) {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, statusCallTimeout)
	defer cancel()
	name := want.node.Name
	cur, err := w.client.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		obj := &vipcastv1alpha1.SpeakerStatus{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if want.node.UID != "" {
			obj.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: name, UID: want.node.UID}}
		}
		u, convErr := toUnstructured(obj)
		if convErr != nil {
			return convErr
		}
		cur, err = w.client.Create(ctx, u, metav1.CreateOptions{})
	}
	if err != nil {
		return fmt.Errorf("reading or creating SpeakerStatus %s: %w", name, err)
	}
	var have vipcastv1alpha1.SpeakerStatus
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(cur.Object, &have); err != nil {
		return fmt.Errorf("decoding SpeakerStatus %s: %w", name, err)
	}
	st := want.status
	st.LastUpdateTime = have.Status.LastUpdateTime
	if !reflect.DeepEqual(have.Status, st) {
		st.LastUpdateTime = &metav1.Time{Time: w.now().Truncate(time.Second)}
		have.Status = st
		u, err := toUnstructured(&have)
		if err != nil {
			return err
		}
		if _, err := w.client.UpdateStatus(ctx, u, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("updating SpeakerStatus %s: %w", name, err)
		}
	}
	written := want.status
	w.written = &written
	return nil
}

func toUnstructured(obj *vipcastv1alpha1.SpeakerStatus) (*unstructured.Unstructured, error) {
	obj.APIVersion, obj.Kind = vipcastv1alpha1.SchemeGroupVersion.String(), "SpeakerStatus"
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, fmt.Errorf("encoding SpeakerStatus %s: %w", obj.Name, err)
	}
	return &unstructured.Unstructured{Object: m}, nil
}
