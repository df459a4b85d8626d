// Package netguard decides which addresses a connection the server makes on
// behalf of an API key may reach. A URL an API key gives the server (a
// registry to pull from, a webhook to call) is fetched from the server's own
// network: without this check any key could make the server call the
// operator's internal services, or probe them. The check belongs after name
// resolution, in the dialer's Control, so that a name re-pointed between a
// check and the connection cannot slip past it.
package netguard

import (
	"errors"
	"fmt"
	"net/netip"
	"syscall"
)

// cgnat is the shared address space (RFC 6598), used by VPN overlays;
// netip.Addr.IsPrivate does not include it.
var cgnat = netip.MustParsePrefix("100.64.0.0/10")

// reserved4 is 240.0.0.0/4 (reserved, with the limited broadcast address):
// never a public host.
var reserved4 = netip.MustParsePrefix("240.0.0.0/4")

// Public reports whether a is a public unicast address: not loopback,
// private, shared (CGNAT), link-local, multicast, unspecified, "this
// network" (0.0.0.0/8) or reserved.
func Public(a netip.Addr) bool {
	a = a.Unmap()
	if !a.IsValid() {
		return false
	}
	closed := a.IsLoopback() || a.IsPrivate() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() ||
		a.IsInterfaceLocalMulticast() || a.IsMulticast() || a.IsUnspecified() || cgnat.Contains(a) ||
		(a.Is4() && (a.As4()[0] == 0 || reserved4.Contains(a)))
	return !closed
}

// ErrRefused is returned by a Control for an address it does not allow.
var ErrRefused = errors.New("address refused")

// Control returns a net.Dialer Control function that lets a connection go
// on only to an address allow accepts; refused wraps ErrRefused and names
// the address, with hint appended for the operator.
func Control(allow func(netip.Addr) bool, hint string) func(network, address string, c syscall.RawConn) error {
	return func(_, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return fmt.Errorf("%w: %s is not an IP address and port", ErrRefused, address)
		}
		if !allow(ap.Addr()) {
			return fmt.Errorf("%w: %s is a loopback, private, link-local or otherwise non-public address%s", ErrRefused, ap.Addr().Unmap(), hint)
		}
		return nil
	}
}
