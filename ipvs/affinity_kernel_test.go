//go:build kernel

package ipvs

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

// testMoveClientIP is sessionAffinity ClientIP through the two tiers, as
// the speaker programs it: tier 1 with mh without port hashing and no
// persistence, tier 2 drawing the slot from a hash of the client's address
// (Service.Affinity). affinityConns connections of one client, each from
// its own source port, half through node A and half through node B (ECMP
// spreads a client's connections over the nodes), must all reach one pod.
// The control, the same Service without affinity (mh with the port, tier
// 2's random slot), must spread them over more than one pod, or the test
// could not fail.
//
// Then the nodes' tables differ for a moment, as when an endpoint is ready
// in one node's view before the other's: node A's tier 1 has only node
// 0's endpoints and node B's only node 1's, and the client connects
// through each; then both have both. Affinity must hold from then on. The
// control is the design this replaced, IPVS persistence on tier 1: each
// node keeps the node its own table named, and the client's connections
// split between two pods for the persistence's whole timeout.
//
// For an IPv4 VIP and an IPv6 one (tier 1 in 6in4; tier 2's hash of a
// 16-byte address).
func testMoveClientIP(t *testing.T) { eachFamily(t, moveClientIP) }

func moveClientIP(t *testing.T, v6 bool) {
	f := newMoveFabricFamily(t, v6)
	affine := func(st State, persistent uint32) State {
		for k, s := range st.Services {
			s.Scheduler, s.Flags, s.Persistent, s.Affinity = DefaultScheduler, FlagMHFallback, persistent, true
			st.Services[k] = s
		}
		return st
	}
	// only leaves tier 1 node keep alone: the other's weight is 0.
	only := func(st State, keep int) State {
		for k, s := range st.Services {
			s.Backends = slices.Clone(s.Backends)
			for i := range s.Backends {
				if s.Backends[i].Addr != f.tunnelAddr(keep) {
					s.Backends[i].Weight = 0
				}
			}
			st.Services[k] = s
		}
		return st
	}
	var ds [2]*Dataplane
	for n := range f.nodes {
		ds[n], _ = twoTierNode(t, f, n)
	}
	sync := func(name string, state func(n int) State) {
		t.Helper()
		for n, d := range ds {
			if _, err := d.Sync(state(n)); err != nil {
				t.Fatalf("%s: node %d: Sync: %v", name, n, err)
			}
		}
	}
	connect := func(name string, conns int) map[string]int {
		t.Helper()
		perPod := map[string]int{}
		for i := range conns {
			f.steer(t, i%2)
			pod, err := f.greeting(t)
			if err != nil {
				t.Fatalf("%s: connection %d: %v", name, i, err)
			}
			perPod[pod]++
		}
		return perPod
	}
	for _, tc := range []struct {
		name   string
		affine bool
	}{{"without affinity (control)", false}, {"ClientIP", true}} {
		sync(tc.name, func(n int) State {
			if tc.affine {
				return affine(f.twoTierState(n), 0)
			}
			return f.twoTierState(n)
		})
		perPod := connect(tc.name, affinityConns)
		t.Logf("%s: %d connections of one client, through both nodes, per pod: %v", tc.name, affinityConns, perPod)
		switch {
		case tc.affine && len(perPod) != 1:
			t.Errorf("%s: one client's connections reached %d pods %v, want one", tc.name, len(perPod), perPod)
		case !tc.affine && len(perPod) < 2:
			t.Errorf("%s: every connection reached %v: without affinity they must spread, or the ClientIP case proves nothing", tc.name, perPod)
		}
	}
	for _, tc := range []struct {
		name       string
		persistent uint32
	}{{"tables differed, tier-1 persistence (control)", 600}, {"tables differed", 0}} {
		// A fresh virtual server: no persistence template left from before.
		sync(tc.name+": reset", func(int) State { return State{} })
		sync(tc.name+": differing tables", func(n int) State { return affine(only(f.twoTierState(n), n), tc.persistent) })
		connect(tc.name+": through each node", 2)
		sync(tc.name+": same tables", func(n int) State { return affine(f.twoTierState(n), tc.persistent) })
		perPod := connect(tc.name, affinityConns)
		t.Logf("%s: %d connections of one client, through both nodes, per pod: %v", tc.name, affinityConns, perPod)
		switch {
		case tc.persistent == 0 && len(perPod) != 1:
			t.Errorf("%s: one client's connections reached %d pods %v, want one", tc.name, len(perPod), perPod)
		case tc.persistent > 0 && len(perPod) < 2:
			t.Errorf("%s: every connection reached %v: with tier-1 persistence each node must keep its own node, or this case proves nothing", tc.name, perPod)
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
