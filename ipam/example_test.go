package ipam_test

import (
	"fmt"

	"github.com/vipcast/vipcast/ipam"
)

func Example() {
	a := ipam.New()
	if errs := a.SetPools([]ipam.Pool{
		{Name: "blue", Addresses: []string{"10.0.0.9-10.0.0.1"}, AutoAssign: true},
		{Name: "green", Addresses: []string{"192.168.10.0/24", "2001:db8::/64"}, AutoAssign: true, AvoidBuggyIPs: true},
	}); errs != nil {
		fmt.Println(errs["blue"])
	}

	web := ipam.Request{
		Owner: "shop/web", Namespace: "shop",
		Families:   []ipam.Family{ipam.IPv4, ipam.IPv6}, // PreferDualStack
		SharingKey: "shop", Ports: []ipam.Port{{Protocol: "TCP", Port: 443}},
	}
	as, _ := a.Assign(web)
	fmt.Println(as.Pool, as.IPs)

	dns := ipam.Request{
		Owner: "shop/dns", Namespace: "shop", Families: []ipam.Family{ipam.IPv4},
		SharingKey: "shop", Ports: []ipam.Port{{Protocol: "UDP", Port: 53}},
	}
	as, _ = a.Assign(dns)
	fmt.Println(as.Pool, as.IPs, a.Holders(as.IPs[0]))

	clash := ipam.Request{
		Owner: "shop/other", Namespace: "shop", IPs: as.IPs,
		SharingKey: "shop", Ports: []ipam.Port{{Protocol: "TCP", Port: 443}},
	}
	_, err := a.Assign(clash)
	fmt.Println(ipam.ReasonOf(err))
	fmt.Println(err)

	s, _ := a.Stats("green")
	fmt.Println(s.IPv4.Capacity, s.IPv4.InUse)
	// Output:
	// pool "blue": addresses[0] "10.0.0.9-10.0.0.1": range start is after its end; write the lower address first
	// green [192.168.10.1 2001:db8::]
	// green [192.168.10.1] [shop/dns shop/web]
	// PortClash
	// shop/other: cannot share address 192.168.10.1 with shop/web under sharing key "shop": both use port TCP/443; change the port, or use another sharing key
	// 254 1
}
