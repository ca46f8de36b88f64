package lab

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// Held is a set of TCP connections (or UDP flows) from the client to a VIP,
// each kept open and exchanging one HTTP request (one datagram) every
// interval, so a test can tell whether established flows survive an event.
// Every flow must keep reaching the pod that answered it first; a UDP flow
// may go unanswered for up to udpBroken, and its pod must keep seeing the
// same client address. A TCP exchange may take up to tcpBroken: a
// connection that is reset or answered by another pod fails at once, and
// one that is black-holed never recovers, while the emulated nodes,
// starved of CPU on a busy host, can hold a healthy connection's answer
// for seconds, and TCP's retransmission backoff stretches a few lost
// segments into more (resent after 0.2, 0.6, 1.4, 3, 6.2, 12.6, 25.4 s).
// A UDP flow's silence has the same causes as a TCP stall (a datagram
// answered after its one-second deadline is lost to the count), and a
// flow moved to another pod or dropped for good still fails. Settle waits
// until every connection has answered again or failed, so a stall cannot
// pass for survival; Stalls reports the slow exchanges, or for UDP the
// unanswered datagrams and the longest silence.
type Held struct {
	udp    bool
	mu     sync.Mutex
	failed map[int]string // connection → what broke it
	rounds []int          // completed exchanges per connection
	// began is when each connection's last completed exchange began.
	began []time.Time
	// stalls counts TCP exchanges that took longer than stallShown;
	// longest is the longest exchange, and longestAt when it ended.
	// For UDP, stalls counts unanswered datagrams and longest is the
	// longest time between two answers of one flow.
	stalls    int
	longest   time.Duration
	longestAt time.Time
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	// onBreak, when set (OnBreak), is called once for each connection
	// that fails, in a goroutine of its own.
	onBreak func(i int, local netip.AddrPort)
}

// OnBreak makes h call fn with a connection's index and local address
// when it fails, so that a test can take the nodes' state for that flow
// while it is still there. Failures before the call are not reported.
func (h *Held) OnBreak(fn func(i int, local netip.AddrPort)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.onBreak = fn
}

// tcpBroken bounds one TCP exchange of a held connection; stallShown is
// the exchange time Stalls counts from.
const (
	tcpBroken  = time.Minute
	stallShown = time.Second
)

// udpBroken is how long a UDP flow may go unanswered: long enough for the
// emulated nodes' stalls of a few seconds (TCP rides them out on
// retransmission; three lost datagrams in a row once failed flows whose
// TCP neighbours stalled 2.6 s), short enough that a flow black-holed for
// good fails well within an event.
const udpBroken = 10 * time.Second

// Hold opens n connections from the client namespace to addr (each
// answered once before Hold returns) and keeps each exchanging a request
// every interval until Stop.
func (l *Lab) Hold(ctx context.Context, addr netip.AddrPort, n int, interval time.Duration) (*Held, error) {
	return l.hold(ctx, "tcp", addr, n, interval)
}

// HoldUDP is Hold with UDP flows: each a socket of its own, answered by the
// pods' UDP echo.
func (l *Lab) HoldUDP(ctx context.Context, addr netip.AddrPort, n int, interval time.Duration) (*Held, error) {
	return l.hold(ctx, "udp", addr, n, interval)
}

func (l *Lab) hold(ctx context.Context, network string, addr netip.AddrPort, n int, interval time.Duration) (*Held, error) {
	ctx, cancel := context.WithCancel(ctx)
	h := &Held{udp: network == "udp", failed: map[int]string{}, rounds: make([]int, n), began: make([]time.Time, n), cancel: cancel}
	conns := make([]*heldConn, 0, n)
	for i := range n {
		c, err := dialHeld(ctx, l, network, addr)
		if err != nil {
			cancel()
			for _, c := range conns {
				_ = c.conn.Close()
			}
			return nil, fmt.Errorf("connection %d of %d to %s: %w", i+1, n, addr, err)
		}
		conns = append(conns, c)
	}
	for i, c := range conns {
		h.wg.Add(1)
		go h.run(ctx, i, c, interval)
	}
	return h, nil
}

// heldConn is one held connection (or UDP flow) and the pod that answers
// on it, with the client address it saw first.
type heldConn struct {
	conn   net.Conn
	r      *bufio.Reader
	host   string
	udp    bool
	pod    string
	client string
}

