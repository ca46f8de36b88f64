package ipvs

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// interruptedList is a list func that answers like netlink does when the
// kernel interrupts a dump: partial results with netlink.ErrDumpInterrupted,
// interrupted times, then full. It counts its calls.
type interruptedList struct {
	interrupted int
	full        []int
	calls       int
}

func (l *interruptedList) list() ([]int, error) {
	l.calls++
	if l.calls <= l.interrupted {
		return l.full[:l.calls%len(l.full)], netlink.ErrDumpInterrupted
	}
	return slices.Clone(l.full), nil
}

func TestDumpRetriesInterruptedDumps(t *testing.T) {
	for interrupted := range dumpAttempts {
		l := &interruptedList{interrupted: interrupted, full: []int{1, 2, 3}}
		got, err := dump("numbers", l.list)
		if err != nil {
			t.Fatalf("%d interrupted dumps: %v", interrupted, err)
		}
		if !slices.Equal(got, l.full) {
			t.Errorf("%d interrupted dumps: got %v, want the complete %v", interrupted, got, l.full)
		}
		if l.calls != interrupted+1 {
			t.Errorf("%d interrupted dumps: %d calls, want %d", interrupted, l.calls, interrupted+1)
		}
	}
}

func TestDumpGivesUpOnAListThatKeepsChanging(t *testing.T) {
	l := &interruptedList{interrupted: 1000, full: []int{1, 2, 3}}
	got, err := dump("addresses of vcip6tnl", l.list)
	if err == nil {
		t.Fatalf("no error after %d interrupted dumps; got %v", l.calls, got)
	}
	if got != nil {
		t.Errorf("partial results %v returned with the error", got)
	}
	if l.calls != dumpAttempts {
		t.Errorf("%d calls, want %d", l.calls, dumpAttempts)
	}
	if msg := err.Error(); !strings.HasPrefix(msg, "addresses of vcip6tnl: ") || !strings.Contains(msg, "kept changing") {
		t.Errorf("error %q does not name the dump and say it kept changing", msg)
	}
	if !errors.Is(err, netlink.ErrDumpInterrupted) {
		t.Errorf("error %q does not match netlink.ErrDumpInterrupted", err)
	}
}

func TestDumpReturnsOtherErrorsAtOnce(t *testing.T) {
	calls := 0
	got, err := dump("routing rules", func() ([]int, error) {
		calls++
		return []int{1}, unix.EPERM
	})
	if calls != 1 {
		t.Errorf("%d calls, want 1: only an interrupted dump is tried again", calls)
	}
	if got != nil {
		t.Errorf("results %v returned with the error", got)
	}
	if !errors.Is(err, unix.EPERM) || !strings.HasPrefix(err.Error(), "routing rules: ") {
		t.Errorf("error %v, want EPERM wrapped with the dump's name", err)
	}
}
