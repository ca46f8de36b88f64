package ccm

import (
	"maps"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"
)

// speakerStatusObj is a SpeakerStatus of node with sessions peer → state,
// and a long announced list that the CCM's cache must not keep.
func speakerStatusObj(node string, sessions map[string]string) *unstructured.Unstructured {
	var ss []any
	for _, p := range slices.Sorted(maps.Keys(sessions)) {
		ss = append(ss, map[string]any{"peer": p, "address": "10.0.0.254", "state": sessions[p], "prefixesSent": int64(3)})
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "vipcast.io/v1alpha1", "kind": "SpeakerStatus",
		"metadata": map[string]any{"name": node, "resourceVersion": "7", "ownerReferences": []any{map[string]any{"kind": "Node"}}},
		"status":   map[string]any{"sessions": ss, "announced": []any{"10.0.0.1/32", "10.0.0.2/32"}, "announcedCount": int64(2)},
	}}
}

func TestSessionCounts(t *testing.T) {
	slim := func(u *unstructured.Unstructured) any {
		out, err := slimSpeakerStatus(u)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	a := slim(speakerStatusObj("a", map[string]string{"tor-1": "Established", "tor-2": "Active"}))
	b := slim(speakerStatusObj("b", map[string]string{"tor-1": "Established"}))
	c := slim(speakerStatusObj("c", map[string]string{"tor-1": "Established", "tor-2": "Established"})) // not Ready
	if _, kept := a.(*unstructured.Unstructured).Object["status"].(map[string]any)["announced"]; kept {
		t.Error("the cache keeps the announced prefixes; it needs only the sessions")
	}
	if got := peerSessions(a); len(got) != 2 || !got["tor-1"] || got["tor-2"] {
		t.Errorf("peerSessions of the slim object = %v, want tor-1 up, tor-2 down", got)
	}
	ready := func(n string) bool { return n != "c" }
	for _, tc := range []struct {
		peer               string
		nodes, established int32
	}{
		{"tor-1", 2, 2},
		{"tor-2", 1, 0},
		{"rr", 0, 0},
	} {
		if n, e := countSessions([]any{a, b, c}, ready, tc.peer); n != tc.nodes || e != tc.established {
			t.Errorf("%s: %d nodes, %d established; want %d, %d", tc.peer, n, e, tc.nodes, tc.established)
		}
	}
	// A tombstone counts by its last state.
	if got := peerSessions(cache.DeletedFinalStateUnknown{Key: "b", Obj: b}); !got["tor-1"] {
		t.Errorf("tombstone: %v", got)
	}
}

func TestChangedPeers(t *testing.T) {
	for _, tc := range []struct {
		name     string
		old, cur map[string]bool
		want     []string
	}{
		{"created", nil, map[string]bool{"a": true}, []string{"a"}},
		{"deleted", map[string]bool{"a": false}, nil, []string{"a"}},
		{"came up", map[string]bool{"a": false, "b": true}, map[string]bool{"a": true, "b": true}, []string{"a"}},
		{"removed and added", map[string]bool{"a": true}, map[string]bool{"b": true}, []string{"a", "b"}},
		{"nothing", map[string]bool{"a": true}, map[string]bool{"a": true}, nil},
	} {
		got := changedPeers(tc.old, tc.cur)
		slices.Sort(got)
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
