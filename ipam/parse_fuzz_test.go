package ipam

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// FuzzParseAddresses feeds ParseAddresses a list of arbitrary entries (the
// fuzzer's string split at "|"): it never panics and is deterministic. On
// success it returns one range per entry, in the order given, each equal
// to the entry parsed alone, of one family, First <= Last, containing its
// ends, without zone, with no end written in IPv4-mapped form (a CIDR
// such as ::/80 may end among the mapped addresses), that round-trips through
// String, and no two ranges overlap. On failure the error is an *Error
// whose message starts with the index and the quoted text of the entry at
// fault: for ReasonInvalid the first entry that does not parse alone, for
// ReasonOverlap two entries that parse alone and overlap, both named.
func FuzzParseAddresses(f *testing.F) {
	for _, s := range []string{
		"",
		"192.168.10.0/24",
		"2001:db8::/64|10.0.0.5-10.0.0.20",
		" 10.0.0.0/24 | 2001:db8::10 - 2001:db8::ff ",
		"10.0.0.9-10.0.0.1",
		"10.0.0.1",
		"10.0.0.1/24",
		"10.0.0.0/33",
		"fe80::1%eth0/128",
		"fe80::1%eth0-fe80::2",
		"::ffff:10.0.0.1/128",
		"::ffff:10.0.0.1-::ffff:10.0.0.9",
		"10.0.0.1-2001:db8::1",
		"10.0.0.5-10.0.0.1-10.0.0.9",
		"10.0.0.0/24|10.0.0.128/25",
		"10.0.0.0/24|2001:db8::/120|10.0.1.0/24|10.0.0.255-10.0.1.0",
		"0.0.0.0/0|::/0",
		"::fffe:ffff:ffff-::1:0:0:1",
		"::/80",
		"bogus|10.0.0.0/24",
		"10.0.0.0/24||10.0.1.0/24",
		"-",
		"/",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, joined string) {
		entries := strings.Split(joined, "|")
		rs, err := ParseAddresses(entries)
		rs2, err2 := ParseAddresses(entries)
		if !reflect.DeepEqual(rs, rs2) || fmt.Sprint(err) != fmt.Sprint(err2) {
			t.Fatalf("ParseAddresses(%q) is not deterministic: %v, %v then %v, %v", entries, rs, err, rs2, err2)
		}
		if err != nil {
			checkParseError(t, entries, rs, err)
			return
		}
		if len(rs) != len(entries) {
			t.Fatalf("ParseAddresses(%q) returned %d ranges for %d entries", entries, len(rs), len(entries))
		}
		for i, r := range rs {
			checkParsedRange(t, entries[i], r)
			alone, err := ParseAddresses([]string{entries[i]})
			if err != nil || len(alone) != 1 || alone[0] != r {
				t.Fatalf("addresses[%d] %q parses to %v in the list but to %v, %v alone", i, entries[i], r, alone, err)
			}
			for j, o := range rs[:i] {
				if r.Overlaps(o) {
					t.Fatalf("ParseAddresses(%q) accepted overlapping entries %d (%v) and %d (%v)", entries, j, o, i, r)
				}
			}
		}
	})
}

// checkParsedRange checks one range ParseAddresses returned for entry.
func checkParsedRange(t *testing.T, entry string, r Range) {
	t.Helper()
	switch {
	case !r.First.IsValid() || !r.Last.IsValid():
		t.Fatalf("%q: invalid range %v", entry, r)
	case r.First.Is4() != r.Last.Is4():
		t.Fatalf("%q: range %v mixes families", entry, r)
	case r.Last.Less(r.First):
		t.Fatalf("%q: range %v ends before it starts", entry, r)
	case r.First.Zone() != "" || r.Last.Zone() != "":
		t.Fatalf("%q: range %v has a zone", entry, r)
	case r.First.Is4In6():
		t.Fatalf("%q: range %v starts at an IPv4-mapped address", entry, r)
	case r.Last.Is4In6() && strings.Contains(entry, "-"):
		// A CIDR such as ::/80 may end among the mapped addresses; a
		// range's ends are both written, and neither may be mapped.
		t.Fatalf("%q: range %v ends at an IPv4-mapped address", entry, r)
	case !r.Contains(r.First) || !r.Contains(r.Last):
		t.Fatalf("%q: range %v does not contain its ends", entry, r)
	case r.Size().Sign() <= 0:
		t.Fatalf("%q: range %v has size %v", entry, r, r.Size())
	}
	back, err := ParseAddresses([]string{r.String()})
	if err != nil || len(back) != 1 || back[0] != r {
		t.Fatalf("%q: range %v does not round-trip through %q: %v, %v", entry, r, r.String(), back, err)
	}
}

// checkParseError checks the error ParseAddresses returned for entries.
func checkParseError(t *testing.T, entries []string, rs []Range, err error) {
	t.Helper()
	if rs != nil {
		t.Fatalf("ParseAddresses(%q) returned ranges %v with error %v", entries, rs, err)
	}
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("ParseAddresses(%q): error %v (%T) is not an *Error", entries, err, err)
	}
	parsesAlone := func(i int) bool {
		_, err := ParseAddresses([]string{entries[i]})
		return err == nil
	}
	named := func(i int) string { return fmt.Sprintf("addresses[%d] %q", i, entries[i]) }
	switch e.Reason {
	case ReasonInvalid:
		// The first entry that does not parse alone is the one named.
		bad := -1
		for i := range entries {
			if !parsesAlone(i) {
				bad = i
				break
			}
		}
		if bad < 0 {
			t.Fatalf("ParseAddresses(%q): %v, but every entry parses alone", entries, err)
		}
		if !strings.HasPrefix(e.Msg, named(bad)+": ") {
			t.Fatalf("ParseAddresses(%q): message %q does not start with %s", entries, e.Msg, named(bad))
		}
	case ReasonOverlap:
		var alone []Range
		for i := range entries {
			r, err := ParseAddresses([]string{entries[i]})
			if err != nil {
				t.Fatalf("ParseAddresses(%q): %v, but %s does not parse: %v", entries, e.Msg, named(i), err)
			}
			alone = append(alone, r[0])
		}
		// The message names two overlapping entries, the lower index first.
		for i := range entries {
			if !strings.HasPrefix(e.Msg, named(i)+" overlaps ") {
				continue
			}
			for j := i + 1; j < len(entries); j++ {
				if strings.Contains(e.Msg, " overlaps "+named(j)+";") && alone[i].Overlaps(alone[j]) {
					return
				}
			}
		}
		t.Fatalf("ParseAddresses(%q): overlap message %q does not name two overlapping entries", entries, e.Msg)
	default:
		t.Fatalf("ParseAddresses(%q): unexpected reason %q: %v", entries, e.Reason, err)
	}
}
