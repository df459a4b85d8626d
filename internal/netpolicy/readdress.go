package netpolicy

import (
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Readdress puts a sandbox's eth0 addresses (IPv4, and IPv6 when it has
// one) and default routes back in its
// network namespace, and brings lo and eth0 up, as Setup made them. gVisor's
// netstack takes the namespace's interfaces over and strips their addresses
// (the host kernel must not answer for them), and gives nothing back when the
// sandbox ends; a namespace kept across a pause must be readdressed before the
// next gVisor sandbox (restored or booted afresh) joins it, since the netstack
// reads its addresses and routes from the namespace. Setting what is already
// there changes nothing.
func (n *Network) Readdress(id string) error {
	n.mu.Lock()
	st, ok := n.sbx[id]
	n.mu.Unlock()
	if !ok {
		return fmt.Errorf("netpolicy: readdress %s: no such sandbox network", id)
	}
	ns, err := netns.GetFromPath(st.NetNS)
	if err != nil {
		return fmt.Errorf("netpolicy: readdress %s: %w", id, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("netpolicy: readdress %s: netlink in the sandbox netns: %w", id, err)
	}
	defer h.Close()
	for _, name := range []string{"lo", "eth0"} {
		l, err := h.LinkByName(name)
		if err != nil {
			return fmt.Errorf("netpolicy: readdress %s: %s: %w", id, name, err)
		}
		if err := h.LinkSetUp(l); err != nil {
			return fmt.Errorf("netpolicy: readdress %s: %s up: %w", id, name, err)
		}
		if name == "lo" {
			continue
		}
		if err := h.AddrReplace(l, &netlink.Addr{IPNet: ipNet(st.Addr, 30)}); err != nil {
			return fmt.Errorf("netpolicy: readdress %s: address %s: %w", id, st.Addr, err)
		}
		if err := h.RouteReplace(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.IP(st.Gateway.AsSlice())}); err != nil {
			return fmt.Errorf("netpolicy: readdress %s: default route: %w", id, err)
		}
		if st.Addr6.IsValid() {
			if err := addr6(h, l, st.Addr6, st.Gateway6); err != nil {
				return fmt.Errorf("netpolicy: readdress %s: %w", id, err)
			}
		}
	}
	return nil
}
