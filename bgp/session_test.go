//go:build routing

package bgp_test

import (
	"context"
	"testing"
	"time"

	"github.com/vipcast/vipcast/bgp"
	"github.com/vipcast/vipcast/test/routers"
)

// TestStopWithGracefulRestart checks that Stop makes the router drop the
// routes at once even though graceful restart is negotiated.
func TestStopWithGracefulRestart(t *testing.T) {
	self := ip("127.0.8.2")
	f := routers.StartFRR(t, routers.FRRConfig{ASN: routerASN, ListenAddress: ip("127.0.8.1"), GracefulRestart: true,
		Neighbors: []routers.FRRNeighbor{{Address: self, ASN: localASN}}})
	s, _ := newSpeaker(t, self.String())
	if err := s.SetPeers(ctxT(), []bgp.Peer{{Name: "frr", Address: f.Address, Port: uint16(f.Port), ASN: routerASN, LocalASN: localASN,
		SourceAddress: self, GracefulRestart: true, RestartTime: 120 * time.Second}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(ctxT(), []bgp.Route{
		{Prefix: pfx("10.8.0.1/32"), NextHop: ip("10.0.0.2")},
		{Prefix: pfx("fd00:8::1/128"), NextHop: ip("fd00::2")},
	}, nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "FRR receives the routes", func() bool {
		n, err := f.PrefixCount(self)
		return err == nil && n == 2
	})
	var nbr map[string]struct {
		GR struct {
			Remote string `json:"remoteGrMode"`
			Timers struct {
				Received int `json:"receivedRestartTimer"`
			} `json:"timers"`
		} `json:"gracefulRestartInfo"`
	}
	if err := f.VtyshJSON("show bgp neighbors "+self.String()+" json", &nbr); err != nil {
		t.Fatal(err)
	}
	if gr := nbr[self.String()].GR; gr.Remote != "Restart" || gr.Timers.Received != 120 {
		t.Fatalf("FRR's view of graceful restart = %+v, want remote mode Restart with 120 s", gr)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Second, "FRR drops the routes within 1 s of Stop", func() bool {
		n, err := f.PrefixCount(self)
		return err == nil && n == 0
	})
	t.Logf("routes gone %s after Stop", time.Since(start).Round(time.Millisecond))
	if err := s.Stop(ctx); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	if err := s.Apply(ctx, nil, nil); err == nil {
		t.Errorf("Apply after Stop succeeded")
	}
}

// TestSessionCallback checks that OnSessionChange reports Established,
// then a non-Established state with a reason when the router dies.
func TestSessionCallback(t *testing.T) {
	self := ip("127.0.9.2")
	f := routers.StartFRR(t, routers.FRRConfig{ASN: routerASN, ListenAddress: ip("127.0.9.1"),
		Neighbors: []routers.FRRNeighbor{{Address: self, ASN: localASN}}})
	s, ev := newSpeaker(t, self.String())
	if err := s.SetPeers(ctxT(), []bgp.Peer{{Name: "frr", Address: f.Address, Port: uint16(f.Port), ASN: routerASN, LocalASN: localASN,
		SourceAddress: self}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "an Established event", func() bool {
		for _, e := range ev.all() {
			if e.Established() {
				return true
			}
		}
		return false
	})
	f.Kill()
	var down bgp.SessionState
	eventually(t, 5*time.Second, "a non-Established event with a reason after the router died", func() bool {
		l := ev.all()
		down = l[len(l)-1]
		return !down.Established() && down.Reason != ""
	})
	if down.Peer != "frr" || down.Address != f.Address || down.Since.IsZero() || down.Transitions == 0 {
		t.Errorf("event = %+v", down)
	}
	for _, e := range ev.all() {
		t.Logf("event: %s %s reason %q", e.Peer, e.State, e.Reason)
	}
	ss, err := s.Sessions(ctxT())
	if err != nil || len(ss) != 1 || ss[0].Established() || ss[0].Reason == "" {
		t.Errorf("Sessions = %+v, %v; want one down session with a reason", ss, err)
	}
}
