package ccm

import (
	"reflect"
	"testing"
)

// newTestAnnotator returns a poolAnnotator without clients whose queue is
// shut down when the test ends.
func newTestAnnotator(t *testing.T) *poolAnnotator {
	t.Helper()
	a := newPoolAnnotator(nil, nil)
	t.Cleanup(a.queue.ShutDown)
	return a
}

// pendingOf returns a copy of a's pending annotations.
func pendingOf(a *poolAnnotator) map[string]string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := map[string]string{}
	for k, v := range a.pending {
		out[k] = v
	}
	return out
}

func TestPoolAnnotatorBookkeeping(t *testing.T) {
	// op is one record or done call.
	type op struct {
		done      bool
		key, pool string
	}
	record := func(key, pool string) op { return op{key: key, pool: pool} }
	done := func(key, pool string) op { return op{done: true, key: key, pool: pool} }

	tests := []struct {
		name    string
		ops     []op
		want    map[string]string
		wantLen int // queued keys
	}{
		{
			name:    "record then done forgets",
			ops:     []op{record("shop/web", "gold"), done("shop/web", "gold")},
			want:    map[string]string{},
			wantLen: 1,
		},
		{
			name:    "done with an older pool keeps the newer record",
			ops:     []op{record("shop/web", "gold"), record("shop/web", "silver"), done("shop/web", "gold")},
			want:    map[string]string{"shop/web": "silver"},
			wantLen: 1,
		},
		{
			name:    "done with the newer pool forgets",
			ops:     []op{record("shop/web", "gold"), record("shop/web", "silver"), done("shop/web", "silver")},
			want:    map[string]string{},
			wantLen: 1,
		},
		{
			name:    "done for another key keeps the record",
			ops:     []op{record("shop/web", "gold"), record("shop/api", "gold"), done("shop/api", "gold")},
			want:    map[string]string{"shop/web": "gold"},
			wantLen: 2,
		},
		{
			name: "done without record is a no-op",
			ops:  []op{done("shop/web", "gold")},
			want: map[string]string{},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := newTestAnnotator(t)
			for _, o := range tc.ops {
				if o.done {
					a.done(o.key, o.pool)
				} else {
					a.record(o.key, o.pool)
				}
			}
			if got := pendingOf(a); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("pending = %v, want %v", got, tc.want)
			}
			if got := a.queue.Len(); got != tc.wantLen {
				t.Errorf("queue length = %d, want %d", got, tc.wantLen)
			}
		})
	}
}
