package netpolicy

import (
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strings"
)

// AllTraffic is the E2B SDKs' ALL_TRAFFIC: a denyOut entry that denies every
// destination not explicitly allowed.
const AllTraffic = "0.0.0.0/0"

// Policy is a sandbox's egress policy with E2B's semantics:
//
//   - a destination matching AllowOut is reachable, whatever DenyOut says
//     (allow takes precedence);
//   - otherwise a destination matching DenyOut is dropped;
//   - otherwise it is reachable.
//
// AllowOut entries are IPv4 addresses, CIDRs or domain patterns ("example.com",
// "*.example.com"); a domain's addresses become reachable when the sandbox
// resolves it through Airlock's DNS forwarder, for the answer's TTL. DenyOut
// entries are addresses or CIDRs. allowInternetAccess=false is DenyOut
// [AllTraffic]. Whatever the policy, the host, other sandboxes and link-local
// addresses (cloud metadata) are never reachable.
type Policy struct {
	AllowOut []string `json:"allowOut,omitempty"`
	DenyOut  []string `json:"denyOut,omitempty"`
}

// ErrInvalidPolicy wraps every validation error of a Policy.
var ErrInvalidPolicy = errors.New("invalid network policy")

// compiled is a validated Policy in the form the firewall and the DNS filter use.
type compiled struct {
	allowNets    []netip.Prefix
	allowDomains []string // lower case, without trailing dot; "*.x" kept as is
	denyNets     []netip.Prefix
}

// Validate reports the first entry that is not acceptable.
func (p Policy) Validate() error {
	_, err := p.compile()
	return err
}

func (p Policy) compile() (compiled, error) {
	var c compiled
	for _, a := range p.AllowOut {
		if pfx, ok := parseNet(a); ok {
			c.allowNets = append(c.allowNets, pfx)
			continue
		}
		d, ok := normalizeDomain(a)
		if !ok {
			return compiled{}, fmt.Errorf("%w: allowOut entry %q is not an IPv4 address, CIDR or domain", ErrInvalidPolicy, a)
		}
		c.allowDomains = append(c.allowDomains, d)
	}
	for _, d := range p.DenyOut {
		pfx, ok := parseNet(d)
		if !ok {
			return compiled{}, fmt.Errorf("%w: denyOut entry %q is not an IPv4 address or CIDR", ErrInvalidPolicy, d)
		}
		c.denyNets = append(c.denyNets, pfx)
	}
	return c, nil
}

// parseNet accepts an IPv4 address or CIDR (the sandbox network is IPv4 only).
func parseNet(s string) (netip.Prefix, bool) {
	s = strings.TrimSpace(s)
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil || !p.Addr().Is4() {
			return netip.Prefix{}, false
		}
		return p.Masked(), true
	}
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is4() {
		return netip.Prefix{}, false
	}
	return netip.PrefixFrom(a, 32), true
}

// normalizeDomain lower-cases a domain pattern and checks its shape: labels of
// letters, digits, '-' and '_', optionally led by "*." (any subdomain).
func normalizeDomain(s string) (string, bool) {
	s = strings.TrimSuffix(strings.ToLower(strings.TrimSpace(s)), ".")
	if s == "*" {
		return s, true // every name
	}
	rest := strings.TrimPrefix(s, "*.")
	if rest == "" || len(rest) > 253 {
		return "", false
	}
	for _, label := range strings.Split(rest, ".") {
		if label == "" || len(label) > 63 {
			return "", false
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
				return "", false
			}
		}
	}
	return s, true
}

// matchDomain reports whether name (lower case, no trailing dot) matches one
// of the patterns. "example.com" matches itself only; "*.example.com" matches
// its subdomains at any depth, as E2B's docs describe.
func matchDomain(patterns []string, name string) bool {
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	for _, p := range patterns {
		if p == "*" {
			return true
		}
		if suffix, ok := strings.CutPrefix(p, "*."); ok {
			if strings.HasSuffix(name, "."+suffix) {
				return true
			}
		} else if name == p {
			return true
		}
	}
	return false
}

// ipRange is an inclusive IPv4 range as 32-bit integers.
type ipRange struct{ lo, hi uint32 }

// mergeRanges turns prefixes into sorted, non-overlapping ranges: an nftables
// interval set refuses overlapping elements.
func mergeRanges(pfxs []netip.Prefix) []ipRange {
	rs := make([]ipRange, 0, len(pfxs))
	for _, p := range pfxs {
		lo := addrU32(p.Addr())
		span := uint32(1)<<(32-p.Bits()) - 1
		if p.Bits() == 0 {
			span = ^uint32(0)
		}
		rs = append(rs, ipRange{lo, lo + span})
	}
	sort.Slice(rs, func(i, j int) bool { return rs[i].lo < rs[j].lo })
	var out []ipRange
	for _, r := range rs {
		if n := len(out); n > 0 && (r.lo <= out[n-1].hi || out[n-1].hi != ^uint32(0) && r.lo == out[n-1].hi+1) {
			out[n-1].hi = max(out[n-1].hi, r.hi)
			continue
		}
		out = append(out, r)
	}
	return out
}

func addrU32(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

func u32Addr(v uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}
