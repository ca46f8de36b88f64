package routers

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/vipcast/vipcast/test/harness"
)

// FRRBfdd is FRR's BFD daemon, as installed by Debian's frr package.
const FRRBfdd = "/usr/lib/frr/bfdd"

// BFD is the BFD timers a router runs a session with.
type BFD struct {
	// MinTx is the desired minimum transmit interval, MinRx the required
	// minimum receive interval (whole milliseconds).
	MinTx, MinRx time.Duration
	// Multiplier is the detect multiplier.
	Multiplier int
	// Auth, when set, authenticates the session's packets (BIRD only:
	// FRR's bfdd has no BFD authentication).
	Auth *BFDAuth
}

// BFDAuth is a BFD authentication as BIRD configures it.
type BFDAuth struct {
	// Meticulous selects Meticulous Keyed SHA1 instead of Keyed SHA1.
	Meticulous bool
	// KeyID and Key are the key's ID and the shared key.
	KeyID int
	Key   string
}

// birdAuth renders the authentication lines of a BIRD bfd block.
func (a *BFDAuth) birdAuth() string {
	if a == nil {
		return ""
	}
	kind := "keyed sha1"
	if a.Meticulous {
		kind = "meticulous keyed sha1"
	}
	return fmt.Sprintf(" authentication %s; password %q { id %d; };", kind, a.Key, a.KeyID)
}

// bfdProfile is the name of neighbor i's BFD profile in bfdd.conf.
func bfdProfile(i int) string { return fmt.Sprintf("n%d", i) }

// bfddConfig renders bfdd.conf: a profile per neighbor with BFD.
func bfddConfig(cfg FRRConfig) string {
	var b strings.Builder
	b.WriteString("bfd\n")
	for i, n := range cfg.Neighbors {
		if n.BFD == nil {
			continue
		}
		fmt.Fprintf(&b, " profile %s\n  receive-interval %d\n  transmit-interval %d\n  detect-multiplier %d\n !\n",
			bfdProfile(i), n.BFD.MinRx.Milliseconds(), n.BFD.MinTx.Milliseconds(), n.BFD.Multiplier)
	}
	b.WriteString("!\n")
	return b.String()
}

// checkBFD fails the test when cfg asks for BFD FRR cannot run: without
// zebra (bgpd reaches bfdd through it), or with authentication (bfdd has
// none; test it with BIRD).
func (cfg FRRConfig) checkBFD(t harness.T) {
	t.Helper()
	if cfg.hasBFD() && !cfg.Zebra {
		t.Fatal("frr: BFD requires Netns and Zebra: bgpd reaches bfdd through zebra")
	}
	for _, n := range cfg.Neighbors {
		if n.BFD != nil && n.BFD.Auth != nil {
			t.Fatal("frr: bfdd has no BFD authentication; test it with BIRD")
		}
	}
}

// hasBFD reports whether a neighbor of cfg runs BFD.
func (cfg FRRConfig) hasBFD() bool {
	for _, n := range cfg.Neighbors {
		if n.BFD != nil {
			return true
		}
	}
	return false
}

// startBfdd starts bfdd for f inside f's namespace, connected to its zebra
// (bgpd registers its BFD sessions through zebra).
func (f *FRR) startBfdd(t harness.T, cfg FRRConfig) {
	t.Helper()
	requireBinaries(t, FRRBfdd)
	conf := filepath.Join(f.Dir, "bfdd.conf")
	if err := os.WriteFile(conf, []byte(bfddConfig(cfg)), 0o644); err != nil {
		t.Fatalf("bfdd: %v", err)
	}
	f.bfdd = startDaemon(t, "bfdd "+f.Netns, filepath.Join(f.Dir, "bfdd.log"), func() bool {
		_, err := os.Stat(filepath.Join(f.Dir, "bfdd.vty"))
		return err == nil
	}, f.inNetns(FRRBfdd, "-f", conf, "-i", filepath.Join(f.Dir, "bfdd.pid"), "-z", f.zserv(),
		"--vty_socket", f.Dir, "--bfdctl", filepath.Join(f.Dir, "bfdd.sock"), "-A", "127.0.0.1", "-P", "0")...)
}

// FreezeBfdd stops bfdd (SIGSTOP) so that its BFD sessions fall silent
// while bgpd carries on; ThawBfdd resumes it.
func (f *FRR) FreezeBfdd() { f.bfdd.Signal(syscall.SIGSTOP) }

// ThawBfdd resumes a frozen bfdd.
func (f *FRR) ThawBfdd() { f.bfdd.Signal(syscall.SIGCONT) }

