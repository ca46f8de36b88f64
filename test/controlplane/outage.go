package controlplane

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/vipcast/vipcast/test/proc"
)

// apiServerIndex is kube-apiserver's place in procs (after etcd).
const apiServerIndex = 1

// apiServer returns the kube-apiserver process.
func (cp *ControlPlane) apiServer() (*proc.Process, error) {
	if len(cp.procs) <= apiServerIndex {
		return nil, errors.New("kube-apiserver is not running")
	}
	return cp.procs[apiServerIndex], nil
}

// PauseAPIServer freezes kube-apiserver (SIGSTOP): its connections stay
// open and nothing answers, as with a hung server. ResumeAPIServer thaws it.
func (cp *ControlPlane) PauseAPIServer() error {
	h, err := cp.apiServer()
	if err != nil {
		return err
	}
	h.Signal(syscall.SIGSTOP)
	return nil
}

// ResumeAPIServer thaws a paused kube-apiserver and waits until it is ready.
func (cp *ControlPlane) ResumeAPIServer() error {
	h, err := cp.apiServer()
	if err != nil {
		return err
	}
	h.Signal(syscall.SIGCONT)
	return waitReady(cp.apiURL, cp.Token, 60*time.Second)
}

// KillAPIServer kills kube-apiserver (SIGKILL): its connections are reset
// and its port refuses new ones; etcd keeps the data. RestartAPIServer
// starts it again.
func (cp *ControlPlane) KillAPIServer() error {
	h, err := cp.apiServer()
	if err != nil {
		return err
	}
	h.Kill()
	return nil
}

// RestartAPIServer starts a killed kube-apiserver again with the same
// command line (port, credentials, etcd) and waits until it is ready.
func (cp *ControlPlane) RestartAPIServer() error {
	if h, err := cp.apiServer(); err != nil || !h.Exited() {
		return errors.New("kube-apiserver is still running (or was never started): kill it first")
	}
	p, err := cp.startLogged("kube-apiserver", filepath.Join(BinDir(), "kube-apiserver"), cp.apiArgs...)
	if err != nil {
		return err
	}
	cp.procs[apiServerIndex] = p
	return waitReady(cp.apiURL, cp.Token, 60*time.Second)
}

// CompactEtcd compacts etcd's history up to its current revision, through
// etcd's JSON gateway, so that every watch resuming from an older
// resourceVersion is answered "too old" and its client lists again. It
// returns the revision compacted to.
func (cp *ControlPlane) CompactEtcd(ctx context.Context) (int64, error) {
	var rng struct {
		Header struct {
			Revision string `json:"revision"`
		} `json:"header"`
	}
	// Any range read returns the store's current revision in its header.
	if err := etcdPost(ctx, cp.EtcdURL+"/v3/kv/range", map[string]any{"key": "AA=="}, &rng); err != nil {
		return 0, err
	}
	rev, err := strconv.ParseInt(rng.Header.Revision, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("etcd revision %q: %w", rng.Header.Revision, err)
	}
	if err := etcdPost(ctx, cp.EtcdURL+"/v3/kv/compaction", map[string]any{"revision": strconv.FormatInt(rev, 10), "physical": true}, nil); err != nil {
		return 0, err
	}
	return rev, nil
}

// etcdPost sends one JSON request to etcd's gateway and decodes the answer
// into out (when not nil).
func etcdPost(ctx context.Context, url string, body, out any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return fmt.Errorf("etcd %s: %w", url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("etcd %s: %s", url, resp.Status)
	}
	if out == nil {
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(out)
}
