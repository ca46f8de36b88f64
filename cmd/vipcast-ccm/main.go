// Command vipcast-ccm is vipcast's cloud-controller-manager: the
// Kubernetes cloud-provider app (leader election, secure serving with
// /healthz and /metrics, the service, cloud-node and node-lifecycle
// controllers) running vipcast's provider, which allocates LoadBalancer VIPs
// from IPPools and initializes nodes.
package main

import (
	"os"

	"k8s.io/apimachinery/pkg/util/wait"
	cloudprovider "k8s.io/cloud-provider"
	"k8s.io/cloud-provider/app"
	"k8s.io/cloud-provider/app/config"
	"k8s.io/cloud-provider/names"
	"k8s.io/cloud-provider/options"
	"k8s.io/component-base/cli"
	cliflag "k8s.io/component-base/cli/flag"
	_ "k8s.io/component-base/logs/json/register" // --logging-format=json
	"k8s.io/component-base/metrics/legacyregistry"
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // build info metric
	"k8s.io/klog/v2"

	"github.com/vipcast/vipcast/ccm"
)

// Defaults that differ from the cloud-provider app's. Its stock defaults (one
// service worker, client QPS 20) serialize every Service behind one slow
// client: allocation is in memory, so the API writes are the whole cost and
// ten workers with a larger client budget keep a burst of Services moving
// without straining the API server.
const (
	defaultServiceSyncs = 10
	defaultClientQPS    = 500
	defaultClientBurst  = 1000
	leaseName           = "vipcast-ccm"
)

func main() {
	opts, err := options.NewCloudControllerManagerOptions()
	if err != nil {
		klog.Fatalf("Unable to initialize command options: %v", err)
	}
	opts.KubeCloudShared.CloudProvider.Name = ccm.ProviderName
	opts.ServiceController.ConcurrentServiceSyncs = defaultServiceSyncs
	opts.Generic.ClientConnection.QPS = defaultClientQPS
	opts.Generic.ClientConnection.Burst = defaultClientBurst
	opts.Generic.LeaderElection.ResourceName = leaseName

	ccm.Register(legacyregistry.Register)

	cmd := app.NewCloudControllerManagerCommand(opts, initCloud, app.DefaultInitFuncConstructors,
		names.CCMControllerAliases(), cliflag.NamedFlagSets{}, wait.NeverStop)
	cmd.Use = "vipcast-ccm"
	os.Exit(cli.Run(cmd))
}

// initCloud builds the provider named by --cloud-provider (vipcast by default).
func initCloud(cfg *config.CompletedConfig) cloudprovider.Interface {
	shared := cfg.ComponentConfig.KubeCloudShared.CloudProvider
	cloud, err := cloudprovider.InitCloudProvider(shared.Name, shared.CloudConfigFile)
	if err != nil {
		klog.Fatalf("Cloud provider %q could not be initialized: %v", shared.Name, err)
	}
	if cloud == nil {
		klog.Fatalf("Cloud provider %q is unknown; this binary provides %q", shared.Name, ccm.ProviderName)
	}
	return cloud
}
