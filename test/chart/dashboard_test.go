package chart

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

const dashboardFile = "../../charts/vipcast/dashboards/vipcast.json"

// dashboard is what the tests read of the Grafana dashboard.
type dashboard struct {
	Panels []struct {
		Type       string `json:"type"`
		Title      string `json:"title"`
		Datasource struct {
			UID string `json:"uid"`
		} `json:"datasource"`
		Targets []struct {
			Expr       string `json:"expr"`
			Datasource struct {
				UID string `json:"uid"`
			} `json:"datasource"`
		} `json:"targets"`
	} `json:"panels"`
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Type       string `json:"type"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

// collecting is a prometheus.Registerer that keeps the collectors.
type collecting struct{ cs []prometheus.Collector }

func (c *collecting) Register(col prometheus.Collector) error {
	c.cs = append(c.cs, col)
	return nil
}
func (c *collecting) MustRegister(cols ...prometheus.Collector) { c.cs = append(c.cs, cols...) }
func (c *collecting) Unregister(prometheus.Collector) bool      { return false }

// exportedMetrics returns the names of the metrics vipcast's binaries
// register, as the metrics reference lists them (speakerMetrics,
// ccmMetrics: the constructors the binaries call).
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, m := range append(speakerMetrics(t), ccmMetrics(t)...) {
		out[m.name] = true
	}
	return out
}

// selector finds the metric names of PromQL selectors — the dashboard
// writes every one with a label matcher ({namespace=~"$namespace"}) — and
// of a template variable's label_values(metric, label).
var selector = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{|label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,`)

// TestDashboardQueriesExportedMetrics: every metric the chart's Grafana
// dashboard queries is one vipcast-ccm or vipcast-speaker exports, every
// panel and query uses the dashboard's data source variable, and the
// panels cover sessions, prefixes, allocation errors, pool use and sync
// time.
func TestDashboardQueriesExportedMetrics(t *testing.T) {
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("the dashboard is not valid JSON: %v", err)
	}
	exported := exportedMetrics(t)
	if len(exported) < 15 {
		t.Fatalf("found only %d exported metrics: %v", len(exported), exported)
	}
	var queries []string
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		if p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: data source %q, want the variable ${datasource}", p.Title, p.Datasource.UID)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q queries nothing", p.Title)
		}
		for _, q := range p.Targets {
			if q.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q: a query's data source %q, want ${datasource}", p.Title, q.Datasource.UID)
			}
			queries = append(queries, q.Expr)
		}
	}
	for _, v := range d.Templating.List {
		if v.Type == "query" {
			queries = append(queries, v.Definition)
		}
	}
	used := map[string]bool{}
	for _, q := range queries {
		names := selector.FindAllStringSubmatch(q, -1)
		if len(names) == 0 {
			t.Errorf("query %q selects no metric", q)
		}
		for _, m := range names {
			name := m[1] + m[2] // one of the two is empty
			base := name
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if b, ok := strings.CutSuffix(name, suffix); ok && exported[b] {
					base = b
				}
			}
			if !exported[base] {
				t.Errorf("query %q uses %s, which no vipcast binary exports", q, name)
			}
			used[base] = true
		}
	}
	for _, want := range []string{
		"vipcast_bgp_session_up", "vipcast_bgp_announced_prefixes", "vipcast_speaker_announced_prefixes",
		"vipcast_ipam_allocation_errors_total", "vipcast_ipam_pool_in_use_addresses", "vipcast_ipam_pool_capacity_addresses",
		"vipcast_speaker_sync_duration_seconds",
	} {
		if !used[want] {
			t.Errorf("no panel shows %s", want)
		}
	}
	var unused []string
	for m := range exported {
		if !used[m] {
			unused = append(unused, m)
		}
	}
	slices.Sort(unused)
	t.Logf("%d metrics on the dashboard; not shown: %v", len(used), unused)
}

// TestRenderGrafanaDashboard: no ConfigMap by default; enabled, one with
// the sidecar's label, in the namespace asked for, holding the dashboard.
func TestRenderGrafanaDashboard(t *testing.T) {
	if got := render(t, "").Find("ConfigMap", "vipcast-dashboard"); len(got) != 0 {
		t.Errorf("default values render %d dashboard ConfigMaps, want none", len(got))
	}
	r := render(t, "grafanaDashboard: {enabled: true, namespace: monitoring, annotations: {grafana_folder: Network}}\n")
	cms := r.Find("ConfigMap", "vipcast-dashboard")
	if len(cms) != 1 {
		t.Fatalf("%d dashboard ConfigMaps, want 1", len(cms))
	}
	cm := cms[0]
	if cm.GetNamespace() != "monitoring" || cm.GetLabels()["grafana_dashboard"] != "1" || cm.GetAnnotations()["grafana_folder"] != "Network" {
		t.Errorf("namespace %q labels %v annotations %v, want monitoring, grafana_dashboard=1, grafana_folder=Network",
			cm.GetNamespace(), cm.GetLabels(), cm.GetAnnotations())
	}
	file, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var got, want any
	embedded, _ := cm.Object["data"].(map[string]any)["vipcast.json"].(string)
	if err := json.Unmarshal([]byte(embedded), &got); err != nil {
		t.Fatalf("the ConfigMap's dashboard is not JSON: %v", err)
	}
	if err := json.Unmarshal(file, &want); err != nil {
		t.Fatal(err)
	}
	if !equalJSON(got, want) {
		t.Error("the ConfigMap's dashboard differs from dashboards/vipcast.json")
	}
}

func equalJSON(a, b any) bool {
	x, err1 := json.Marshal(a)
	y, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && string(x) == string(y)
}