// dialHeld opens one connection and makes its first exchange (a UDP flow
// gets three tries).
func dialHeld(ctx context.Context, l *Lab, network string, addr netip.AddrPort) (*heldConn, error) {
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := l.ClientNS.DialContext(dctx, network, addr.String())
	if err != nil {
		return nil, err
	}
	c := &heldConn{conn: conn, r: bufio.NewReader(conn), host: addr.String(), udp: network == "udp"}
	for try := 0; try < 3; try++ {
		if c.pod, c.client, err = c.exchange(); err == nil || !c.udp {
			break
		}
	}
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	return c, nil
}

// exchange sends one request (datagram) on the flow and returns the name
// of the pod that answered and the client address it saw.
func (c *heldConn) exchange() (pod, client string, err error) {
	if c.udp {
		return c.exchangeUDP()
	}
	line, err := c.exchangeHTTP()
	pod, client = parseAnswer(line)
	return pod, client, err
}

// parseAnswer splits a pod's answer "POD on NODE, client ADDR".
func parseAnswer(line string) (pod, client string) {
	line = strings.TrimSpace(line)
	pod, _, _ = strings.Cut(line, " ")
	_, client, _ = strings.Cut(line, ", client ")
	return pod, client
}

// exchangeUDP sends one datagram and reads the answer, within a second.
func (c *heldConn) exchangeUDP() (pod, client string, err error) {
	if err := c.conn.SetDeadline(time.Now().Add(time.Second)); err != nil {
		return "", "", err
	}
	if _, err := c.conn.Write([]byte("ping\n")); err != nil {
		return "", "", fmt.Errorf("write: %w", err)
	}
	buf := make([]byte, 1500)
	n, err := c.conn.Read(buf)
	if err != nil {
		return "", "", fmt.Errorf("read: %w", err)
	}
	pod, client = parseAnswer(string(buf[:n]))
	return pod, client, nil
}

// exchangeHTTP sends one request on the connection and returns the
// answer's body.
func (c *heldConn) exchangeHTTP() (string, error) {
	if err := c.conn.SetDeadline(time.Now().Add(tcpBroken)); err != nil {
		return "", err
	}
	if _, err := fmt.Fprintf(c.conn, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", c.host); err != nil {
		return "", fmt.Errorf("write: %w", err)
	}
	resp, err := http.ReadResponse(c.r, nil)
	if err != nil {
		return "", fmt.Errorf("read: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("read body: %w", err)
	}
	return string(b), nil
}

// run exchanges on connection i every interval until ctx ends or the
// connection breaks or reaches another pod.
func (h *Held) run(ctx context.Context, i int, c *heldConn, interval time.Duration) {
	defer h.wg.Done()
	defer func() { _ = c.conn.Close() }()
	t := time.NewTicker(interval)
	defer t.Stop()
	answered := time.Now() // the UDP flow's last answer
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		began := time.Now()
		pod, client, err := c.exchange()
		if ctx.Err() != nil {
			return
		}
		if took := time.Since(began); !c.udp && err == nil {
			h.mu.Lock()
			if took > stallShown {
				h.stalls++
			}
			if took > h.longest {
				h.longest, h.longestAt = took, time.Now()
			}
			h.mu.Unlock()
		}
		if c.udp && errors.Is(err, os.ErrDeadlineExceeded) && time.Since(answered) < udpBroken {
			h.mu.Lock()
			h.stalls++
			h.mu.Unlock()
			continue
		}
		if c.udp && err == nil {
			h.mu.Lock()
			if gap := time.Since(answered); gap > h.longest {
				h.longest, h.longestAt = gap, time.Now()
			}
			h.mu.Unlock()
			answered = time.Now()
		}
		if h.record(i, c, pod, client, began, err) {
			return
		}
	}
}

// record counts connection i's exchange that began at began and was
// answered by pod, which saw client, or failed with err; it reports
// whether the connection has failed, and then tells onBreak.
func (h *Held) record(i int, c *heldConn, pod, client string, began time.Time, err error) (failed bool) {
	h.mu.Lock()
	switch {
	case err != nil:
		h.failed[i] = fmt.Sprintf("at %s after %d exchanges with %s: %v", time.Now().Format("15:04:05.000"), h.rounds[i], c.pod, err)
	case pod != c.pod:
		h.failed[i] = fmt.Sprintf("answered by %s after %d exchanges with %s", pod, h.rounds[i], c.pod)
	case c.udp && client != c.client:
		// A UDP flow is one peer to the pod: a new source address is
		// another flow.
		h.failed[i] = fmt.Sprintf("%s saw the flow from %s after %d exchanges, first from %s", pod, client, h.rounds[i], c.client)
	default:
		h.rounds[i]++
		h.began[i] = began
	}
	failed = h.failed[i] != ""
	onBreak := h.onBreak
	h.mu.Unlock()
	if failed && onBreak != nil {
		local, _ := netip.ParseAddrPort(c.conn.LocalAddr().String())
		go onBreak(i, local)
	}
	return failed
}

