package netpolicy

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// link describes one sandbox's point-to-point link: a /30 whose first host
// address is the host side (the sandbox's gateway and DNS server) and second
// the sandbox's eth0; with IPv6, the /126 that goes with it (gateway6,
// addr6; invalid without IPv6).
type link struct {
	hostIf   string
	gateway  netip.Addr
	addr     netip.Addr
	bits     int
	gateway6 netip.Addr
	addr6    netip.Addr
}

// bits6 is the IPv6 prefix length of a sandbox link: the /30's 2 host bits.
const bits6 = 126

// setupLink creates the veth pair with its peer already inside ns as eth0,
// addresses both ends, brings lo, eth0 and the host side up, and routes the
// sandbox's default traffic to the host side. Everything goes over netlink.
func setupLink(ns netns.NsHandle, l link) error {
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: l.hostIf},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(int(ns)),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth %s: %w", l.hostIf, err)
	}
	host, err := netlink.LinkByName(l.hostIf)
	if err != nil {
		return fmt.Errorf("veth %s: %w", l.hostIf, err)
	}
	if err := trimHostIPv6(host, l.gateway6.IsValid()); err != nil {
		return err
	}
	if err := netlink.AddrAdd(host, &netlink.Addr{IPNet: ipNet(l.gateway, l.bits)}); err != nil {
		return fmt.Errorf("address %s on %s: %w", l.gateway, l.hostIf, err)
	}
	if l.gateway6.IsValid() {
		// No duplicate address detection: the link has two ends, both ours,
		// and the address is usable at once.
		if err := netlink.AddrAdd(host, &netlink.Addr{IPNet: ipNet(l.gateway6, bits6), Flags: unix.IFA_F_NODAD}); err != nil {
			return fmt.Errorf("address %s on %s: %w", l.gateway6, l.hostIf, err)
		}
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return fmt.Errorf("up %s: %w", l.hostIf, err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("netlink in sandbox netns: %w", err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("sandbox lo: %w", err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("sandbox lo up: %w", err)
	}
	eth, err := h.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("sandbox eth0: %w", err)
	}
	if err := h.AddrAdd(eth, &netlink.Addr{IPNet: ipNet(l.addr, l.bits)}); err != nil {
		return fmt.Errorf("sandbox address %s: %w", l.addr, err)
	}
	if err := h.LinkSetUp(eth); err != nil {
		return fmt.Errorf("sandbox eth0 up: %w", err)
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: net.IP(l.gateway.AsSlice())}); err != nil {
		return fmt.Errorf("sandbox default route: %w", err)
	}
	if l.addr6.IsValid() {
		if err := addr6(h, eth, l.addr6, l.gateway6); err != nil {
			return fmt.Errorf("sandbox: %w", err)
		}
		// Without a link-local address (trimHostIPv6) the host side cannot
		// solicit a neighbour for traffic it forwards: the sandbox's is
		// known, and fixed for the link's life.
		if err := netlink.NeighSet(&netlink.Neigh{LinkIndex: host.Attrs().Index, Family: netlink.FAMILY_V6,
			State: netlink.NUD_PERMANENT, IP: net.IP(l.addr6.AsSlice()), HardwareAddr: eth.Attrs().HardwareAddr}); err != nil {
			return fmt.Errorf("neighbour %s on %s: %w", l.addr6, l.hostIf, err)
		}
	}
	return nil
}

// in6AddrGenModeNone is IN6_ADDR_GEN_MODE_NONE (linux/if_link.h): no
// link-local address is generated for the interface.
const in6AddrGenModeNone = 1

// trimHostIPv6 keeps a sandbox's host-side interface, before it is up, from
// taking IPv6 it does not need. Every IPv6 address of a host interface puts
// routes in the host's one IPv6 table, which the kernel walks whole whenever
// an interface goes up or down (fib6_clean_all): the link-local address of
// every sandbox's host side (three routes each) made each create and kill
// walk thousands of routes more. With sandbox IPv6 off the host side has no
// IPv6 at all; with it on, only the gateway's address: it answers the
// sandbox's neighbour solicitations from it, and setupLink gives it the
// sandbox's neighbour entry, which it could not solicit without a link-local
// address (nothing here sends router advertisements either).
func trimHostIPv6(host netlink.Link, ipv6 bool) error {
	name := host.Attrs().Name
	if ipv6 {
		if err := netlink.LinkSetIP6AddrGenMode(host, in6AddrGenModeNone); err != nil {
			return fmt.Errorf("no link-local address on %s: %w", name, err)
		}
		return nil
	}
	err := os.WriteFile("/proc/sys/net/ipv6/conf/"+name+"/disable_ipv6", []byte("1"), 0)
	if err != nil && !errors.Is(err, os.ErrNotExist) { // ErrNotExist: a host without IPv6
		return fmt.Errorf("disable IPv6 on %s: %w", name, err)
	}
	return nil
}

// addr6 gives a sandbox's eth0 its IPv6 address and default route (or puts
// them back; setting what is there changes nothing).
func addr6(h *netlink.Handle, eth netlink.Link, addr, gw netip.Addr) error {
	if err := h.AddrReplace(eth, &netlink.Addr{IPNet: ipNet(addr, bits6), Flags: unix.IFA_F_NODAD}); err != nil {
		return fmt.Errorf("IPv6 address %s: %w", addr, err)
	}
	r := &netlink.Route{LinkIndex: eth.Attrs().Index, Gw: net.IP(gw.AsSlice()),
		Dst: &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}}
	if err := h.RouteReplace(r); err != nil {
		return fmt.Errorf("IPv6 default route via %s: %w", gw, err)
	}
	return nil
}

// deleteLink removes the host side of a veth pair (the peer goes with it). A
// link that is already gone is not an error.
func deleteLink(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("find veth %s: %w", name, err)
	}
	if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
		// ENODEV: gone meanwhile with its peer's namespace (a destroyed
		// sandbox's, which the kernel cleans up in the background).
		return fmt.Errorf("delete veth %s: %w", name, err)
	}
	return nil
}

func ipNet(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(bits, a.BitLen())}
}

// linkGateway returns the IPv4 address on a host-side link inside cidr, if any;
// Airlock uses it to rebuild its address allocation after a restart from the
// kernel's state rather than from a file that could go stale.
func linkGateway(l netlink.Link, cidr netip.Prefix) (netip.Addr, bool) {
	addrs, err := netlink.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		return netip.Addr{}, false
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok && cidr.Contains(ip) {
			return ip, true
		}
	}
	return netip.Addr{}, false
}
