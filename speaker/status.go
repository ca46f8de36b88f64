package speaker

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"time"
	"unicode/utf8"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/bgp"
	"github.com/vipcast/vipcast/lbclass"
)

// The node's SpeakerStatus: its sessions, how much it announces, and what
// its kernel refused. The worker goroutine computes it at most every
// statusCompute (keyStatus, queued with that delay after every change),
// and a writer goroutine writes it: at once when a session, a refusal or
// the served classes changed, otherwise (the counts, the sample of
// prefixes) at most every Options.StatusInterval with jitter. An API
// server that is slow or gone never holds up the dataplane or BGP.
const (
	statusCompute = 2 * time.Second
	// DefaultStatusInterval is the default Options.StatusInterval.
	DefaultStatusInterval = 30 * time.Second
	// statusJitter spreads the nodes' periodic writes: each waits the
	// interval plus up to this fraction of it more.
	statusJitter = 0.2
	// statusCallTimeout bounds each request of the status writer.
	statusCallTimeout = 10 * time.Second
	// statusRetry is the first wait after a failed write; it doubles up
	// to statusRetryMax while writes fail.
	statusRetry    = time.Second
	statusRetryMax = time.Minute
)

// BuildSpeakerStatus computes a node's SpeakerStatus from its sessions,
// the number of prefixes it announces and a sorted sample of them
// (at most MaxSpeakerStatusAnnounced are kept), the number of Services it
// announces no route for, the Services its kernel refused (by key, the
// kernel's reason) and the classes it serves. Its size does not depend on
// the number of Services: lists are bounded and messages cut at
// MaxSpeakerStatusMessage bytes; counts are exact. LastUpdateTime is left
// to the writer.
func BuildSpeakerStatus(sessions []bgp.SessionState, announced int, sample []netip.Prefix, notAnnounced int, refused map[string]string, classes lbclass.Selector) vipcastv1alpha1.SpeakerStatusStatus {
	st := vipcastv1alpha1.SpeakerStatusStatus{
		SessionsConfigured: int32(len(sessions)), //nolint:gosec // bounded by the BGPPeers of one node
		AnnouncedCount:     int32(announced),     //nolint:gosec // bounded by the Services
		NotAnnouncedCount:  int32(notAnnounced),  //nolint:gosec // bounded by the Services
		RefusedCount:       int32(len(refused)),  //nolint:gosec // bounded by the Services
		LoadBalancerClass:  classes.Class,
		ServesClassless:    !classes.NoClassless,
	}
	for _, s := range sessions {
		out := vipcastv1alpha1.SpeakerSession{
			Peer: s.Peer, Address: s.Address.String(), State: s.State, LastError: cut(s.Reason),
			PrefixesSent: int32(s.Announced), //nolint:gosec // bounded by the Services
			BFD:          s.BFD, BFDDiagnostic: cut(s.BFDDiag),
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
	st.Sessions = st.Sessions[:min(len(st.Sessions), vipcastv1alpha1.MaxSpeakerStatusSessions)]

	sample = slices.SortedFunc(slices.Values(sample), comparePrefix)
	for _, p := range sample[:min(len(sample), vipcastv1alpha1.MaxSpeakerStatusAnnounced)] {
		st.Announced = append(st.Announced, p.String())
	}
	keys := slices.Sorted(maps.Keys(refused))
	for _, key := range keys[:min(len(keys), vipcastv1alpha1.MaxSpeakerStatusRefused)] {
		st.Refused = append(st.Refused, vipcastv1alpha1.RefusedService{Service: key, Message: cut(refused[key])})
	}
	return st
}

// cut shortens s to MaxSpeakerStatusMessage bytes, on a rune boundary.
func cut(s string) string {
	const limit = vipcastv1alpha1.MaxSpeakerStatusMessage
	if len(s) <= limit {
		return s
	}
	s = s[:limit-len("…")]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "…"
}

// urgent reports whether the status b differs from a in what is written
// at once rather than with the periodic write: the sessions (their
// states, errors and BFD, not their prefix counts), the refusals, the
// served classes.
func urgent(a, b *vipcastv1alpha1.SpeakerStatusStatus) bool {
	sameSession := func(x, y vipcastv1alpha1.SpeakerSession) bool {
		x.PrefixesSent, y.PrefixesSent = 0, 0
		return reflect.DeepEqual(x, y)
	}
	return a.SessionsConfigured != b.SessionsConfigured || a.SessionsEstablished != b.SessionsEstablished ||
		!slices.EqualFunc(a.Sessions, b.Sessions, sameSession) ||
		a.RefusedCount != b.RefusedCount || !slices.Equal(a.Refused, b.Refused) ||
		a.LoadBalancerClass != b.LoadBalancerClass || a.ServesClassless != b.ServesClassless
}

// speakerStatus is what the writer is asked to write: the node it is for
// (its owner) and the status.
type speakerStatus struct {
	node   *v1.Node
	status vipcastv1alpha1.SpeakerStatusStatus
}

// statusWriter writes the node's SpeakerStatus: the latest status it was
// given, when it differs from what it last wrote — at once when urgent,
// else once the interval (with jitter) since the last write has passed —
// retrying with backoff. Each write is one patch of the status
// subresource; the object is created (owned by the Node) when the patch
// finds none.
type statusWriter struct {
	client   dynamic.NamespaceableResourceInterface
	clock    clock.Clock
	interval time.Duration

	kick chan struct{}

	mu      sync.Mutex
	pending *speakerStatus
	last    *speakerStatus // the last one set

	writing   sync.Mutex                           // one write at a time
	written   *vipcastv1alpha1.SpeakerStatusStatus // under writing
	nextWrite time.Time                            // under writing: the periodic write's time
	final     bool                                 // under writing: the stop is written, nothing after it
}

func newStatusWriter(dyn dynamic.Interface, interval time.Duration, clk clock.Clock) *statusWriter {
	return &statusWriter{
		client:   dyn.Resource(vipcastv1alpha1.SpeakerStatusesResource),
		clock:    clk,
		interval: interval,
		kick:     make(chan struct{}, 1),
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

// due returns when next may be written: now when it is the first, urgent,
// or nothing was written for the interval; never (ok false) when it is
// what was last written.
func (w *statusWriter) due(next *speakerStatus) (at time.Time, ok bool) {
	w.writing.Lock()
	defer w.writing.Unlock()
	switch {
	case w.final || (w.written != nil && reflect.DeepEqual(*w.written, next.status)):
		return time.Time{}, false
	case w.written == nil || urgent(w.written, &next.status):
		return w.clock.Now(), true
	}
	return w.nextWrite, true
}

// run writes until ctx ends.
func (w *statusWriter) run(ctx context.Context) {
	retry := statusRetry
	failing := false
	var backoff time.Time // no write before, while failing
	timer := w.clock.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.kick:
		case <-timer.C():
		}
		w.mu.Lock()
		next := w.pending
		w.mu.Unlock()
		if next == nil {
			continue
		}
		at, ok := w.due(next)
		if !ok {
			w.done(next)
			continue
		}
		if failing && at.Before(backoff) {
			at = backoff
		}
		if wait := at.Sub(w.clock.Now()); wait > 0 {
			timer.Reset(wait)
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
			backoff = w.clock.Now().Add(retry)
			timer.Reset(retry)
			retry = min(2*retry, statusRetryMax)
			continue
		}
		retry, failing = statusRetry, false
		w.done(next)
	}
}

// done drops next from pending unless a newer status replaced it.
func (w *statusWriter) done(next *speakerStatus) {
	w.mu.Lock()
	if w.pending == next {
		w.pending = nil
	}
	w.mu.Unlock()
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
	st := vipcastv1alpha1.SpeakerStatusStatus{
		SessionsConfigured: last.status.SessionsConfigured,
		LoadBalancerClass:  last.status.LoadBalancerClass,
		ServesClassless:    last.status.ServesClassless,
	}
	since := &metav1.Time{Time: w.clock.Now().Truncate(time.Second)}
	for _, s := range last.status.Sessions {
		st.Sessions = append(st.Sessions, vipcastv1alpha1.SpeakerSession{
			Peer: s.Peer, Address: s.Address, State: "Idle", Since: since, LastError: StoppedReason,
		})
	}
	return w.write(ctx, &speakerStatus{node: last.node, status: st}, true)
}

// StoppedReason is the lastError of every session in the status a speaker
// writes when it stops.
const StoppedReason = "vipcast-speaker stopped"

// write makes the node's SpeakerStatus hold want's status with one patch
// of the status subresource, creating the object (owned by the Node) when
// it does not exist. With final it is the stop's write; after it nothing
// is written.
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
	st := want.status
	now := w.clock.Now()
	st.LastUpdateTime = &metav1.Time{Time: now.Truncate(time.Second)}
	// A JSON patch that adds /status replaces the whole status (lists and
	// fields left out included), whether or not the object has one yet.
	patch, err := json.Marshal([]any{map[string]any{"op": "add", "path": "/status", "value": st}})
	if err != nil {
		return fmt.Errorf("encoding SpeakerStatus %s: %w", name, err)
	}
	_, err = w.client.Patch(ctx, name, types.JSONPatchType, patch, metav1.PatchOptions{}, "status")
	if apierrors.IsNotFound(err) {
		obj := &vipcastv1alpha1.SpeakerStatus{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if want.node.UID != "" {
			obj.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: name, UID: want.node.UID}}
		}
		u, convErr := toUnstructured(obj)
		if convErr != nil {
			return convErr
		}
		if _, err = w.client.Create(ctx, u, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating SpeakerStatus %s: %w", name, err)
		}
		_, err = w.client.Patch(ctx, name, types.JSONPatchType, patch, metav1.PatchOptions{}, "status")
	}
	if err != nil {
		return fmt.Errorf("patching SpeakerStatus %s: %w", name, err)
	}
	written := want.status
	w.written = &written
	w.nextWrite = now.Add(wait.Jitter(w.interval, statusJitter))
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