// Status returns how many connections are alive, the exchanges they have
// completed, and what broke the others (sorted by connection).
func (h *Held) Status() (alive, exchanges int, broken []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, r := range h.rounds {
		exchanges += r
		if why, ok := h.failed[i]; ok {
			broken = append(broken, fmt.Sprintf("connection %d: %s", i, why))
			continue
		}
		alive++
	}
	return alive, exchanges, broken
}

// Settle waits until every connection has completed an exchange that
// began after the call, or failed: then Status tells survival from a
// stall. It gives up after tcpBroken and a margin, by when a connection
// still stalled has failed.
func (h *Held) Settle(ctx context.Context) {
	mark := time.Now()
	_ = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, tcpBroken+10*time.Second, true, func(context.Context) (bool, error) {
		h.mu.Lock()
		defer h.mu.Unlock()
		for i, b := range h.began {
			if _, failed := h.failed[i]; !failed && !b.After(mark) {
				return false, nil
			}
		}
		return true, nil
	})
}

// Stalls describes the TCP exchanges that took more than a second and the
// longest one, or a UDP set's unanswered datagrams and longest silence:
// figures for a test's log, not failures.
func (h *Held) Stalls() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.longest == 0 {
		return "no exchange yet"
	}
	if h.udp {
		return fmt.Sprintf("%d datagrams unanswered, the longest silence %s, ended %s", h.stalls, h.longest.Round(time.Millisecond), h.longestAt.Format("15:04:05.000"))
	}
	return fmt.Sprintf("%d exchanges over %s, the longest %s, ended %s", h.stalls, stallShown, h.longest.Round(time.Millisecond), h.longestAt.Format("15:04:05.000"))
}

// Stop closes every connection.
func (h *Held) Stop() {
	h.cancel()
	h.wg.Wait()
}

// ErrNoSample is Node.Metric's error when the speaker exports no sample
// of the series (a counter never incremented).
var ErrNoSample = errors.New("no sample")

// Metric reads one sample of the node speaker's /metrics: the value of
// the line that starts with series (a metric name, with its labels if it
// has any).
func (n *Node) Metric(ctx context.Context, series string) (float64, error) {
	url := "http://" + net.JoinHostPort(n.Addr.String(), MetricsPort) + "/metrics"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := httpClient(n.lab.TorNS, controlTimeout).Do(req)
	if err != nil {
		return 0, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		// A collector's error fails the whole scrape: say which.
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return 0, fmt.Errorf("%s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("%s: %w %s", url, ErrNoSample, series)
}

// ConsoleLines returns the lines of the node's console (where its
// speaker's log goes) that contain substr.
func (n *Node) ConsoleLines(substr string) ([]string, error) {
	data, err := os.ReadFile(n.Console)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		if strings.Contains(line, substr) {
			out = append(out, line)
		}
	}
	return out, nil
}

// Stream is a steady stream of requests from the client to a VIP, each on
// a new connection (see Lab.Stream).
type Stream struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	ok     int
	failed []string
}

// Stream sends one request to addr on a new connection every interval
// until Stop, at most maxRequests, counting answers and failures.
func (l *Lab) Stream(ctx context.Context, addr netip.AddrPort, interval time.Duration, maxRequests int) *Stream {
	ctx, cancel := context.WithCancel(ctx)
	s := &Stream{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for i := 0; i < maxRequests; i++ {
			_, err := l.Get(ctx, addr)
			if ctx.Err() != nil {
				return
			}
			s.mu.Lock()
			if err != nil {
				s.failed = append(s.failed, fmt.Sprintf("%s: %v", time.Now().Format("15:04:05.000"), err))
			} else {
				s.ok++
			}
			s.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

// Status returns the answered requests and the failures so far.
func (s *Stream) Status() (ok int, failed []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ok, slices.Clone(s.failed)
}

// Stop ends the stream and returns its final Status.
func (s *Stream) Stop() (ok int, failed []string) {
	s.cancel()
	<-s.done
	return s.Status()
}
