package bgptest

import (
	"testing"
	"time"
)

// AttackRun bounds and checks RawPeer.Attack.
type AttackRun struct {
	// Settle is how long to wait after each message for the speaker to
	// reset the session.
	Settle time.Duration
	// Reconnect is how long the speaker has to establish the session
	// again after a reset.
	Reconnect time.Duration
	// Budget ends the run early: the messages left are not sent. Zero
	// means no limit.
	Budget time.Duration
	// Verbose logs every message's outcome; otherwise only resets are
	// counted and the advisories logged by the caller.
	Verbose bool
	// Check is called after every message; an error fails the test at
	// once, naming the message. It is where the caller asserts that the
	// speaker is alive and that its other sessions are untouched.
	Check func(Attack, Outcome) error
}

// AttackResult summarises a run.
type AttackResult struct {
	// Sent is how many messages went out; Kept how many left the session
	// up, Reset how many made the speaker close it.
	Sent, Kept, Reset int
	// Outcomes holds each sent message's outcome, in order.
	Outcomes []Outcome
}

// Attack sends attacks one by one, each on an established session
// (waiting for the speaker to come back after a reset), and checks after
// each one. The attacking session may reset; the run fails when the
// speaker does not establish it again within run.Reconnect, or when
// run.Check fails.
func (p *RawPeer) Attack(tb testing.TB, attacks []Attack, run AttackRun) AttackResult {
	tb.Helper()
	var res AttackResult
	start := time.Now()
	for _, a := range attacks {
		if run.Budget > 0 && time.Since(start) > run.Budget {
			tb.Logf("attack budget of %s spent: %d of %d messages sent", run.Budget, res.Sent, len(attacks))
			break
		}
		if err := p.WaitEstablished(run.Reconnect); err != nil {
			tb.Fatalf("before %q: %v", a.Name, err)
		}
		o, err := p.Send(a.Msg, run.Settle)
		if err != nil {
			tb.Fatalf("%q: %v", a.Name, err)
		}
		res.Sent++
		res.Outcomes = append(res.Outcomes, o)
		if o.Kept {
			res.Kept++
		} else {
			res.Reset++
		}
		if run.Verbose {
			if a.Advisory != "" {
				tb.Logf("%s [%s]: %s", a.Name, a.Advisory, o)
			} else {
				tb.Logf("%s: %s", a.Name, o)
			}
		}
		if run.Check != nil {
			if err := run.Check(a, o); err != nil {
				tb.Fatalf("after %q (%s; message %x): %v", a.Name, o, a.Msg, err)
			}
		}
	}
	return res
}
