// Command kubectl-vipcast is vipcast's kubectl plugin (kubectl vipcast
// ...): for a Service, which node announces its VIPs and why the others
// do not (why: each node's speaker's rules applied to the API objects,
// with the sessions and refusals its SpeakerStatus reports), and for the
// cluster, the state of every BGP session, nodes by peers (peers); and
// MetalLB's configuration translated into vipcast's (import metallb).
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/pager"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/nodereport"
)

// requestTimeout bounds every request the plugin makes.
const requestTimeout = 30 * time.Second

func main() {
	if err := newCommand(os.Stdout).Execute(); err != nil {
		os.Exit(1)
	}
}

// clients are what the subcommands read with.
type clients struct {
	core      kubernetes.Interface
	dyn       dynamic.Interface
	namespace string
}

func newCommand(out io.Writer) *cobra.Command {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	overrides := &clientcmd.ConfigOverrides{}
	root := &cobra.Command{
		Use:           "kubectl-vipcast",
		Short:         "Which node announces what, and why not: vipcast's kubectl plugin",
		SilenceUsage:  true,
		SilenceErrors: false,
	}
	root.PersistentFlags().StringVar(&rules.ExplicitPath, "kubeconfig", "", "path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
	root.PersistentFlags().StringVar(&overrides.CurrentContext, "context", "", "the kubeconfig context to use")
	root.PersistentFlags().StringVarP(&overrides.Context.Namespace, "namespace", "n", "", "the Service's namespace (default: the context's)")
	connect := func() (*clients, error) {
		cfg := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides)
		rc, err := cfg.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("loading the kubeconfig: %w", err)
		}
		rc.Timeout = requestTimeout
		ns, _, err := cfg.Namespace()
		if err != nil {
			return nil, fmt.Errorf("the kubeconfig's namespace: %w", err)
		}
		core, err := kubernetes.NewForConfig(rc)
		if err != nil {
			return nil, fmt.Errorf("client: %w", err)
		}
		dyn, err := dynamic.NewForConfig(rc)
		if err != nil {
			return nil, fmt.Errorf("client: %w", err)
		}
		return &clients{core: core, dyn: dyn, namespace: ns}, nil
	}

	root.AddCommand(whyCommand(connect, out), peersCommand(connect, out), importCommand(connect, out))
	return root
}

func whyCommand(connect func() (*clients, error), out io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "why SERVICE",
		Short: "For each node: does it announce the Service's VIPs, with which next hop, and if not, why",
		Long: "SERVICE is a name in the namespace of -n (or the context's), or namespace/name.\n" +
			"Each node's answer is its vipcast-speaker's decision, computed here with the speaker's own rules\n" +
			"from the Service, its EndpointSlices, the IPPools, the BGPPeers and the Node; whether its BGP\n" +
			"sessions are up and whether its kernel refused the Service come from the node's SpeakerStatus.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := connect()
			if err != nil {
				return err
			}
			return why(cmd.Context(), c, args[0], out)
		},
	}
}

func peersCommand(connect func() (*clients, error), out io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "peers",
		Short: "The BGP sessions: a row per node, a column per BGPPeer, each cell the session's state",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := connect()
			if err != nil {
				return err
			}
			statuses, err := speakerStatuses(cmd.Context(), c)
			if err != nil {
				return err
			}
			return nodereport.PrintPeers(out, statuses)
		},
	}
}

func why(ctx context.Context, c *clients, arg string, out io.Writer) error {
	ns, name := c.namespace, arg
	if before, after, ok := strings.Cut(arg, "/"); ok {
		ns, name = before, after
	}
	svc, err := c.core.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading Service %s/%s: %w", ns, name, err)
	}
	if svc.Spec.Type != v1.ServiceTypeLoadBalancer {
		return fmt.Errorf("Service %s/%s is of type %s: vipcast announces only LoadBalancer Services", ns, name, svc.Spec.Type) //nolint:staticcheck // a sentence for the user, Service capitalized
	}
	o := nodereport.Objects{Service: svc}
	slices, err := c.core.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + name})
	if err != nil {
		return fmt.Errorf("listing the Service's EndpointSlices: %w", err)
	}
	for i := range slices.Items {
		o.Slices = append(o.Slices, &slices.Items[i])
	}
	if o.Pools, err = listCustom[vipcastv1alpha1.IPPool](ctx, c, vipcastv1alpha1.IPPoolsResource); err != nil {
		return err
	}
	if o.Peers, err = listCustom[vipcastv1alpha1.BGPPeer](ctx, c, vipcastv1alpha1.BGPPeersResource); err != nil {
		return err
	}
	if o.Statuses, err = speakerStatuses(ctx, c); err != nil {
		return err
	}
	// Nodes by pages: a cluster of thousands is read in bounded pieces.
	err = pager.New(func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		return c.core.CoreV1().Nodes().List(ctx, opts)
	}).EachListItem(ctx, metav1.ListOptions{}, func(obj runtime.Object) error {
		o.Nodes = append(o.Nodes, *obj.(*v1.Node)) //nolint:forcetypeassert // a Node list holds Nodes
		return nil
	})
	if err != nil {
		return fmt.Errorf("listing the Nodes: %w", err)
	}
	return nodereport.PrintWhy(out, svc, nodereport.Why(o))
}

// listCustom lists and decodes every object of a vipcast resource; one
// that does not decode is skipped with a warning, as the speakers skip it.
func listCustom[T any, P interface {
	*T
	runtime.Object
}](ctx context.Context, c *clients, res schema.GroupVersionResource) ([]P, error) {
	list, err := c.dyn.Resource(res).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing %s.%s (is vipcast installed, with its CRDs?): %w", res.Resource, res.Group, err)
	}
	out := make([]P, 0, len(list.Items))
	for _, u := range list.Items {
		p := P(new(T))
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, p); err != nil {
			fmt.Fprintf(os.Stderr, "warning: skipping %s %s, which does not decode (the speakers skip it too): %v\n", res.Resource, u.GetName(), err)
			continue
		}
		out = append(out, p)
	}
	return out, nil
}

// speakerStatuses lists and decodes every SpeakerStatus.
func speakerStatuses(ctx context.Context, c *clients) ([]vipcastv1alpha1.SpeakerStatus, error) {
	list, err := c.dyn.Resource(vipcastv1alpha1.SpeakerStatusesResource).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing speakerstatuses.vipcast.io (is vipcast installed, with its CRDs?): %w", err)
	}
	out := make([]vipcastv1alpha1.SpeakerStatus, 0, len(list.Items))
	for _, u := range list.Items {
		var s vipcastv1alpha1.SpeakerStatus
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &s); err != nil {
			return nil, fmt.Errorf("decoding SpeakerStatus %s: %w", u.GetName(), err)
		}
		out = append(out, s)
	}
	return out, nil
}
