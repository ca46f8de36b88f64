// Command backend is the lab cluster's backend image: it answers HTTP
// requests and UDP datagrams on $PORT (default 8080) with one line naming
// the pod ($POD_NAME), its node ($NODE_NAME) and the client's address as the
// pod sees it — the same line as the agent-based lab's pods, so the lab's
// clients read both alike. On SIGTERM it goes on serving for
// $DRAIN_SECONDS, then stops.
//
// `backend -get URL...` is the in-cluster client instead: one GET of each
// URL (5 s timeout each), the answers printed and written to the
// termination message a line each, exit status 0 only when every one was
// 200 OK. A pod running it tells the lab, through its status alone, what a
// pod inside the cluster reaches; one pod for several URLs spares the
// emulated nodes a pod start each.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) >= 3 && os.Args[1] == "-get" {
		os.Exit(getAll(os.Args[2:]))
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "backend:", err)
		os.Exit(1)
	}
}

func run() error {
	port := os.Getenv("PORT")
	if port == "" {
		port = "8080"
	}
	pod, node := os.Getenv("POD_NAME"), os.Getenv("NODE_NAME")
	if pod == "" {
		// A pod's hostname is its name: a Deployment made by `kubectl
		// create deployment` sets no POD_NAME.
		pod, _ = os.Hostname()
	}
	line := func(client string) string {
		host, _, err := net.SplitHostPort(client)
		if err != nil {
			host = client
		}
		return fmt.Sprintf("%s on %s, client %s\n", pod, node, host)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	pc, err := net.ListenPacket("udp", ":"+port)
	if err != nil {
		return fmt.Errorf("udp: %w", err)
	}
	go func() {
		buf := make([]byte, 1500)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo([]byte(line(from.String())), from)
		}
	}()
	srv := &http.Server{
		Addr: ":" + port,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			// Plain text naming the peer's address, not request content.
			_, _ = fmt.Fprint(w, line(r.RemoteAddr)) //nolint:gosec // G705: see above
		}),
		ReadHeaderTimeout: 5 * time.Second,
	}
	errs := make(chan error, 1)
	go func() { errs <- srv.ListenAndServe() }()
	select {
	case err := <-errs:
		return fmt.Errorf("http: %w", err)
	case <-ctx.Done():
	}
	// Terminating: go on serving for $DRAIN_SECONDS (default 0), as a
	// backend with a preStop delay does while the endpoint controllers
	// and load balancers take it out, then finish the requests in flight.
	if d, err := time.ParseDuration(os.Getenv("DRAIN_SECONDS") + "s"); err == nil && d > 0 {
		time.Sleep(d)
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = pc.Close()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}

// getAll fetches each of urls once and reports the answers (or errors), a
// line each in order, on standard output and in /dev/termination-log; its
// exit status is 1 if any failed.
func getAll(urls []string) int {
	lines, code := make([]string, 0, len(urls)), 0
	for _, url := range urls {
		msg, ok := get(url)
		if !ok {
			code = 1
		}
		lines = append(lines, msg)
	}
	msg := strings.Join(lines, "\n")
	fmt.Println(msg)
	_ = os.WriteFile("/dev/termination-log", []byte(msg), 0o644) //nolint:gosec // the kubelet's file
	return code
}

// get fetches url once and returns the answer's body, or the error, on
// one line, and whether it was 200 OK.
func get(url string) (string, bool) {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url) //nolint:noctx,gosec // one bounded request to the URL the test gave
	if err != nil {
		return strings.ReplaceAll(err.Error(), "\n", " "), false
	}
	body, rerr := io.ReadAll(io.LimitReader(resp.Body, 4096))
	_ = resp.Body.Close()
	msg := strings.ReplaceAll(strings.TrimSpace(string(body)), "\n", " ")
	if rerr != nil || resp.StatusCode != http.StatusOK {
		return fmt.Sprintf("%s: %s %v", resp.Status, msg, rerr), false
	}
	return msg, true
}
