//go:build kernel

package ipvs

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// testMoveClientIP is sessionAffinity ClientIP through the two tiers, as
// the speaker programs it: tier 1 with mh without port hashing and
// persistence, tier 2 drawing the slot from a hash of the client's
// address. affinityConns connections of one client, each from its own
// source port, half through node A and half through node B (ECMP spreads
// a client's connections over the nodes), must all reach one pod. The
// control, the same Service without affinity (mh with the port, tier 2's
// random slot), must spread them over more than one pod, or the test
// could not fail.
func testMoveClientIP(t *testing.T) {
	f := newMoveFabric(t)
	affine := func(st State) State {
		for k, s := range st.Services {
			s.Scheduler, s.Flags, s.Persistent = DefaultScheduler, FlagMHFallback, 600
			st.Services[k] = s
		}
		return st
	}
	var ds [2]*Dataplane
	for n := range f.nodes {
		ds[n], _ = twoTierNode(t, f, n)
	}
	for _, tc := range []struct {
		name   string
		affine bool
	}{{"without affinity (control)", false}, {"ClientIP", true}} {
		for n, d := range ds {
			st := f.twoTierState(n)
			if tc.affine {
				st = affine(st)
			}
			if _, err := d.Sync(st); err != nil {
				t.Fatalf("%s: node %d: Sync: %v", tc.name, n, err)
			}
		}
		perPod := map[string]int{}
		for i := range affinityConns {
			f.steer(t, i%2)
			pod, err := f.greeting(t)
			if err != nil {
				t.Fatalf("%s: connection %d: %v", tc.name, i, err)
			}
			perPod[pod]++
		}
		t.Logf("%s: %d connections of one client, through both nodes, per pod: %v", tc.name, affinityConns, perPod)
		switch {
		case tc.affine && len(perPod) != 1:
			t.Errorf("%s: one client's connections reached %d pods %v, want one", tc.name, len(perPod), perPod)
		case !tc.affine && len(perPod) < 2:
			t.Errorf("%s: every connection reached %v: without affinity they must spread, or the ClientIP case proves nothing", tc.name, perPod)
		}
	}
}

// affinityConns is how many connections testMoveClientIP opens per case.
const affinityConns = 20

// greeting opens a TCP connection from the client to the VIP and returns
// the pod its greeting names; it closes the connection.
func (f *moveFabric) greeting(t *testing.T) (string, error) {
	t.Helper()
	to := netip.AddrPortFrom(f.vip, movePort)
	var nc net.Conn
	if err := inNS(t, f.client, func() (err error) {
		nc, err = net.DialTimeout(f.network("tcp"), to.String(), 5*time.Second)
		return err
	}); err != nil {
		return "", err
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(3 * time.Second))
	line, err := bufio.NewReader(nc).ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("greeting: %w", err)
	}
	pod, _, _ := strings.Cut(strings.TrimSpace(line), " ")
	return pod, nil
}
