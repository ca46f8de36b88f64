package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/metallbimport"
)

// importFieldManager is the field manager of the objects `import metallb
// --apply` creates.
const importFieldManager = "kubectl-vipcast-import"

func importCommand(connect func() (*clients, error), out io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "import",
		Short: "Translate another load balancer's configuration into vipcast's",
	}
	var (
		files   []string
		opts    metallbimport.Options
		apply   bool
		metallb = &cobra.Command{
			Use:   "metallb",
			Short: "Print vipcast IPPools and BGPPeers translated from MetalLB's configuration (--apply creates them)",
			Long: "Reads MetalLB's IPAddressPools, BGPPeers, BGPAdvertisements, L2Advertisements, Communities and\n" +
				"BFDProfiles (metallb.io, as MetalLB 0.14 and 0.15 serve them) from the cluster, in MetalLB's\n" +
				"namespace, or from -f files, and prints the vipcast IPPools, BGPPeers and password Secrets\n" +
				"that mean the same. Every field that does not carry over is named in a comment, with why; a\n" +
				"configuration that would mean something else under vipcast is refused, naming each part, and\n" +
				"nothing is printed or created. With --apply the objects are created (server-side apply).",
			Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				objs := &metallbimport.Objects{}
				var c *clients
				if len(files) == 0 || apply {
					var err error
					if c, err = connect(); err != nil {
						return err
					}
				}
				if len(files) > 0 {
					if err := decodeFiles(objs, files); err != nil {
						return err
					}
				} else if err := readMetalLB(cmd.Context(), c, objs, cmp.Or(opts.Namespace, metallbimport.DefaultNamespace)); err != nil {
					return err
				}
				res, err := metallbimport.Translate(objs, opts)
				if err != nil {
					return err
				}
				if !apply {
					return res.Write(out, objs.Skipped)
				}
				return applyResult(cmd.Context(), c, res, out)
			},
		}
	)
	metallb.Flags().StringArrayVarP(&files, "filename", "f", nil, "read MetalLB's objects from these files or directories (YAML or JSON, kubectl get -o yaml lists too) instead of the cluster")
	metallb.Flags().StringVar(&opts.Namespace, "metallb-namespace", metallbimport.DefaultNamespace, "MetalLB's namespace: the only one whose objects MetalLB reads")
	metallb.Flags().StringVar(&opts.PasswordNamespace, "password-namespace", metallbimport.DefaultPasswordNamespace, "where the Secrets for BGPPeers' plain-text passwords are made")
	metallb.Flags().BoolVar(&apply, "apply", false, "create the translated objects in the cluster (server-side apply) instead of printing them")
	cmd.AddCommand(metallb)
	return cmd
}

// decodeFiles decodes every file named, a directory's *.yaml, *.yml and
// *.json files in name order.
func decodeFiles(objs *metallbimport.Objects, names []string) error {
	for _, name := range names {
		paths := []string{name}
		if st, err := os.Stat(name); err == nil && st.IsDir() {
			paths = nil
			for _, ext := range []string{"*.yaml", "*.yml", "*.json"} {
				m, _ := filepath.Glob(filepath.Join(name, ext))
				paths = append(paths, m...)
			}
		}
		for _, p := range paths {
			f, err := os.Open(p) //nolint:gosec // G304: the files the user named with -f
			if err != nil {
				return err
			}
			err = objs.Decode(f, p)
			_ = f.Close()
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// readMetalLB lists MetalLB's configuration in namespace ns and decodes
// it the way files are.
func readMetalLB(ctx context.Context, c *clients, objs *metallbimport.Objects, ns string) error {
	// Each resource with the versions tried in turn, the newest first.
	resources := []struct {
		resource string
		versions []string
	}{
		{"ipaddresspools", []string{"v1beta1"}},
		{"bgppeers", []string{"v1beta2", "v1beta1"}},
		{"bgpadvertisements", []string{"v1beta1"}},
		{"l2advertisements", []string{"v1beta1"}},
		{"communities", []string{"v1beta1"}},
		{"bfdprofiles", []string{"v1beta1"}},
	}
	for _, r := range resources {
		var list *unstructured.UnstructuredList
		var err error
		for _, v := range r.versions {
			gvr := schema.GroupVersionResource{Group: metallbimport.Group, Version: v, Resource: r.resource}
			list, err = c.dyn.Resource(gvr).Namespace(ns).List(ctx, metav1.ListOptions{})
			if !apierrors.IsNotFound(err) {
				break
			}
		}
		switch {
		case apierrors.IsNotFound(err) && r.resource == "ipaddresspools":
			return fmt.Errorf("%s.%s is not served by this cluster: is MetalLB (0.13 or later, with its CRDs) installed? Or read its objects from files with -f", r.resource, metallbimport.Group)
		case apierrors.IsNotFound(err):
			continue // an older MetalLB without this kind
		case err != nil:
			return fmt.Errorf("listing %s.%s in %s: %w", r.resource, metallbimport.Group, ns, err)
		}
		b, err := json.Marshal(list)
		if err != nil {
			return fmt.Errorf("encoding %s: %w", r.resource, err)
		}
		if err := objs.Decode(bytes.NewReader(b), fmt.Sprintf("the cluster's %s.%s", r.resource, metallbimport.Group)); err != nil {
			return err
		}
	}
	return nil
}

// applyResult creates the result's objects with server-side apply, in
// order (Secrets, BGPPeers, IPPools), and prints each, with the notes.
func applyResult(ctx context.Context, c *clients, res *metallbimport.Result, out io.Writer) error {
	var b strings.Builder
	defer func() { _, _ = io.WriteString(out, b.String()) }()
	for _, n := range res.Notes {
		fmt.Fprintf(&b, "# note: %s\n", n)
	}
	objs, err := res.Objects()
	if err != nil {
		return err
	}
	for _, obj := range objs {
		var gvr schema.GroupVersionResource
		switch obj.GetKind() {
		case "Secret":
			gvr = schema.GroupVersionResource{Version: "v1", Resource: "secrets"}
		case "BGPPeer":
			gvr = vipcastv1alpha1.BGPPeersResource
		case "IPPool":
			gvr = vipcastv1alpha1.IPPoolsResource
		default:
			return fmt.Errorf("unexpected kind %s", obj.GetKind())
		}
		var client dynamic.ResourceInterface = c.dyn.Resource(gvr)
		if ns := obj.GetNamespace(); ns != "" {
			client = c.dyn.Resource(gvr).Namespace(ns)
		}
		if _, err := client.Apply(ctx, obj.GetName(), obj, metav1.ApplyOptions{FieldManager: importFieldManager}); err != nil {
			hint := ""
			if apierrors.IsNotFound(err) && obj.GetKind() == "Secret" {
				hint = " (the chart creates the namespace when speaker.bgpPasswordSecrets.secrets names a Secret in it: install or upgrade vipcast with the Secrets this command names first)"
			}
			return fmt.Errorf("applying %s %s: %w%s", obj.GetKind(), obj.GetName(), err, hint)
		}
		fmt.Fprintf(&b, "%s/%s applied\n", strings.ToLower(obj.GetKind()), obj.GetName())
	}
	if len(res.PasswordSecrets) > 0 {
		fmt.Fprintf(&b, "# The speakers read these Secrets only once the chart names them: speaker.bgpPasswordSecrets.secrets: [%s]\n", strings.Join(res.PasswordSecrets, ", "))
	}
	return nil
}
