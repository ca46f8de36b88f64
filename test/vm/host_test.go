package vm

// The tests of the harness's own logic: they need no kernel, no VM and
// nothing from the cache, so they run in the unit tier.

import (
	"bytes"
	"runtime/debug"
	"slices"
	"strconv"
	"testing"
)

// parseCPIO reads back a newc archive: name -> (mode, data).
func parseCPIO(t *testing.T, b []byte) map[string][2]any {
	t.Helper()
	out := map[string][2]any{}
	off := 0
	field := func(i int) uint64 {
		v, err := strconv.ParseUint(string(b[off+6+8*i:off+14+8*i]), 16, 32)
		if err != nil {
			t.Fatalf("bad header at %d: %v", off, err)
		}
		return v
	}
	for {
		if string(b[off:off+6]) != "070701" {
			t.Fatalf("bad magic at %d", off)
		}
		mode, size, nameSize := field(1), field(6), field(11)
		name := string(b[off+110 : off+110+int(nameSize)-1])
		off = (off + 110 + int(nameSize) + 3) &^ 3
		if name == "TRAILER!!!" {
			if off != len(b) {
				t.Fatalf("trailer at %d, archive is %d bytes", off, len(b))
			}
			return out
		}
		out[name] = [2]any{mode, string(b[off : off+int(size)])}
		off = (off + int(size) + 3) &^ 3
	}
}

func TestCPIO(t *testing.T) {
	var buf bytes.Buffer
	w := newCPIOWriter(&buf)
	w.CharDev("dev/console", 0o600, 5, 1)
	w.File("/vm/args", 0o644, []byte("a\x00bc"))
	w.File("vm/modules/x.ko", 0o644, []byte("12345"))
	w.Symlink("sbin/modprobe", "/init")
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	got := parseCPIO(t, buf.Bytes())
	want := map[string][2]any{
		"dev":             {uint64(0o040755), ""},
		"dev/console":     {uint64(0o020600), ""},
		"vm":              {uint64(0o040755), ""},
		"vm/args":         {uint64(0o100644), "a\x00bc"},
		"vm/modules":      {uint64(0o040755), ""},
		"vm/modules/x.ko": {uint64(0o100644), "12345"},
		"sbin":            {uint64(0o040755), ""},
		"sbin/modprobe":   {uint64(0o120777), "/init"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: got %v, want %v", k, got[k], v)
		}
	}
}

func TestRunPattern(t *testing.T) {
	if got, want := runPattern("TestA/b.c"), `^TestA$/^b\.c$`; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestAptSources(t *testing.T) {
	deb822 := parseDeb822Sources(`Types: deb deb-src
# a comment
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main contrib
Signed-By: /usr/share/keyrings/k.gpg

Types: deb
URIs: http://off.example/debian
Suites: bookworm
Components: main
Enabled: no

Types: deb
URIs: http://inline.example/debian
Suites: trixie
Components: main
Signed-By:
 -----BEGIN PGP PUBLIC KEY BLOCK-----
 .
 -----END PGP PUBLIC KEY BLOCK-----
`)
	if len(deb822) != 2 {
		t.Fatalf("deb822: got %d sources, want 2 (the disabled one left out): %+v", len(deb822), deb822)
	}
	if s := deb822[0]; s.uris[0] != "http://mirror.example/debian" || s.suites[0] != "bookworm" ||
		s.components[1] != "contrib" || s.types[0] != "deb" || s.keyring != "/usr/share/keyrings/k.gpg" {
		t.Errorf("deb822[0] = %+v", s)
	}
	if s := deb822[1]; s.uris[0] != "http://inline.example/debian" || s.keyring != "" {
		t.Errorf("deb822[1] = %+v (an inline key is no keyring file)", s)
	}
	one := parseOneLineSources(`# deb http://commented.example/debian bookworm main
deb [arch=amd64 signed-by=/k.gpg] http://one.example/debian bookworm main # trailing
deb-src http://one.example/debian bookworm main
deb http://two.example/debian bookworm-security main
`)
	if len(one) != 3 {
		t.Fatalf("one-line: got %d sources, want 3: %+v", len(one), one)
	}
	if s := one[0]; s.types[0] != "deb" || s.uris[0] != "http://one.example/debian" || s.suites[0] != "bookworm" ||
		len(s.components) != 1 || s.components[0] != "main" || s.keyring != "/k.gpg" {
		t.Errorf("one-line[0] = %+v", s)
	}
	if s := one[2]; s.suites[0] != "bookworm-security" || s.keyring != "" {
		t.Errorf("one-line[2] = %+v", s)
	}
}

// TestTestBuildArgs: the guest's test binary is built with the build tags
// of the host's, so a kernel test in a file tagged kernel exists in both.
func TestTestBuildArgs(t *testing.T) {
	for _, tc := range []struct {
		name     string
		settings []debug.BuildSetting
		ok       bool
		want     []string
	}{
		{"one tag", []debug.BuildSetting{{Key: "-compiler", Value: "gc"}, {Key: "-tags", Value: "kernel"}}, true,
			[]string{"test", "-c", "-vet=off", "-tags", "kernel", "-o", "out", "."}},
		{"every tier", []debug.BuildSetting{{Key: "-tags", Value: "controlplane,routing,kernel,lab"}}, true,
			[]string{"test", "-c", "-vet=off", "-tags", "controlplane,routing,kernel,lab", "-o", "out", "."}},
		{"no tags", []debug.BuildSetting{{Key: "CGO_ENABLED", Value: "1"}}, true,
			[]string{"test", "-c", "-vet=off", "-o", "out", "."}},
		{"no build info", nil, false, []string{"test", "-c", "-vet=off", "-o", "out", "."}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := testBuildArgs(&debug.BuildInfo{Settings: tc.settings}, tc.ok, "out"); !slices.Equal(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}
