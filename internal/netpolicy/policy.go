package netpolicy

import (
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strings"
)

// AllTraffic is the E2B SDKs' ALL_TRAFFIC: a denyOut entry that denies every
// destination not explicitly allowed. It means every destination of both
// families: IPv6 ones too (::/0 is added next to it).
const AllTraffic = "0.0.0.0/0"

// Policy is a sandbox's egress policy with E2B's semantics:
//
//   - a destination matching AllowOut is reachable, whatever DenyOut says
//     (allow takes precedence);
//   - otherwise a destination matching DenyOut is dropped;
//   - otherwise it is reachable.
//
// AllowOut entries are IPv4 or IPv6 addresses, CIDRs or domain patterns
// ("example.com", "*.example.com"); a domain's addresses (A and AAAA) become
// reachable when the sandbox resolves it through Airlock's DNS forwarder, for
// the answer's TTL. DenyOut entries are addresses or CIDRs of either family.
// allowInternetAccess=false is DenyOut [AllTraffic], which denies IPv6 too.
// Whatever the policy, the host, other sandboxes, link-local addresses
// (cloud metadata) and loopback (NeverRanges) are never reachable.
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
// sandbox (serve --allow-private): for a server inside a company network these
// are where its internal services live, or addresses no sandbox has business
// sending to.
//
//   - IPv4: RFC 1918, the shared address space of carrier-grade NAT (RFC
//     6598, also used by VPN overlays), link-local, loopback, "this network"
//     0.0.0.0/8, multicast 224.0.0.0/4 and the reserved 240.0.0.0/4 (which
//     holds the limited broadcast address).
//   - IPv6: unique-local fc00::/7, link-local fe80::/10, the deprecated
//     site-local fec0::/10, loopback ::1, the unspecified address ::,
//     multicast ff00::/8, IPv4-mapped ::ffff:0:0/96 (so that a mapped
//     private address is no way around the IPv4 ranges) and the local-use
//     NAT64 prefix 64:ff9b:1::/48 (RFC 8215, whose embedding a site chooses).
//
// Beyond these, the IPv6 forms that embed an IPv4 address a NAT64 gateway
// (64:ff9b::/96, RFC 6052) or a 6to4 relay (2002::/16) would translate are
// closed for every IPv4 range that is closed, and opened with it by
// --allow-private: 64:ff9b::10.0.0.1 is 10.0.0.1 to a NAT64 gateway on the
// host's network. A sandbox's allowOut must name such a form itself to open
// it. The documentation range 2001:db8::/32 stays open, like any public
// address: the tests use it as their stand-in public internet.
//
// Link-local and loopback (NeverRanges) stay closed even when named: the
// firewall drops them before any policy.
var PrivateRanges = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("224.0.0.0/4"),
	netip.MustParsePrefix("240.0.0.0/4"),
	netip.MustParsePrefix("fc00::/7"),
	netip.MustParsePrefix("fe80::/10"),
	netip.MustParsePrefix("fec0::/10"),
	netip.MustParsePrefix("::1/128"),
	netip.MustParsePrefix("::/128"),
	netip.MustParsePrefix("ff00::/8"),
	netip.MustParsePrefix("::ffff:0:0/96"),
	netip.MustParsePrefix("64:ff9b:1::/48"),
}

// NeverRanges are private ranges no policy opens: link-local (cloud
// metadata lives at 169.254.169.254; IPv6 link-local addresses are never
// forwarded) and loopback (a sandbox's own loopback never leaves its
// namespace; the host's is not for sandboxes), also in their NAT64 form.
var NeverRanges = []netip.Prefix{
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("fe80::/10"),
	netip.MustParsePrefix("::1/128"),
	netip.MustParsePrefix("64:ff9b::a9fe:0/112"), // 64:ff9b::169.254.0.0/112
	netip.MustParsePrefix("64:ff9b::7f00:0/104"), // 64:ff9b::127.0.0.0/104
}

