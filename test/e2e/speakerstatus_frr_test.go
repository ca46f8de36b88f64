//go:build routing

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/test/ccmtest"
)

// speakerStatus reads a node's SpeakerStatus.
func (e *env) speakerStatus(node string) (*vipcastv1alpha1.SpeakerStatus, error) {
	u, err := e.CP.Dynamic.Resource(vipcastv1alpha1.SpeakerStatusesResource).Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	var s vipcastv1alpha1.SpeakerStatus
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &s); err != nil {
		return nil, fmt.Errorf("decoding SpeakerStatus %s: %w", node, err)
	}
	return &s, nil
}

// waitSpeakerStatus waits until node's SpeakerStatus satisfies ok.
func (e *env) waitSpeakerStatus(node, what string, ok func(vipcastv1alpha1.SpeakerStatusStatus) bool) {
	e.T.Helper()
	e.Eventually(30*time.Second, "SpeakerStatus "+node+" "+what, func() (bool, error) {
		s, err := e.speakerStatus(node)
		if err != nil {
			return false, err
		}
		return ok(s.Status), fmt.Errorf("status %+v", s.Status)
	})
}

// TestSpeakerStatus: the speaker on node-a writes its SpeakerStatus, owned
// by its Node: the FRR session Established with the prefixes it sent, the
// count and sample of prefixes announced, and a Local Service without an
// endpoint on node-a counted as not announced; `kubectl vipcast why` says
// why, computed from the objects; the counts follow when an endpoint lands
// on node-a.
func TestSpeakerStatus(t *testing.T) {
	e := newEnv(t)
	frr, _, spk := e.announcedPool(`{}`)
	vip := e.servedService() // Cluster, an endpoint on node-b: announced
	e.createService(ccmtest.LBService("web", "local", withLocal()))
	e.endpoints("web", "local", endpoint{node: "node-b", ip: "10.244.2.6", ready: true})
	local := e.waitVIP("web", "local")
	e.waitTable("FRR", frr, map[string]route{vip.String() + "/32": {nextHop: "10.0.0.2"}})

	const why = "externalTrafficPolicy Local and no ready endpoint on this node"
	e.waitSpeakerStatus("node-a", "with the session, web/a announced and web/local not", func(st vipcastv1alpha1.SpeakerStatusStatus) bool {
		return st.SessionsConfigured == 1 && st.SessionsEstablished == 1 && len(st.Sessions) == 1 &&
			st.Sessions[0].State == "Established" && st.Sessions[0].PrefixesSent == 1 && st.Sessions[0].Since != nil &&
			slices.Equal(st.Announced, []string{vip.String() + "/32"}) && st.AnnouncedCount == 1 &&
			st.NotAnnouncedCount == 1 && st.ServesClassless && st.LastUpdateTime != nil
	})
	// The plugin, through the real kubectl's plugin lookup.
	e.kubectlWants([]string{"vipcast", "why", "web/local"},
		"Service web/local: VIPs "+local.String()+", externalTrafficPolicy Local",
		"node-a  -          -         "+why)
	e.kubectlWants([]string{"vipcast", "-n", "web", "why", "a"},
		"node-a  "+vip.String()+"/32  10.0.0.2  -")
	e.kubectlWants([]string{"vipcast", "peers"}, "NODE    frr", "node-a  Established")

	s, err := e.speakerStatus("node-a")
	if err != nil {
		t.Fatal(err)
	}
	node, err := e.CP.Client.CoreV1().Nodes().Get(context.Background(), "node-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if o := s.OwnerReferences; len(o) != 1 || o[0].Kind != "Node" || o[0].Name != "node-a" || o[0].UID != node.UID {
		t.Errorf("owner references %+v, want the Node node-a (UID %s)", o, node.UID)
	}

	e.endpoints("web", "local", endpoint{node: "node-a", ip: "10.244.1.6", ready: true})
	e.waitSpeakerStatus("node-a", "with both Services announced", func(st vipcastv1alpha1.SpeakerStatusStatus) bool {
		return slices.Equal(st.Announced, slices.Sorted(slices.Values([]string{vip.String() + "/32", local.String() + "/32"}))) &&
			st.NotAnnouncedCount == 0 && st.Sessions[0].PrefixesSent == 2
	})
	e.kubectlWants([]string{"vipcast", "why", "web/local"}, "node-a  "+local.String()+"/32  10.0.0.2  -")

	// What `kubectl get speakerstatuses.vipcast.io` prints: the API
	// server's Table with the CRD's printer columns.
	raw, err := e.CP.Client.Discovery().RESTClient().Get().AbsPath("/apis/vipcast.io/v1alpha1/speakerstatuses").
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").DoRaw(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var table metav1.Table
	if err := json.Unmarshal(raw, &table); err != nil {
		t.Fatal(err)
	}
	var cols []string
	for _, c := range table.ColumnDefinitions {
		cols = append(cols, c.Name)
	}
	if want := []string{"Name", "Established", "Sessions", "Announced", "Not Announced", "Refused", "Updated"}; !slices.Equal(cols, want) {
		t.Errorf("columns %v, want %v", cols, want)
	}
	if len(table.Rows) != 1 || fmt.Sprint(table.Rows[0].Cells[:6]) != "[node-a 1 1 2 0 0]" {
		t.Errorf("rows %+v, want node-a with 1 of 1 sessions, 2 prefixes announced, 0 Services not", table.Rows)
	}

	// The CCM counts the Ready nodes with the session on the BGPPeer.
	e.waitPeerSessions("frr", 1, 1)
	// A speaker stopped gracefully says so last: sessions Idle, nothing
	// announced; the BGPPeer counts no node Established.
	spk.Stop(10 * time.Second)
	e.waitSpeakerStatus("node-a", "saying the speaker stopped", func(st vipcastv1alpha1.SpeakerStatusStatus) bool {
		return st.SessionsConfigured == 1 && st.SessionsEstablished == 0 && len(st.Sessions) == 1 &&
			st.Sessions[0].State == "Idle" && st.Sessions[0].LastError == "vipcast-speaker stopped" &&
			st.AnnouncedCount == 0 && len(st.Announced) == 0
	})
	e.waitPeerSessions("frr", 1, 0)
}
