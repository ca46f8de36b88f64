package main

import (
	"errors"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// TestUninstalled: only a DaemonSet that is gone or going, or credentials
// the API server refuses, remove the dataplane; an upgrade, a restart and
// an API server outage keep it.
func TestUninstalled(t *testing.T) {
	gr := schema.GroupResource{Group: "apps", Resource: "daemonsets"}
	now := metav1.Now()
	for _, tc := range []struct {
		name string
		ds   *appsv1.DaemonSet
		err  error
		want bool
	}{
		{"in place (upgrade, restart, deleted pod)", &appsv1.DaemonSet{}, nil, false},
		{"being deleted (foreground, namespace deletion)", &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &now}}, nil, true},
		{"gone (helm uninstall)", nil, apierrors.NewNotFound(gr, "vipcast-speaker"), true},
		{"ServiceAccount deleted", nil, apierrors.NewUnauthorized("token revoked"), true},
		{"RBAC deleted", nil, apierrors.NewForbidden(gr, "vipcast-speaker", errors.New("no rule")), true},
		{"API server down", nil, errors.New("dial tcp 10.96.0.1:443: connect: connection refused"), false},
		{"API server failing", nil, apierrors.NewInternalError(errors.New("etcd")), false},
		{"API server overloaded", nil, apierrors.NewTooManyRequests("slow down", 1), false},
		{"timeout", nil, apierrors.NewTimeoutError("deadline", 1), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, why := uninstalled(tc.ds, tc.err)
			if got != tc.want || why == "" {
				t.Fatalf("uninstalled = %v (%q), want %v", got, why, tc.want)
			}
		})
	}
}

func TestParseOwnerDaemonSet(t *testing.T) {
	o, err := parseOwnerDaemonSet("vipcast-system/vipcast-speaker")
	if err != nil || o.namespace != "vipcast-system" || o.name != "vipcast-speaker" {
		t.Fatalf("got %+v, %v", o, err)
	}
	if o, err := parseOwnerDaemonSet(""); o != nil || err != nil {
		t.Fatalf("empty: got %+v, %v, want nothing", o, err)
	}
	for _, bad := range []string{"vipcast-speaker", "/x", "ns/", "Bad_NS/x", "ns/x/y"} {
		_, err := parseOwnerDaemonSet(bad)
		if err == nil || !strings.Contains(err.Error(), "--owner-daemonset") {
			t.Errorf("%q: error %v, want one naming --owner-daemonset", bad, err)
		}
	}
}
