//go:build kernel

package ipvs

import (
	"time"

	"github.com/vipcast/vipcast/test/vm"
)

// kernelSuite runs the package's kernel tests in one VM with the two-tier
// modules (IPVS, ipip, sit, ip6_tunnel, nftables), each test in namespaces
// of its own. Two keep a VM of their own: TestKernelPrepareNode needs one
// without ip_vs loaded at boot, and TestECMPMove's path-MTU black hole
// (TwoTier, IPv6/IP6IP6: without the MSS clamp and with ICMP dropped, large
// messages must not arrive) is not there in a kernel where
// TestSchedulerConsistency ran first, so it needs a fresh kernel.
var kernelSuite = vm.NewSuite(twoTierVMOptions(vm.Options{Timeout: 15 * time.Minute}),
	"TestKernel", "TestSchedulerConsistency", "TestKernelTwoTier", "TestKernelTier1Order",
	"TestKernelTeardown", "TestKernelTunnelGuard", "TestKernelEntryDefence", "TestKernelHostGuard")