// ParseAllowPrivate checks the operator's list of private ranges to open for
// every sandbox (serve --allow-private): IPv4 or IPv6 addresses or CIDRs,
// each inside (or covering part of) a private range other than link-local
// and loopback. Anything else is refused rather than ignored, so that a typo
// does not leave a range closed that the operator believes open, or the
// reverse.
func ParseAllowPrivate(entries []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, e := range entries {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		p, ok := parseNet(e)
		if !ok {
			return nil, fmt.Errorf("%q is not an IP address or CIDR", e)
		}
		opens := false
		for _, r := range PrivateRanges {
			if r.Overlaps(p) && !inPrefixes(NeverRanges, r) {
				opens = true
			}
		}
		if !opens {
			for _, r := range NeverRanges {
				if r.Overlaps(p) {
					return nil, fmt.Errorf("%q: link-local (cloud metadata) and loopback addresses are never reachable from a sandbox", e)
				}
			}
			return nil, fmt.Errorf("%q is not in a private range (10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, 100.64.0.0/10, fc00::/7, ...); other addresses are open already", e)
		}
		out = append(out, p)
	}
	return out, nil
}

func inPrefixes(ps []netip.Prefix, p netip.Prefix) bool {
	for _, q := range ps {
		if q == p {
			return true
		}
	}
	return false
}

var (
	nat64WKP  = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour = netip.MustParsePrefix("2002::/16")
)

// closedPrivate is PrivateRanges, with the NAT64 and 6to4 forms of every
// closed IPv4 range, minus what the operator opened: the ranges every
// sandbox's chain drops after its own rules. Both families, sorted.
func closedPrivate(open []netip.Prefix) []ipRange {
	var v4, v6 []netip.Prefix
	for _, p := range PrivateRanges {
		if p.Addr().Is4() {
			v4 = append(v4, p)
		} else {
			v6 = append(v6, p)
		}
	}
	openR := mergeRanges(open)
	closed4 := subtractRanges(mergeRanges(v4), openR)
	closed6 := mergeRanges(v6)
	for _, r := range closed4 {
		closed6 = append(closed6, embedRange(nat64WKP, 96, r), embedRange(sixToFour, 16, r))
	}
	closed6 = subtractRanges(mergeIPRanges(closed6), openR)
	return append(closed4, closed6...)
}

// neverClosed is NeverRanges as sorted ranges.
func neverClosed() []ipRange { return mergeRanges(NeverRanges) }

// embedRange is the IPv6 range of the addresses of pfx that hold an IPv4
// address of r at bit offset off (96: the NAT64 well-known prefix, the IPv4
// address last; 16: 6to4, the IPv4 address right after 2002: and any
// subnet and interface id after it).
func embedRange(pfx netip.Prefix, off int, r ipRange) ipRange {
	lo, hi := pfx.Addr().As16(), pfx.Addr().As16()
	l4, h4 := r.lo.As4(), r.hi.As4()
	copy(lo[off/8:], l4[:])
	copy(hi[off/8:], h4[:])
	for i := off/8 + 4; i < 16; i++ {
		hi[i] = 0xff
	}
	return ipRange{netip.AddrFrom16(lo), netip.AddrFrom16(hi)}
}

// inRanges reports whether a lies in one of the sorted, merged ranges.
func inRanges(rs []ipRange, a netip.Addr) bool {
	i := sort.Search(len(rs), func(i int) bool { return rs[i].hi.Compare(a) >= 0 })
	return i < len(rs) && rs[i].lo.Compare(a) <= 0
}

// ErrInvalidPolicy wraps every validation error of a Policy.
var ErrInvalidPolicy = errors.New("invalid network policy")

// compiled is a validated Policy in the form the firewall and the DNS filter use.
type compiled struct {
	allowNets    []netip.Prefix // both families
	allowDomains []string       // lower case, without trailing dot; "*.x" kept as is
	denyNets     []netip.Prefix // both families
	egress       egressCompiled
}

// allTraffic4 and allTraffic6 are every address of each family. E2B's
// ALL_TRAFFIC is 0.0.0.0/0 (its sandboxes have no IPv6): in allowOut or
// denyOut it stands for all traffic, so it brings ::/0 along. ::/0 alone is
// every IPv6 destination and nothing else.
var (
	allTraffic4 = netip.MustParsePrefix(AllTraffic)
	allTraffic6 = netip.MustParsePrefix("::/0")
)

