package lab

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/vipcast/vipcast/test/netns"
	"github.com/vipcast/vipcast/test/proc"
	"github.com/vipcast/vipcast/test/vm"
)

// RegistryVersion is the OCI registry the Makefile builds
// (REGISTRY_VERSION): distribution's reference implementation.
const RegistryVersion = "v3.1.2"

// registryPort is where the ToR's relay to the registry listens, on
// torAddr: the registry as the nodes' containerd reaches it.
const registryPort = "5000"

// registryPath is the path under which the lab pushes its releases:
// images <registry>/vipcast/vipcast-ccm and the chart
// oci://<registry>/vipcast/charts/vipcast.
const registryPath = "vipcast"

// RegistryBin is the registry binary built by `make cluster-tools`.
func RegistryBin() string {
	return filepath.Join(vm.CacheDir(), "registry-"+RegistryVersion, "registry")
}

// NodeRegistry is the lab's registry as the nodes reach it (through the
// ToR's relay), the host of the images the lab's chart names.
func NodeRegistry() string {
	return net.JoinHostPort(torAddr.String(), registryPort)
}

// startRegistry runs the OCI registry on the host's loopback, with its
// storage in Dir, and the ToR's relay to it that the nodes pull through;
// it returns the registry's loopback address, which `make release` pushes
// to and helm installs from.
func (l *Lab) startRegistry(ctx context.Context) string {
	t := l.t
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // the registry listens there next
	dir := filepath.Join(l.Opts.Dir, "registry")
	config := filepath.Join(dir, "config.yml")
	if err := os.MkdirAll(filepath.Join(dir, "storage"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`version: 0.1
log:
  level: warn
  accesslog: {disabled: true}
storage:
  filesystem: {rootdirectory: %s}
http:
  addr: %s
`, filepath.Join(dir, "storage"), addr)), 0o644); err != nil {
		t.Fatal(err)
	}
	log := filepath.Join(dir, "registry.log")
	p, err := proc.Start(log, RegistryBin(), "serve", config)
	if err != nil {
		t.Fatalf("the OCI registry (make cluster-tools builds it): %v", err)
	}
	t.Cleanup(func() { p.Stop(10 * time.Second) })
	deadline := time.Now().Add(30 * time.Second)
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/v2/", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			out, _ := os.ReadFile(log)
			t.Fatalf("the OCI registry on %s did not answer /v2/ within 30s (%v): %s", addr, err, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	netns.Forward(t, l.TorNS, NodeRegistry(), addr)
	return addr
}

// ChartVersion is the version of the chart, and the tag of both images,
// that the lab releases for tag: the chart's own version with tag as its
// pre-release part (0.1.0-lab).
func ChartVersion(tag string) (string, error) {
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(filepath.Join(root, "charts/vipcast/Chart.yaml"))
	if err != nil {
		return "", err
	}
	m := regexp.MustCompile(`(?m)^version: *"?([0-9]+\.[0-9]+\.[0-9]+)`).FindSubmatch(b)
	if m == nil {
		return "", fmt.Errorf("charts/vipcast/Chart.yaml: no version MAJOR.MINOR.PATCH")
	}
	return string(m[1]) + "-" + tag, nil
}

// chartRef is the lab's chart in its registry, as helm on the host
// installs it.
func (l *Lab) chartRef() string {
	return "oci://" + l.registry + "/" + registryPath + "/charts/vipcast"
}

// release runs `make release` for tag, the way a user publishes vipcast:
// both images for linux/amd64 and linux/arm64 and the chart, pushed to the
// lab's registry on loopback, the chart naming the images under the
// registry's address at the ToR (NodeRegistry). It returns what the
// release printed about its images: per platform, the binary and its ELF
// machine, as read back from the registry.
func (l *Lab) release(ctx context.Context, tag string) (string, error) {
	version, err := ChartVersion(tag)
	if err != nil {
		return "", err
	}
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(l.Opts.Dir, "release-"+tag)
	cmd := exec.CommandContext(ctx, "make", "-s", "-C", root, "release",
		"REGISTRY="+l.registry+"/"+registryPath, "IMAGE_REGISTRY="+NodeRegistry()+"/"+registryPath,
		"VERSION="+version, "PLAIN_HTTP=true", "RELEASE_DIR="+dir)
	// A make of its own, not a sub-make of `make test`'s; helm's caches in
	// Dir, as Lab.Helm keeps them.
	env := []string{"HELM_CACHE_HOME=" + filepath.Join(l.Opts.Dir, "helm/cache"),
		"HELM_CONFIG_HOME=" + filepath.Join(l.Opts.Dir, "helm/config"),
		"HELM_DATA_HOME=" + filepath.Join(l.Opts.Dir, "helm/data")}
	for _, e := range os.Environ() {
		if k, _, _ := strings.Cut(e, "="); k != "MAKEFLAGS" && k != "MAKELEVEL" && k != "MFLAGS" {
			env = append(env, e)
		}
	}
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("make release VERSION=%s: %w: %s", version, err, out)
	}
	images, err := os.ReadFile(filepath.Join(dir, "images.txt"))
	return string(images), err
}

// releaseAll releases each of tags (release) and checks that the
// registry serves arm64 binaries for both images (checkArm64).
func (l *Lab) releaseAll(ctx context.Context, tags []string) {
	t := l.t
	t.Helper()
	for _, tag := range tags {
		version, err := ChartVersion(tag)
		if err != nil {
			t.Fatal(err)
		}
		l.Opts.Logf("==> make release VERSION=%s: vipcast's images (linux/amd64, linux/arm64) and chart, pushed to the lab's registry (%s at the ToR)", version, NodeRegistry())
		start := time.Now()
		images, err := l.release(ctx, tag)
		if err != nil {
			t.Fatal(err)
		}
		if err := checkArm64(images); err != nil {
			t.Fatal(err)
		}
		l.Opts.Logf("    released in %s; each image's platforms as the registry serves them:\n%s", time.Since(start).Round(time.Second), indent(images))
	}
}

// checkArm64 fails unless what release printed shows, for both images,
// a linux/arm64 entry whose binary is an arm64 ELF: nothing here runs
// arm64, so the ELF header is what says an arm64 node would run it.
func checkArm64(images string) error {
	for _, bin := range []string{"vipcast-ccm", "vipcast-speaker"} {
		want := regexp.MustCompile(regexp.QuoteMeta("/"+bin+":") + `\S*\s+linux/arm64 sha256:[0-9a-f]{64}: /usr/local/bin/` + bin + ` is a static ELF binary for EM_AARCH64`)
		if !want.MatchString(images) {
			return fmt.Errorf("no linux/arm64 %s with an EM_AARCH64 binary in the release's check:\n%s", bin, images)
		}
	}
	return nil
}

// indent indents each line of s by four spaces, for the lab's log.
func indent(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, line := range lines {
		lines[i] = "    " + line
	}
	return strings.Join(lines, "\n")
}

// Registry is where the lab's releases are, as `make release`'s REGISTRY
// and a reader's $REGISTRY: the registry on the host's loopback and the
// path under it.
func (l *Lab) Registry() string {
	return l.registry + "/" + registryPath
}
