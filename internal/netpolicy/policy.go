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
//
// Private ranges (PrivateRanges) are closed under every policy: a destination
// there that AllowOut does not name by address or CIDR is dropped, unless the
// operator opened its range for all sandboxes (Config.AllowPrivate). A domain
// in AllowOut never opens a private address it resolves to (see onAnswer).
type Policy struct {
	AllowOut []string `json:"allowOut,omitempty"`
	DenyOut  []string `json:"denyOut,omitempty"`
	// Rules are per-host request transforms (headers, secrets filled in on
	// the host) that Airlock's egress applies to HTTP and HTTPS requests.
	Rules map[string][]Rule `json:"rules,omitempty"`
	// EgressProxy, when set, carries every TCP connection the policy allows
	// through a SOCKS5 proxy.
	EgressProxy *EgressProxy `json:"egressProxy,omitempty"`
	// Owner is the API key the sandbox belongs to: its secrets fill the
	// rules' markers. Not part of the policy's wire form.
	Owner string `json:"-"`
}

// PrivateRanges are the destinations a sandbox cannot reach unless its
// allowOut names them by address or CIDR or the operator opens them for every
// sandbox (serve --allow-private): RFC 1918, the shared address space of
// carrier-grade NAT (RFC 6598, also used by VPN overlays), IPv4 link-local,
// IPv6 unique-local and IPv6 link-local. For a server inside a company
// network these are where its internal services live. IPv4 link-local
// (cloud metadata) stays closed even then: the firewall drops it before any
// policy. The IPv6 ranges are listed for completeness: sandboxes have no IPv6
// address or route and the firewall drops every IPv6 packet they forward.
var PrivateRanges = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("fc00::/7"),
	netip.MustParsePrefix("fe80::/10"),
}

// ParseAllowPrivate checks the operator's list of private ranges to open for
// every sandbox (serve --allow-private): IPv4 addresses or CIDRs, each inside
// (or covering part of) an IPv4 private range other than link-local. Anything
// else is refused rather than ignored, so that a typo does not leave a range
// closed that the operator believes open, or the reverse.
func ParseAllowPrivate(entries []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, e := range entries {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		if strings.Contains(e, ":") {
			return nil, fmt.Errorf("%q: sandboxes have no IPv6 egress, so there is no IPv6 range to open", e)
		}
		p, ok := parseNet(e)
		if !ok {
			return nil, fmt.Errorf("%q is not an IPv4 address or CIDR", e)
		}
		opens := false
		for _, r := range PrivateRanges {
			if r.Addr().Is4() && r.Overlaps(p) && r != linkLocal4 {
				opens = true
			}
		}
		if !opens {
			if linkLocal4.Overlaps(p) {
				return nil, fmt.Errorf("%q: link-local addresses (cloud metadata) are never reachable from a sandbox", e)
			}
			return nil, fmt.Errorf("%q is not in a private range (10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, 100.64.0.0/10); other addresses are open already", e)
		}
		out = append(out, p)
	}
	return out, nil
}

var linkLocal4 = netip.MustParsePrefix("169.254.0.0/16")

// closedPrivate is the IPv4 part of PrivateRanges minus what the operator
// opened: the ranges every sandbox's chain drops after its own rules.
func closedPrivate(open []netip.Prefix) []ipRange {
	var v4 []netip.Prefix
	for _, p := range PrivateRanges {
		if p.Addr().Is4() {
			v4 = append(v4, p)
		}
	}
	var open4 []netip.Prefix
	for _, p := range open {
		if p.Addr().Is4() { // there is no IPv6 egress to open
			open4 = append(open4, p)
		}
	}
	return subtractRanges(mergeRanges(v4), mergeRanges(open4))
}

// inRanges reports whether a (IPv4) lies in one of the sorted ranges.
func inRanges(rs []ipRange, a netip.Addr) bool {
	if !a.Is4() {
		return false
	}
	v := addrU32(a)
	i := sort.Search(len(rs), func(i int) bool { return rs[i].hi >= v })
	return i < len(rs) && rs[i].lo <= v
}

// ErrInvalidPolicy wraps every validation error of a Policy.
var ErrInvalidPolicy = errors.New("invalid network policy")

// compiled is a validated Policy in the form the firewall and the DNS filter use.
type compiled struct {
	allowNets    []netip.Prefix
	allowDomains []string // lower case, without trailing dot; "*.x" kept as is
	denyNets     []netip.Prefix
	egress       egressCompiled
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
	e, err := p.compileEgress(c)
	if err != nil {
		return compiled{}, err
	}
	c.egress = e
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

// subtractRanges removes the sorted, merged ranges cut from the sorted,
// merged ranges from.
func subtractRanges(from, cut []ipRange) []ipRange {
	var out []ipRange
	for _, r := range from {
		lo, hi, empty := r.lo, r.hi, false
		for _, c := range cut {
			if c.hi < lo || c.lo > hi {
				continue
			}
			if c.lo > lo {
				out = append(out, ipRange{lo, c.lo - 1})
			}
			if c.hi >= hi {
				empty = true
				break
			}
			lo = c.hi + 1
		}
		if !empty {
			out = append(out, ipRange{lo, hi})
		}
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
