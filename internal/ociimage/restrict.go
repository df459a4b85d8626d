package ociimage

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/airlock-sandbox/airlock/internal/netguard"
)

// ErrPrivateRegistry: a restricted pull (Options.Restrict) would connect to
// a loopback, private or link-local address.
var ErrPrivateRegistry = errors.New("registry at a private address")

// Restriction limits where a pull may connect when the image was named by
// someone other than the operator (an API key's template build): a
// registry reference is a URL the server fetches from its own network, so
// without it any key could make the server call the company's internal
// services (and read their answers in the build log) or probe them. Mirrors
// are the operator's and are not restricted; neither are AllowHosts.
type Restriction struct {
	// AllowPrivate are private ranges pulls may reach (serve --allow-private,
	// as for sandboxes).
	AllowPrivate []netip.Prefix
	// AllowHosts are registries ("host:port", as in image references) the
	// operator runs at private addresses (serve --allow-registry).
	AllowHosts []string
}

// allows reports whether a pull may connect to a.
func (r *Restriction) allows(a netip.Addr) bool {
	a = a.Unmap()
	if netguard.Public(a) {
		return true
	}
	return !a.IsLoopback() && slices.ContainsFunc(r.AllowPrivate, func(p netip.Prefix) bool { return p.Contains(a) })
}

// transport is an HTTP transport whose connections are checked against r
// after name resolution (so a name that resolves to a private address, or
// is re-pointed at one between two lookups, is refused as well).
func (r *Restriction) transport() http.RoundTripper {
	base, ok := remote.DefaultTransport.(*http.Transport)
	if !ok {
		base = http.DefaultTransport.(*http.Transport)
	}
	t := base.Clone()
	d := &net.Dialer{
		Timeout: 30 * time.Second, KeepAlive: 30 * time.Second,
		Control: func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("%w: %s", ErrPrivateRegistry, address)
			}
			if !r.allows(ap.Addr()) {
				return fmt.Errorf("%w: %s is a loopback, private or link-local address, which an image named through the API may not be pulled from (the operator can allow a registry with serve --allow-registry HOST:PORT)", ErrPrivateRegistry, ap.Addr())
			}
			return nil
		},
	}
	t.DialContext = d.DialContext
	return t
}
