//go:build kernel

package speaker

import (
	"time"

	"github.com/vipcast/vipcast/test/vm"
)

// kernelSuite runs the package's kernel tests in one VM, each with a
// dataplane in namespaces of its own.
var kernelSuite = vm.NewSuite(vm.Options{Timeout: 8 * time.Minute}, "TestControllerKernel", "TestControllerKernelBadService")
