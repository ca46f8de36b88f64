//go:build kernel

package ipvs

import (
	"strconv"
	"testing"
	"time"

	"github.com/vipcast/vipcast/test/vm"
)

// TestKernelEntryDefence: with the two tiers, sloppy_tcp lets one spoofed
// TCP ACK to a VIP create an IPVS entry (ESTABLISHED, 900 s, as a real
// mid-flow pickup after an ECMP move needs). What bounds them is the
// kernel's entry defence, which New turns on in its automatic mode
// (drop_entry 1): once the node's available memory is below
// net.ipv4.vs.amemthresh (forced here by raising the threshold above any
// memory), the kernel switches it on (drop_entry reads 2) and drops old
// entries that carried few packets. Without vipcast's setting it stays off
// (0) whatever the memory.
func TestKernelEntryDefence(t *testing.T) {
	if !vm.InVM() {
		kernelSuite.Run(t)
		return
	}
	f := newMoveFabric(t)
	for n := range f.nodes {
		twoTierNode(t, f, n)
	}
	if got := nsSysctl(t, f.nodes[0], "net/ipv4/vs/drop_entry"); got != "1" {
		t.Errorf("drop_entry = %s after New with the two tiers, want 1 (automatic)", got)
	}
	nsSysctls(t, f.nodes[0], map[string]string{"net/ipv4/vs/amemthresh": strconv.Itoa(1 << 30)})
	defer nsSysctls(t, f.nodes[0], map[string]string{"net/ipv4/vs/amemthresh": "1024"})
	// The kernel looks at the available memory once a second.
	var got string
	for range 10 {
		if got = nsSysctl(t, f.nodes[0], "net/ipv4/vs/drop_entry"); got == "2" {
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Errorf("available memory below amemthresh: drop_entry = %s after 5 s, want 2 (the defence on)", got)
}
