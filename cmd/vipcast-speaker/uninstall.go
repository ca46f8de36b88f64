package main

import (
	"context"
	"fmt"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/vipcast/vipcast/ipvs"
)

// ownerDaemonSet is --owner-daemonset: the DaemonSet that runs this
// speaker, read once at shutdown to tell an uninstall (remove the
// dataplane) from a restart (keep it).
type ownerDaemonSet struct{ namespace, name string }

// parseOwnerDaemonSet parses --owner-daemonset=namespace/name.
func parseOwnerDaemonSet(v string) (*ownerDaemonSet, error) {
	if v == "" {
		return nil, nil //nolint:nilnil // unset: the speaker never removes its dataplane
	}
	ns, name, ok := strings.Cut(v, "/")
	if !ok || len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Subdomain(name)) > 0 {
		return nil, fmt.Errorf("--owner-daemonset=%q is not namespace/name: use the DaemonSet running the speaker, such as vipcast-system/vipcast-speaker", v)
	}
	return &ownerDaemonSet{namespace: ns, name: name}, nil
}

// uninstalled decides, from the answer to a GET of the speaker's own
// DaemonSet at shutdown, whether vipcast is being removed from the node:
// the DaemonSet is gone (helm uninstall deletes it before its pods), is
// being deleted, or the API server refuses the speaker's own credentials
// (helm uninstall deletes its ServiceAccount and RBAC with it). Anything
// else — the DaemonSet in place (an upgrade, a restart, a deleted pod), the
// API server unreachable or failing — keeps the dataplane: traffic must
// flow through a restart and through an API server outage.
func uninstalled(ds *appsv1.DaemonSet, err error) (bool, string) {
	switch {
	case apierrors.IsNotFound(err):
		return true, "its DaemonSet is gone"
	case apierrors.IsUnauthorized(err) || apierrors.IsForbidden(err):
		return true, "the API server no longer accepts its credentials (ServiceAccount or RBAC removed)"
	case err != nil:
		return false, fmt.Sprintf("its DaemonSet could not be read (%v)", err)
	case ds.DeletionTimestamp != nil:
		return true, "its DaemonSet is being deleted"
	default:
		return false, "its DaemonSet is in place"
	}
}

// releaseDataplane runs after the routes are withdrawn: it removes the
// dataplane from the node when the speaker is being uninstalled (see
// uninstalled), and otherwise only closes its handles, leaving the kernel
// state for the next speaker. A failure is logged: the process is exiting.
func releaseDataplane(logger klog.Logger, calls kubernetes.Interface, owner *ownerDaemonSet, dp *ipvs.Dataplane) {
	if owner == nil {
		closeDataplane(logger, dp)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	ds, err := calls.AppsV1().DaemonSets(owner.namespace).Get(ctx, owner.name, metav1.GetOptions{})
	gone, why := uninstalled(ds, err)
	if !gone {
		logger.Info("Leaving the dataplane on the node for the next speaker", "reason", why)
		closeDataplane(logger, dp)
		return
	}
	logger.Info("vipcast is being uninstalled: removing the dataplane from the node", "reason", why)
	if err := dp.Teardown(); err != nil {
		logger.Error(err, "Removing the dataplane from the node", "reason", why)
		closeDataplane(logger, dp)
		return
	}
	logger.Info("Dataplane removed: no virtual server, VIP, link or nftables table of vipcast is left")
}
