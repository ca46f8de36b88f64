// Command vipcast-ccm is vipcast's cloud-controller-manager: the
// Kubernetes cloud-provider app (leader election, secure serving with
// /healthz and /metrics, the cloud-node and node-lifecycle controllers)
// running vipcast's provider, which allocates LoadBalancer VIPs from IPPools
// and initializes nodes, and vipcast's own service controller in place of
// the stock one, so it can serve a spec.loadBalancerClass.
package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"time"

	"github.com/spf13/cobra"
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
	genericcontrollermanager "k8s.io/controller-manager/app"
	"k8s.io/controller-manager/controller"
	"k8s.io/klog/v2"

	"github.com/vipcast/vipcast/ccm"
	"github.com/vipcast/vipcast/lbclass"
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
	leaseFlag           = "leader-elect-resource-name"
)

// classFlags are vipcast's own flags: which Services it serves.
type classFlags struct {
	class     string
	classless bool
	// selector is built from the flags before the provider is.
	selector lbclass.Selector
}

func main() {
	cmd, cf, err := newCommand()
	if err != nil {
		klog.Fatalf("Unable to initialize command options: %v", err)
	}
	ccm.Register(legacyregistry.Register, &cf.selector)
	os.Exit(cli.Run(cmd))
}

// newCommand returns vipcast-ccm's command: the cloud-provider app's, with
// vipcast's defaults (newOptions), its controllers and its own flags, whose
// values it returns.
func newCommand() (*cobra.Command, *classFlags, error) {
	opts, err := newOptions()
	if err != nil {
		return nil, nil, err
	}
	cf := &classFlags{}
	var extra cliflag.NamedFlagSets
	fs := extra.FlagSet("vipcast")
	fs.StringVar(&cf.class, lbclass.FlagClass, "", "The spec.loadBalancerClass of the Services vipcast serves, a domain-prefixed name such as vipcast.io/bgp; empty serves no class. Give the speakers the same value.")
	fs.BoolVar(&cf.classless, lbclass.FlagClassless, true, "Also serve Services without a spec.loadBalancerClass. Default: true without --"+lbclass.FlagClass+", false with it. Give the speakers the same value.")

	cmd := app.NewCloudControllerManagerCommand(opts, initCloud, controllers(), names.CCMControllerAliases(), extra, wait.NeverStop)
	cmd.Use = "vipcast-ccm"
	cmd.PreRunE = func(*cobra.Command, []string) error {
		if err := cf.complete(cmd, opts); err != nil {
			return err
		}
		dir, err := os.MkdirTemp("", "vipcast-ccm-serving-")
		if err != nil {
			return fmt.Errorf("a directory for the self-signed serving certificate: %w", err)
		}
		return useOwnServingCert(opts, dir, time.Now())
	}
	return cmd, cf, nil
}

// newOptions returns the cloud-provider app's options with vipcast's
// defaults. The webhook port is off (--webhook-secure-port=0): vipcast
// has no webhook, and the app would otherwise still make a certificate for
// it at every start.
func newOptions() (*options.CloudControllerManagerOptions, error) {
	opts, err := options.NewCloudControllerManagerOptions()
	if err != nil {
		return nil, fmt.Errorf("cloud-provider options: %w", err)
	}
	opts.KubeCloudShared.CloudProvider.Name = ccm.ProviderName
	opts.ServiceController.ConcurrentServiceSyncs = defaultServiceSyncs
	opts.Generic.ClientConnection.QPS = defaultClientQPS
	opts.Generic.ClientConnection.Burst = defaultClientBurst
	opts.Generic.LeaderElection.ResourceName = leaseName
	opts.WebhookServing.BindPort = 0
	return opts, nil
}

// complete checks the class flags and, unless --leader-elect-resource-name
// was given, names the lease after the class served.
func (cf *classFlags) complete(cmd *cobra.Command, opts *options.CloudControllerManagerOptions) error {
	var classless *bool
	if cmd.Flags().Changed(lbclass.FlagClassless) {
		classless = &cf.classless
	}
	sel, err := lbclass.New(cf.class, classless)
	if err != nil {
		return err
	}
	cf.selector = sel
	if !cmd.Flags().Changed(leaseFlag) {
		name, err := sel.LeaseName(leaseName)
		if err != nil {
			return err
		}
		opts.Generic.LeaderElection.ResourceName = name
	}
	return nil
}

// controllers returns the cloud-provider app's controllers with the stock
// service controller replaced by vipcast's, under the same name (so
// --controllers=-service still turns it off).
func controllers() map[string]app.ControllerInitFuncConstructor {
	ctrls := maps.Clone(app.DefaultInitFuncConstructors)
	stock := ctrls[names.ServiceLBController]
	ctrls[names.ServiceLBController] = app.ControllerInitFuncConstructor{
		InitContext: stock.InitContext,
		Constructor: func(ic app.ControllerInitContext, cfg *config.CompletedConfig, cloud cloudprovider.Interface) app.InitFunc {
			return func(ctx context.Context, _ genericcontrollermanager.ControllerContext) (controller.Interface, bool, error) {
				return startServiceController(ctx, ic, cfg, cloud)
			}
		},
	}
	return ctrls
}

// startServiceController runs vipcast's service controller.
func startServiceController(ctx context.Context, ic app.ControllerInitContext, cfg *config.CompletedConfig, cloud cloudprovider.Interface) (controller.Interface, bool, error) {
	p, ok := cloud.(*ccm.Provider)
	if !ok {
		return nil, false, errors.New("the service controller needs the vipcast provider (--cloud-provider=" + ccm.ProviderName + ")")
	}
	client, err := cfg.ClientBuilder.Client(ic.ClientName)
	if err != nil {
		return nil, false, fmt.Errorf("service controller client: %w", err)
	}
	c, err := ccm.NewServiceController(p, client, cfg.SharedInformers.Core().V1().Services())
	if err != nil {
		return nil, false, err
	}
	go c.Run(ctx, int(cfg.ComponentConfig.ServiceController.ConcurrentServiceSyncs))
	return nil, true, nil
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
