//go:build controlplane

package controlplane_test

import (
	"context"
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
