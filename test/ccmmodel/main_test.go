//go:build controlplane

// Package ccmmodel is the randomized model-based test of vipcast-ccm
// against the real API server (TestCCMModel) and the seeds it once failed
// on (TestCCMModelRegression). It is a package of its own so that go test
// runs it beside test/e2e's tests rather than after them: its steps wait
// mostly on the CCM's queues, and go test starts a package's parallel
// tests only once its serial ones are done.
package ccmmodel

import (
	"fmt"
	"os"
	"testing"

	"github.com/vipcast/vipcast/test/ccmtest"
)

// ccmBinary is vipcast-ccm, built once by TestMain.
var ccmBinary string

// TestMain builds vipcast-ccm once and runs the tests.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "vipcast-ccmmodel-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := ccmtest.Build(dir, "github.com/vipcast/vipcast/cmd/vipcast-ccm"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		_ = os.RemoveAll(dir)
		os.Exit(1)
	}
	ccmBinary = dir + "/vipcast-ccm"
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}