// BFDPeer is one BFD session as FRR's bfdd shows it.
type BFDPeer struct {
	Peer, Local netip.Addr
	Multihop    bool
	// Status is up, down, init or shutdown.
	Status string
	// Diagnostic and RemoteDiagnostic are the diagnostics in words ("ok",
	// "control detection time expired", "administratively down", ...).
	Diagnostic, RemoteDiagnostic string
	ID, RemoteID                 uint32
	// Intervals: this side's and the remote side's.
	ReceiveInterval, TransmitInterval             time.Duration
	RemoteReceiveInterval, RemoteTransmitInterval time.Duration
	DetectMultiplier, RemoteDetectMultiplier      int
	// Counters.
	SessionUpEvents, SessionDownEvents  int
	ControlPacketsIn, ControlPacketsOut int
}

// BFDPeers returns bfdd's sessions with their counters.
func (f *FRR) BFDPeers() ([]BFDPeer, error) {
	var peers []struct {
		Multihop   bool   `json:"multihop"`
		Peer       string `json:"peer"`
		Local      string `json:"local"`
		ID         uint32 `json:"id"`
		RemoteID   uint32 `json:"remote-id"`
		Status     string `json:"status"`
		Diag       string `json:"diagnostic"`
		RemoteDiag string `json:"remote-diagnostic"`
		RxMs       int64  `json:"receive-interval"`
		TxMs       int64  `json:"transmit-interval"`
		RemoteRxMs int64  `json:"remote-receive-interval"`
		RemoteTxMs int64  `json:"remote-transmit-interval"`
		Mult       int    `json:"detect-multiplier"`
		RemoteMult int    `json:"remote-detect-multiplier"`
	}
	if err := f.VtyshJSON("show bfd peers json", &peers); err != nil {
		return nil, err
	}
	var counters []struct {
		Peer     string `json:"peer"`
		In       int    `json:"control-packet-input"`
		Out      int    `json:"control-packet-output"`
		Up       int    `json:"session-up"`
		Down     int    `json:"session-down"`
		Multihop bool   `json:"multihop"`
	}
	if err := f.VtyshJSON("show bfd peers counters json", &counters); err != nil {
		return nil, err
	}
	out := make([]BFDPeer, 0, len(peers))
	for _, p := range peers {
		peer, err := netip.ParseAddr(p.Peer)
		if err != nil {
			return nil, fmt.Errorf("bfdd peer %q: %w", p.Peer, err)
		}
		local, _ := netip.ParseAddr(p.Local)
		ms := func(v int64) time.Duration { return time.Duration(v) * time.Millisecond }
		bp := BFDPeer{Peer: peer, Local: local, Multihop: p.Multihop, Status: p.Status, Diagnostic: p.Diag, RemoteDiagnostic: p.RemoteDiag,
			ID: p.ID, RemoteID: p.RemoteID, ReceiveInterval: ms(p.RxMs), TransmitInterval: ms(p.TxMs),
			RemoteReceiveInterval: ms(p.RemoteRxMs), RemoteTransmitInterval: ms(p.RemoteTxMs),
			DetectMultiplier: p.Mult, RemoteDetectMultiplier: p.RemoteMult}
		for _, c := range counters {
			if c.Peer == p.Peer && c.Multihop == p.Multihop {
				bp.ControlPacketsIn, bp.ControlPacketsOut, bp.SessionUpEvents, bp.SessionDownEvents = c.In, c.Out, c.Up, c.Down
			}
		}
		out = append(out, bp)
	}
	return out, nil
}

// BFDPeer returns bfdd's session with addr.
func (f *FRR) BFDPeer(addr netip.Addr) (BFDPeer, error) {
	peers, err := f.BFDPeers()
	if err != nil {
		return BFDPeer{}, err
	}
	for _, p := range peers {
		if p.Peer == addr {
			return p, nil
		}
	}
	return BFDPeer{}, fmt.Errorf("bfdd has no session with %s (%d sessions)", addr, len(peers))
}

// WaitBFDUp waits until bfdd's session with addr is up.
func (f *FRR) WaitBFDUp(addr netip.Addr, timeout time.Duration) error {
	var last BFDPeer
	var err error
	if waitFor(timeout, func() bool {
		last, err = f.BFDPeer(addr)
		return err == nil && last.Status == "up"
	}) {
		return nil
	}
	return fmt.Errorf("bfdd: session with %s not up after %s (%+v, err %v)", addr, timeout, last, err) //nolint:errorlint // err may be nil
}

// SetBFD changes the BFD timers of the neighbor at addr at run time (its
// profile in bfdd), as an operator would with vtysh.
func (f *FRR) SetBFD(addr netip.Addr, b BFD) error {
	for i, n := range f.neighbors {
		if n.Address != addr || n.BFD == nil {
			continue
		}
		_, err := f.Vtysh("configure terminal", "bfd", "profile "+bfdProfile(i),
			fmt.Sprintf("receive-interval %d", b.MinRx.Milliseconds()),
			fmt.Sprintf("transmit-interval %d", b.MinTx.Milliseconds()),
			fmt.Sprintf("detect-multiplier %d", b.Multiplier))
		return err
	}
	return fmt.Errorf("frr has no BFD neighbor %s", addr)
}
