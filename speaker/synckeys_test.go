package speaker

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"

	"github.com/vipcast/vipcast/ipvs"
)

// TestWatchSyncKeys: a key added to the mounted Secret is taken without a
// restart, and signs from then on; a key file made invalid leaves the keys
// in force.
func TestWatchSyncKeys(t *testing.T) {
	dir := t.TempDir()
	write := func(name, key string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(key), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("1", strings.Repeat("a", 64))
	write("..data", "kubelet's link, skipped")
	keys, err := ipvs.LoadSyncKeys(dir)
	if err != nil || keys.SendID() != 1 || keys.Len() != 1 {
		t.Fatalf("LoadSyncKeys: %d keys, send ID %d, %v; want 1, 1", keys.Len(), keys.SendID(), err)
	}
	_, tctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(tctx)
	rec := &fakeDataplane{}
	done := make(chan struct{})
	go func() { WatchSyncKeys(ctx, dir, keys, rec, 10*time.Millisecond); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	wait := func(what string, cond func(ipvs.SyncKeys, int) bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for k, n := rec.lastKeys(); !cond(k, n); k, n = rec.lastKeys() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: last keys %d, send ID %d, after %d changes", what, k.Len(), k.SendID(), n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	write("2", strings.Repeat("b", 64))
	wait("a second key added", func(k ipvs.SyncKeys, n int) bool { return n == 1 && k.Len() == 2 && k.SendID() == 2 })
	write("3", "short") // not a valid key: the two stay
	time.Sleep(100 * time.Millisecond)
	if k, n := rec.lastKeys(); n != 1 || k.SendID() != 2 {
		t.Errorf("after an invalid key file: %d changes, send ID %d; want the keys in force kept", n, k.SendID())
	}
	if err := os.Remove(filepath.Join(dir, "3")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "1")); err != nil {
		t.Fatal(err)
	}
	wait("the old key removed", func(k ipvs.SyncKeys, n int) bool { return n == 2 && k.Len() == 1 && k.SendID() == 2 })
}
