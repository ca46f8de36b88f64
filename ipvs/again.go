package ipvs

import (
	"errors"
	"fmt"
	"slices"
	"syscall"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// A real server added again (BackendChange.Again) is deleted and added
// back so that IPVS mh, which builds its table in the order the real
// servers were added, gets the one order every node uses (see diffService).
// Its connections survive it only if it is back before the kernel looks:
// with net.ipv4.vs.expire_nodest_conn=1, a deletion queues work that runs
// one jiffy later (1 to 10 ms) and expires every connection whose real
// server is away at that moment. Sent as two commands, the real server is
// away for a round trip to user space and whatever preempts the speaker
// between them, which on a loaded node is longer than a jiffy. againDest
// sends both in one netlink message, which the kernel processes in one
// system call: the real server is away only for the kernel's own work
// between the two commands.

// againDest deletes the real server b of virtual server k and adds it
// back, in one netlink message (see above). An absent b is just added; a
// b the deletion left (it failed) is updated.
func (d *Dataplane) againDest(k Key, b Backend) error {
	g := d.tiers.genl()
	if g == nil {
		return errNoGenl
	}
	var msg []byte
	var seqs [2]uint32
	for i, cmd := range [2]uint8{ipvsCmdDelDest, ipvsCmdNewDest} {
		req := nl.NewNetlinkRequest(g.id, unix.NLM_F_ACK)
		req.AddData(&nl.Genlmsg{Command: cmd, Version: ipvsGenlVersion})
		svc, dest := destAttrs(cmd, k, b)
		req.AddData(svc)
		req.AddData(dest)
		seqs[i] = req.Seq
		msg = append(msg, req.Serialize()...)
		for len(msg)%unix.NLMSG_ALIGNTO != 0 {
			msg = append(msg, 0)
		}
	}
	sock := g.sock.Socket
	if err := unix.Sendto(sock.GetFd(), msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	errs, err := genlAcks(sock, seqs[:])
	if err != nil {
		return err
	}
	delErr, addErr := errs[0], errs[1]
	if delErr != nil && !isNotFound(delErr) {
		delErr = fmt.Errorf("delete: %w", delErr)
	} else {
		delErr = nil
	}
	if errors.Is(addErr, unix.EEXIST) {
		addErr = d.destCmd(ipvsCmdSetDest, k, b)
	}
	if addErr != nil {
		addErr = fmt.Errorf("add: %w", addErr)
	}
	return errors.Join(delErr, addErr)
}

// genlAcks reads from sock the acknowledgements of the requests seqs
// (sent with NLM_F_ACK) and returns each one's error (nil: done), in the
// order of seqs.
func genlAcks(sock *nl.NetlinkSocket, seqs []uint32) ([]error, error) {
	errs := make([]error, len(seqs))
	seen := 0
	for seen < len(seqs) {
		msgs, _, err := sock.Receive()
		if err != nil {
			return nil, fmt.Errorf("receive: %w", err)
		}
		for _, m := range msgs {
			i := slices.Index(seqs, m.Header.Seq)
			if i < 0 || m.Header.Type != unix.NLMSG_ERROR {
				continue // another request's, or an answer with data: none asked
			}
			if len(m.Data) < 4 {
				return nil, fmt.Errorf("acknowledgement of request %d: %d bytes", m.Header.Seq, len(m.Data))
			}
			// The kernel's negative errno, 0 for done.
			if code := -int32(nl.NativeEndian().Uint32(m.Data[:4])); code > 0 { //nolint:gosec // G115: an int32 by the netlink ABI
				errs[i] = syscall.Errno(uint32(code))
			}
			seen++
		}
	}
	return errs, nil
}
