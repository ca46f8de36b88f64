package netns

import (
	"slices"
	"testing"
)

// TestDeadNamespaces: a namespace named vc<pid>-<role> is swept when its
// process is gone, never when it is alive or the caller's own, and names
// of any other shape are left alone.
func TestDeadNamespaces(t *testing.T) {
	list := "vc4242-tor (id: 1)\n" + // alive
		"vc4343-client (id: 0)\n" + // dead
		"vc100-node1\n" + // self
		"vc123456-vm\n" + // dead, past the old pid%100000 names
		"vcx-tor\n" + // not a pid
		"vc77\n" + // no role
		"vc78-\n" + // empty role
		"cni-1234-abcd\n" + // someone else's
		"\n"
	alive := func(pid int) bool { return pid == 4242 }
	got := deadNamespaces(list, 100, alive)
	want := []string{"vc4343-client", "vc123456-vm"}
	if !slices.Equal(got, want) {
		t.Errorf("deadNamespaces = %v, want %v", got, want)
	}
	if got := deadNamespaces(list, 100, func(int) bool { return true }); len(got) != 0 {
		t.Errorf("with every process alive: %v, want none", got)
	}
}
