// Package apirequests counts a client's requests to the Kubernetes API
// server by verb and resource, so that a speaker's relists (a LIST where a
// WATCH would have resumed) show in its metrics: what the API server
// serves it after an outage, a restart or a watch that expired.
package apirequests

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// Verbs, as the API server's audit log names them, and the streaming list
// apart from the watch.
const (
	VerbList  = "list"
	VerbWatch = "watch"
	// VerbWatchList is a watch that starts with every object
	// (sendInitialEvents=true): how client-go's informers list since
	// Kubernetes 1.35 (the WatchListClient feature), a list all the same.
	VerbWatchList = "watchlist"
	VerbGet       = "get"
	VerbCreate    = "create"
	VerbUpdate    = "update"
	VerbPatch     = "patch"
	VerbDelete    = "delete"
	// VerbOther is a request that names no resource (discovery, /healthz,
	// /version) or a method the API does not use.
	VerbOther = "other"
)

// Classify returns the verb and resource of an API request: the
// resource's plural name, with its subresource after a slash
// ("speakerstatuses/status"); "" when the path names none.
func Classify(r *http.Request) (verb, resource string) {
	resource, named := resourceOf(r.URL.Path)
	if resource == "" {
		return VerbOther, ""
	}
	switch r.Method {
	case http.MethodGet:
		q := r.URL.Query()
		switch {
		case q.Get("watch") == "true" || q.Get("watch") == "1":
			if q.Get("sendInitialEvents") == "true" {
				return VerbWatchList, resource
			}
			return VerbWatch, resource
		case named:
			return VerbGet, resource
		}
		return VerbList, resource
	case http.MethodPost:
		return VerbCreate, resource
	case http.MethodPut:
		return VerbUpdate, resource
	case http.MethodPatch:
		return VerbPatch, resource
	case http.MethodDelete:
		return VerbDelete, resource
	}
	return VerbOther, resource
}

// resourceOf parses /api/v1/... and /apis/GROUP/VERSION/...: an optional
// namespaces/NS, then RESOURCE[/NAME[/SUBRESOURCE]]. named is true when a
// name follows the resource. /api/v1/namespaces and /api/v1/namespaces/NS
// are the namespaces resource itself.
func resourceOf(path string) (resource string, named bool) {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		parts = parts[3:]
	default:
		return "", false
	}
	if len(parts) >= 3 && parts[0] == "namespaces" {
		parts = parts[2:]
	}
	switch len(parts) {
	case 0:
		return "", false
	case 1:
		return parts[0], false
	case 2:
		return parts[0], true
	}
	return parts[0] + "/" + parts[2], true
}

// Counter counts requests in vipcast_<subsystem>_api_requests_total, by
// verb, resource and the answer's status code.
type Counter struct {
	requests *prometheus.CounterVec
}

// NewCounter creates the counter vipcast_<subsystem>_api_requests_total
// and registers it with reg.
func NewCounter(reg prometheus.Registerer, subsystem string) (*Counter, error) {
	c := &Counter{requests: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "vipcast",
		Subsystem: subsystem,
		Name:      "api_requests_total",
		Help: "Requests to the Kubernetes API server, by verb (list, watchlist: a watch that starts with every object, watch, get, create, " +
			"update, patch, delete, other), resource and code (the answer's HTTP status, or error when none came): " +
			"a list or watchlist answered 200 after the start is a relist (an informer that could not resume its watch).",
	}, []string{"verb", "resource", "code"})}
	if err := reg.Register(c.requests); err != nil {
		return nil, err
	}
	return c, nil
}

// Wrap returns rt counting each request it sends: a rest.Config's
// WrapTransport.
func (c *Counter) Wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper{rt: rt, c: c}
}

type roundTripper struct {
	rt http.RoundTripper
	c  *Counter
}

// RoundTrip sends r and counts it with its answer's status (a watch's as
// its stream begins).
func (t roundTripper) RoundTrip(r *http.Request) (*http.Response, error) {
	verb, resource := Classify(r)
	resp, err := t.rt.RoundTrip(r)
	code := "error"
	if err == nil {
		code = strconv.Itoa(resp.StatusCode)
	}
	t.c.requests.WithLabelValues(verb, resource, code).Inc()
	return resp, err
}
