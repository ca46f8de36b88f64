package apirequests

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		method, url    string
		verb, resource string
	}{
		{"GET", "/api/v1/services?limit=500&resourceVersion=0", VerbList, "services"},
		{"GET", "/api/v1/services?allowWatchBookmarks=true&resourceVersion=12&watch=true", VerbWatch, "services"},
		{"GET", "/api/v1/services?allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&sendInitialEvents=true&watch=true", VerbWatchList, "services"},
		{"GET", "/apis/discovery.k8s.io/v1/endpointslices?labelSelector=a", VerbList, "endpointslices"},
		{"GET", "/apis/discovery.k8s.io/v1/namespaces/ns/endpointslices?watch=1", VerbWatch, "endpointslices"},
		{"GET", "/api/v1/nodes/node1", VerbGet, "nodes"},
		{"GET", "/api/v1/nodes?fieldSelector=metadata.name%3Dnode1&watch=true", VerbWatch, "nodes"},
		{"GET", "/api/v1/namespaces/bgp/secrets/tor-a", VerbGet, "secrets"},
		{"PATCH", "/apis/vipcast.io/v1alpha1/speakerstatuses/node1/status", VerbPatch, "speakerstatuses/status"},
		{"POST", "/apis/vipcast.io/v1alpha1/speakerstatuses", VerbCreate, "speakerstatuses"},
		{"PUT", "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/x", VerbUpdate, "leases"},
		{"DELETE", "/api/v1/namespaces/ns/events/e", VerbDelete, "events"},
		{"POST", "/api/v1/namespaces/ns/events", VerbCreate, "events"},
		{"GET", "/api/v1/namespaces", VerbList, "namespaces"},
		{"GET", "/api/v1/namespaces/ns", VerbGet, "namespaces"},
		{"GET", "/version", VerbOther, ""},
		{"GET", "/apis/vipcast.io/v1alpha1", VerbOther, ""},
		{"GET", "/api", VerbOther, ""},
		{"OPTIONS", "/api/v1/services", VerbOther, "services"},
	} {
		r := httptest.NewRequest(tc.method, tc.url, nil)
		if verb, resource := Classify(r); verb != tc.verb || resource != tc.resource {
			t.Errorf("%s %s: %s %q, want %s %q", tc.method, tc.url, verb, resource, tc.verb, tc.resource)
		}
	}
}

// TestCounterWrap: the wrapped transport sends each request and counts it
// with its answer's status, or as an error when none came.
func TestCounterWrap(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	defer srv.Close()
	reg := prometheus.NewRegistry()
	c, err := NewCounter(reg, "speaker")
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: c.Wrap(http.DefaultTransport)}
	for _, u := range []string{"/api/v1/services", "/api/v1/services", "/api/v1/services?watch=true"} {
		resp, err := client.Get(srv.URL + u)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			t.Fatalf("GET %s: %s, want the server's answer", u, resp.Status)
		}
	}
	if got := testutil.ToFloat64(c.requests.WithLabelValues(VerbList, "services", "204")); got != 2 {
		t.Errorf("lists of services answered 204: %v, want 2", got)
	}
	if got := testutil.ToFloat64(c.requests.WithLabelValues(VerbWatch, "services", "204")); got != 1 {
		t.Errorf("watches of services answered 204: %v, want 1", got)
	}
	srv.Close()
	if resp, err := client.Get(srv.URL + "/api/v1/nodes/n1"); err == nil {
		_ = resp.Body.Close()
		t.Fatal("a request to a closed server succeeded")
	}
	if got := testutil.ToFloat64(c.requests.WithLabelValues(VerbGet, "nodes", "error")); got != 1 {
		t.Errorf("gets of nodes without an answer: %v, want 1", got)
	}
	if _, err := NewCounter(reg, "speaker"); err == nil {
		t.Error("a second counter of the same name registered")
	}
}
