//go:build controlplane

package controlplane_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vipcast/vipcast/test/controlplane"
)

// TestStart checks that the harness brings up a working API server: the
// namespaces the API server creates itself appear and the version is the
// one test/tools builds.
func TestStart(t *testing.T) {
	cp := controlplane.Start(t)
	v, err := cp.Client.Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("server version: %v", err)
	}
	if v.GitVersion != controlplane.KubernetesVersion {
		t.Fatalf("server version %q, want %q", v.GitVersion, controlplane.KubernetesVersion)
	}
	if _, err := cp.Client.CoreV1().Namespaces().Get(context.Background(), "default", metav1.GetOptions{}); err != nil {
		t.Fatalf("default namespace: %v", err)
	}
}

// TestStartNice: with Options.Nice every component and every thread of it
// runs at that nice value (the real cluster's control plane shares the
// CPU with its VMs as an equal, test/lab).
func TestStartNice(t *testing.T) {
	const nice = 7
	cp := controlplane.StartWith(t, controlplane.Options{Nice: nice})
	pids := cp.Pids()
	if len(pids) != 2 {
		t.Fatalf("running components: %v, want etcd and kube-apiserver", pids)
	}
	for _, pid := range pids {
		tasks, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "task"))
		if err != nil {
			t.Fatal(err)
		}
		for _, task := range tasks {
			stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "task", task.Name(), "stat"))
			if err != nil {
				continue // the thread exited
			}
			// The fields after the command name (which ends with ")"):
			// nice is the 19th field of the line, the 17th after it.
			fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
			if len(fields) < 17 || fields[16] != strconv.Itoa(nice) {
				t.Errorf("thread %s of component %d: stat %q, want nice %d", task.Name(), pid, stat, nice)
			}
		}
	}
}
