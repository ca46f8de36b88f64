package ipvs

import (
	"fmt"

	libipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ReadNode reads what the node's kernel holds — every IPVS virtual server
// with its real servers, and the VIPs on the dummy link linkName — and
// creates nothing, unlike New (which creates the link): a missing link has
// no VIPs. It is for tools and tests that look at a node, such as after an
// uninstall, where New would put back the link it looks for.
func ReadNode(linkName string) (State, error) {
	nh, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return State{}, fmt.Errorf("rtnetlink: %w", err)
	}
	defer nh.Close()
	ih, err := libipvs.New("")
	if err != nil {
		return State{}, fmt.Errorf("ipvs netlink: %w (is the ip_vs module loaded?)", err)
	}
	defer ih.Close()
	d := &Dataplane{ipvs: ih, nl: nh, name: linkName}
	if d.link, err = linkOfType(nh, linkName, "dummy"); err != nil {
		return State{}, err
	}
	st := NewState()
	if d.link != nil {
		if err := d.readVIPs(st.VIPs); err != nil {
			return State{}, err
		}
	}
	if err := d.readServices(st, nil); err != nil {
		return State{}, err
	}
	return st, nil
}
