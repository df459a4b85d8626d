package webhook

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/netguard"
)

// ErrURL is a webhook URL that is malformed or points where webhooks may
// not go; its message is for the API key that gave it.
var ErrURL = errors.New("webhook url")

// MaxURLLength bounds a webhook URL.
const MaxURLLength = 2048

// allowHint tells the operator how to let webhooks reach private addresses.
const allowHint = "; webhooks may only call public addresses unless the server runs with --webhook-allow-private"

// ParseURL checks a webhook URL's syntax: absolute http or https, with a
// host, no longer than MaxURLLength.
func ParseURL(raw string) (*url.URL, error) {
	if raw == "" {
		return nil, fmt.Errorf("%w: url is required", ErrURL)
	}
	if len(raw) > MaxURLLength {
		return nil, fmt.Errorf("%w: url is longer than %d characters", ErrURL, MaxURLLength)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: url %q does not parse: %v", ErrURL, raw, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("%w: url %q must start with http:// or https://", ErrURL, raw)
	}
	if u.Hostname() == "" {
		return nil, fmt.Errorf("%w: url %q has no host", ErrURL, raw)
	}
	if p := u.Port(); p != "" {
		if n, err := netip.ParseAddrPort("0.0.0.0:" + p); err != nil || n.Port() == 0 {
			return nil, fmt.Errorf("%w: url %q has an invalid port %q", ErrURL, raw, p)
		}
	}
	return u, nil
}

// CheckURL parses a webhook URL and, unless allowPrivate, resolves its host
// and refuses it when any address it resolves to is not public (loopback,
// private, CGNAT, link-local, unspecified, ...). The same check is made
// again at every delivery, after resolution (Transport), so a DNS answer
// that changes later cannot get around it.
func CheckURL(ctx context.Context, raw string, allowPrivate bool) (*url.URL, error) {
	u, err := ParseURL(raw)
	if err != nil {
		return nil, err
	}
	if allowPrivate {
		return u, nil
	}
	host := u.Hostname()
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")); err == nil {
		addrs = []netip.Addr{a}
	} else {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		addrs, err = net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		if err != nil {
			return nil, fmt.Errorf("%w: cannot resolve the host %q of url %q: %v", ErrURL, host, raw, err)
		}
	}
	for _, a := range addrs {
		if !netguard.Public(a) {
			return nil, fmt.Errorf("%w: the host %q of url %q is at %s, a loopback, private, link-local or otherwise non-public address%s",
				ErrURL, host, raw, a.Unmap(), allowHint)
		}
	}
	return u, nil
}

// Transport is the HTTP transport deliveries go through: no proxy from the
// environment (the check is on the receiver's address), and, unless
// allowPrivate, a dialer that refuses non-public addresses after name
// resolution.
func Transport(allowPrivate bool) *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.Proxy = nil
	d := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	if !allowPrivate {
		d.Control = netguard.Control(netguard.Public, allowHint)
	}
	t.DialContext = d.DialContext
	t.MaxIdleConnsPerHost = 4
	t.ResponseHeaderTimeout = 0 // the client's timeout bounds the whole attempt
	return t
}
