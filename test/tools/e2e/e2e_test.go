// Package e2e is the driver of e2e.test as vipcast builds it: Kubernetes'
// own test/e2e/e2e_test.go at the cluster's version, with the network specs
// only (where the LoadBalancer specs live) instead of every SIG's, so that
// it builds in a fraction of the time. The specs, the framework and the
// flags are upstream's, unchanged; `make e2e-tools` builds it with
// `go test -c` into the cache beside the other Kubernetes binaries.
package e2e

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"k8s.io/component-base/version"
	"k8s.io/kubernetes/test/e2e"
	"k8s.io/kubernetes/test/e2e/framework"
	"k8s.io/kubernetes/test/e2e/framework/config"
	"k8s.io/kubernetes/test/e2e/framework/testfiles"
	e2etestingmanifests "k8s.io/kubernetes/test/e2e/testing-manifests"
	testfixtures "k8s.io/kubernetes/test/fixtures"

	// The specs: SIG Network's, as upstream's driver imports them.
	_ "k8s.io/kubernetes/test/e2e/network"

	// What upstream's driver imports for every suite.
	_ "k8s.io/kubernetes/test/e2e/feature"
	_ "k8s.io/kubernetes/test/e2e/framework/debug/init"
	_ "k8s.io/kubernetes/test/e2e/framework/metrics/init"
	_ "k8s.io/kubernetes/test/e2e/framework/node/init"
	_ "k8s.io/kubernetes/test/utils/ktesting/format"
)

// TestMain parses upstream's flags as upstream's driver does.
func TestMain(m *testing.M) {
	versionFlag := flag.CommandLine.Bool("version", false, "Displays version information.")
	config.CopyFlags(config.Flags, flag.CommandLine)
	framework.RegisterCommonFlags(flag.CommandLine)
	framework.RegisterClusterFlags(flag.CommandLine)
	flag.Parse()
	if *versionFlag {
		fmt.Printf("%s\n", version.Get())
		os.Exit(0)
	}
	if flag.CommandLine.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "unknown additional command line arguments: %s\n", flag.CommandLine.Args())
		os.Exit(1)
	}
	testfiles.AddFileSource(e2etestingmanifests.GetE2ETestingManifestsFS())
	testfiles.AddFileSource(testfixtures.GetTestFixturesFS())
	framework.AfterReadingAllFlags(&framework.TestContext)
	os.Exit(m.Run())
}

// TestE2E runs the specs the flags select (--ginkgo.focus, --ginkgo.skip,
// --ginkgo.label-filter).
func TestE2E(t *testing.T) {
	e2e.RunE2ETests(t)
}