// withAll6 adds ::/0 next to 0.0.0.0/0.
func withAll6(nets []netip.Prefix) []netip.Prefix {
	for _, p := range nets {
		if p == allTraffic4 {
			return append(nets, allTraffic6)
		}
	}
	return nets
}

// deniesAll reports whether the compiled policy denies every destination
// of both families (what makes the DNS forwarder resolve allowed domains
// only).
func (c compiled) deniesAll() bool {
	var d4, d6 bool
	for _, d := range c.denyNets {
		d4 = d4 || d == allTraffic4
		d6 = d6 || d == allTraffic6
	}
	return d4 && d6
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
			return compiled{}, fmt.Errorf("%w: allowOut entry %q is not an IP address, CIDR or domain", ErrInvalidPolicy, a)
		}
		c.allowDomains = append(c.allowDomains, d)
	}
	for _, d := range p.DenyOut {
		pfx, ok := parseNet(d)
		if !ok {
			return compiled{}, fmt.Errorf("%w: denyOut entry %q is not an IP address or CIDR", ErrInvalidPolicy, d)
		}
		c.denyNets = append(c.denyNets, pfx)
	}
	c.allowNets, c.denyNets = withAll6(c.allowNets), withAll6(c.denyNets)
	e, err := p.compileEgress(c)
	if err != nil {
		return compiled{}, err
	}
	c.egress = e
	return c, nil
}

// parseNet accepts an IPv4 or IPv6 address or CIDR, without a zone.
func parseNet(s string) (netip.Prefix, bool) {
	s = strings.TrimSpace(s)
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, false
		}
		return p.Masked(), true
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Prefix{}, false
	}
	return netip.PrefixFrom(a, a.BitLen()), true
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

// ipRange is an inclusive range of addresses of one family.
type ipRange struct{ lo, hi netip.Addr }

func (r ipRange) String() string { return r.lo.String() + "-" + r.hi.String() }

// prefixRange is a prefix's first and last address.
func prefixRange(p netip.Prefix) ipRange {
	p = p.Masked()
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	hi, _ := netip.AddrFromSlice(b)
	return ipRange{p.Addr(), hi}
}

// mergeRanges turns prefixes into sorted, non-overlapping ranges (IPv4
// first): an nftables interval set refuses overlapping elements.
func mergeRanges(pfxs []netip.Prefix) []ipRange {
	rs := make([]ipRange, 0, len(pfxs))
	for _, p := range pfxs {
		rs = append(rs, prefixRange(p))
	}
	return mergeIPRanges(rs)
}

// mergeIPRanges sorts ranges and merges those that overlap or touch.
func mergeIPRanges(rs []ipRange) []ipRange {
	rs = append([]ipRange(nil), rs...)
	sort.Slice(rs, func(i, j int) bool { return rs[i].lo.Less(rs[j].lo) })
	var out []ipRange
	for _, r := range rs {
		if n := len(out); n > 0 && out[n-1].hi.Is4() == r.lo.Is4() &&
			(r.lo.Compare(out[n-1].hi) <= 0 || out[n-1].hi.Next() == r.lo) {
			if r.hi.Compare(out[n-1].hi) > 0 {
				out[n-1].hi = r.hi
			}
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
			if c.lo.Is4() != lo.Is4() || c.hi.Less(lo) || hi.Less(c.lo) {
				continue
			}
			if lo.Less(c.lo) {
				out = append(out, ipRange{lo, c.lo.Prev()})
			}
			if c.hi.Compare(hi) >= 0 {
				empty = true
				break
			}
			lo = c.hi.Next()
		}
		if !empty {
			out = append(out, ipRange{lo, hi})
		}
	}
	return out
}

// family returns the ranges of one family (IPv4 if v4).
func family(rs []ipRange, v4 bool) []ipRange {
	var out []ipRange
	for _, r := range rs {
		if r.lo.Is4() == v4 {
			out = append(out, r)
		}
	}
	return out
}

// prefixesOf returns the prefixes of one family.
func prefixesOf(ps []netip.Prefix, v4 bool) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		if p.Addr().Is4() == v4 {
			out = append(out, p)
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
