package speaker

import (
	"context"
	"time"

	"k8s.io/klog/v2"

	"github.com/vipcast/vipcast/ipvs"
)

// SyncKeySetter takes the keys of the connection sync relay
// (ipvs.Dataplane.SetSyncKeys).
type SyncKeySetter interface {
	SetSyncKeys(ipvs.SyncKeys)
}

// WatchSyncKeys reads the connection sync relay's keys from dir (a mounted
// Secret, see ipvs.LoadSyncKeys) every interval until ctx ends, and gives
// them to dp whenever they change: a key added to or removed from the
// Secret takes effect without a restart, once the kubelet has updated the
// mounted files. keys are those in force at the start. A directory that
// no longer reads, or a key that is not valid, is logged and leaves the
// keys in force as they were: nothing is taken away for bad input.
func WatchSyncKeys(ctx context.Context, dir string, keys ipvs.SyncKeys, dp SyncKeySetter, interval time.Duration) {
	logger := klog.FromContext(ctx).WithValues("dir", dir)
	t := time.NewTicker(interval)
	defer t.Stop()
	var lastErr string
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		k, err := ipvs.LoadSyncKeys(dir)
		if err != nil {
			if err.Error() != lastErr {
				logger.Error(err, "Cannot read the connection sync keys; keeping the keys in force", "sendKeyID", keys.SendID())
				lastErr = err.Error()
			}
			continue
		}
		lastErr = ""
		if k.Equal(keys) {
			continue
		}
		dp.SetSyncKeys(k)
		logger.Info("Connection sync keys changed", "keys", k.Len(), "sendKeyID", k.SendID(), "previousSendKeyID", keys.SendID())
		keys = k
	}
}
