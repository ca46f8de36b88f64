package ipam

import (
	"errors"
	"fmt"
)

// Reason classifies an allocation error, for Events and metrics.
type Reason string

// The reasons an *Error can carry.
const (
	// ReasonUnknownPool: Request.Pool names no installed pool.
	ReasonUnknownPool Reason = "UnknownPool"
	// ReasonNotInPool: a requested IP is outside every pool, or outside
	// Request.Pool.
	ReasonNotInPool Reason = "NotInPool"
	// ReasonInUse: a requested IP is held by an owner that may not share it.
	ReasonInUse Reason = "IPInUse"
	// ReasonPortClash: the sharing key is equal but ports/protocols clash,
	// or the pod selectors differ while one sharer uses the Local policy.
	ReasonPortClash Reason = "PortClash"
	// ReasonPolicyClash: the sharing key is equal but one Service uses
	// externalTrafficPolicy Local and the other Cluster.
	ReasonPolicyClash Reason = "TrafficPolicyClash"
	// ReasonExhausted: no free address in any eligible pool.
	ReasonExhausted Reason = "PoolExhausted"
	// ReasonNoPool: no pool matches the namespace, selectors or families.
	ReasonNoPool Reason = "NoEligiblePool"
	// ReasonInvalid: a malformed request or pool configuration.
	ReasonInvalid Reason = "InvalidRequest"
	// ReasonOverlap: pools (or entries of one pool) overlap.
	ReasonOverlap Reason = "PoolOverlap"
)

// Error is the error type returned by the allocator. Msg is written for
// humans: it names what is at fault and how to fix it.
type Error struct {
	Reason Reason
	Msg    string
}

// Error returns the message.
func (e *Error) Error() string { return e.Msg }

// ReasonOf returns the Reason of the first *Error in err's chain, or "" if
// there is none.
func ReasonOf(err error) Reason {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason
	}
	return ""
}

func newError(r Reason, format string, args ...any) *Error {
	return &Error{Reason: r, Msg: fmt.Sprintf(format, args...)}
}
