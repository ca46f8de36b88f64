package ipvs

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func ensureDummy(nh *netlink.Handle, name string) (netlink.Link, error) {
	link, err := ensureLink(nh, &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: name}})
	if err != nil {
		return nil, fmt.Errorf("dummy link for the VIPs: %w", err)
	}
	return link, nil
}

// ensureLink returns the link named as l, of l's type, creating it as l
// when missing, and sets it up.
func ensureLink(nh *netlink.Handle, l netlink.Link) (netlink.Link, error) {
	name := l.Attrs().Name
	link, err := linkOfType(nh, name, l.Type())
	if err == nil && link == nil {
		if err := nh.LinkAdd(l); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("create %s link %s: %w", l.Type(), name, err)
		}
		if link, err = linkOfType(nh, name, l.Type()); err == nil && link == nil {
			err = fmt.Errorf("link %s: gone as soon as created", name)
		}
	}
	if err != nil {
		return nil, err
	}
	if err := nh.LinkSetUp(link); err != nil {
		return nil, fmt.Errorf("set %s up: %w", name, err)
	}
	return link, nil
}

// linkOfType returns the link name, nil when there is none. A link of
// that name and another type than typ is not vipcast's: an error.
func linkOfType(nh *netlink.Handle, name, typ string) (netlink.Link, error) {
	link, err := nh.LinkByName(name)
	var notFound netlink.LinkNotFoundError
	switch {
	case errors.As(err, &notFound):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("link %s: %w", name, err)
	case link.Type() != typ:
		return nil, fmt.Errorf("link %s is a %s link, not %s: not vipcast's, left alone", name, link.Type(), typ)
	}
	return link, nil
}

// deleteLink deletes the link name, of type typ, when there is one.
func deleteLink(nh *netlink.Handle, name, typ string) error {
	link, err := linkOfType(nh, name, typ)
	if err == nil && link != nil {
		if err = nh.LinkDel(link); errors.Is(err, unix.ENODEV) {
			err = nil
		}
	}
	if err != nil {
		return fmt.Errorf("delete %s link %s: %w", typ, name, err)
	}
	return nil
}

func setUp(nh *netlink.Handle, l netlink.Link) error {
	if err := nh.LinkSetUp(l); err != nil {
		return fmt.Errorf("set %s up: %w", l.Attrs().Name, err)
	}
	return nil
}

// ensureVethPair creates the veth pair name/peer when missing and sets the
// peer end up; it returns both ends.
func ensureVethPair(nh *netlink.Handle, name, peer string) (out, in netlink.Link, err error) {
	if out, err = ensureLink(nh, &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peer}); err != nil {
		return nil, nil, err
	}
	if in, err = nh.LinkByName(peer); err != nil {
		return nil, nil, fmt.Errorf("link %s: %w", peer, err)
	}
	if err := setUp(nh, in); err != nil {
		return nil, nil, err
	}
	return out, in, nil
}
