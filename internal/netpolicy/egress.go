package netpolicy

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"
)

// Rule is one entry of a sandbox's network.rules for a host (E2B's
// SandboxNetworkRule): what Airlock's egress does to every HTTP request to
// that host before forwarding it.
type Rule struct {
	Transform *Transform `json:"transform,omitempty"`
}

// Transform is E2B's SandboxNetworkTransform: headers set on a request,
// replacing a header of the same name. Values may hold secret markers
// (${e2b.secrets.<name>}), which the egress fills in on the host, per
// request, so the value never enters the sandbox.
type Transform struct {
	Headers map[string]string `json:"headers,omitempty"`
}

// EgressProxy is a SOCKS5 proxy every TCP connection of the sandbox goes
// through, after the policy allowed it (E2B's SandboxEgressProxyConfig).
type EgressProxy struct {
	Address  string `json:"address"`
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
}

// Bounds of network.rules: a policy is kept per sandbox in memory and in
// its record, and every intercepted request walks it.
const (
	maxRuleHosts     = 100
	maxRulesPerHost  = 20
	maxRuleHeaders   = 50
	maxRuleHeaderLen = 8 << 10
)

// forbiddenRuleHeaders are headers a rule may not set: they describe the
// message's framing or routing, which the egress owns; a rule changing them
// would corrupt the request rather than authorise it.
var forbiddenRuleHeaders = map[string]bool{
	"Host": true, "Content-Length": true, "Transfer-Encoding": true, "Connection": true,
	"Upgrade": true, "Te": true, "Trailer": true, "Keep-Alive": true, "Proxy-Connection": true,
}

// RuleHost is one key of network.rules, compiled: a domain pattern (as in
// allowOut) or an address range, with its rules in order.
type RuleHost struct {
	Key    string
	Domain string       // lower case; "" for an address key
	Net    netip.Prefix // valid for an address key
	Rules  []Rule
}

// egressCompiled is the egress part of a compiled policy.
type egressCompiled struct {
	hosts []RuleHost
	proxy *EgressProxy
}

// intercepts reports whether the sandbox's TCP egress (some or all of it)
// goes through Airlock's egress proxy.
func (e egressCompiled) intercepts() bool { return len(e.hosts) > 0 || e.proxy != nil }

func (e egressCompiled) ruleNets() []netip.Prefix {
	var out []netip.Prefix
	for _, h := range e.hosts {
		if h.Net.IsValid() {
			out = append(out, h.Net)
		}
	}
	return out
}

func (e egressCompiled) ruleDomains() []string {
	var out []string
	for _, h := range e.hosts {
		if h.Domain != "" {
			out = append(out, h.Domain)
		}
	}
	return out
}

// compileEgress checks rules and egressProxy; it does not look anything up
// (see Network.CheckEgressProxy for the proxy's address).
func (p Policy) compileEgress(allow compiled) (egressCompiled, error) {
	var e egressCompiled
	if len(p.Rules) > maxRuleHosts {
		return e, fmt.Errorf("%w: rules has %d hosts; at most %d", ErrInvalidPolicy, len(p.Rules), maxRuleHosts)
	}
	keys := make([]string, 0, len(p.Rules))
	for k := range p.Rules {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	// Rule hosts are reached over IPv4 (interception is IPv4): what counts
	// is whether all IPv4 traffic is denied.
	denyAll := false
	for _, d := range allow.denyNets {
		denyAll = denyAll || d.Bits() == 0 && d.Addr().Is4()
	}
	for _, k := range keys {
		rules := p.Rules[k]
		h := RuleHost{Key: k, Rules: rules}
		if pfx, ok := parseNet(k); ok {
			if !pfx.Addr().Is4() {
				return e, fmt.Errorf("%w: rules key %q: rules apply to IPv4 destinations (name the host, or its IPv4 address)", ErrInvalidPolicy, k)
			}
			h.Net = pfx
		} else if d, ok := normalizeDomain(k); ok && d != "*" {
			h.Domain = d
		} else {
			return e, fmt.Errorf("%w: rules key %q is not a domain, IPv4 address or CIDR", ErrInvalidPolicy, k)
		}
		if len(rules) > maxRulesPerHost {
			return e, fmt.Errorf("%w: rules for %q: %d rules; at most %d", ErrInvalidPolicy, k, len(rules), maxRulesPerHost)
		}
		for _, r := range rules {
			if err := checkTransform(k, r.Transform); err != nil {
				return e, err
			}
		}
		if blocked := ruleHostBlocked(h, allow, denyAll); blocked != "" {
			return e, fmt.Errorf("%w: rules for %q: the host is not reachable under this policy (%s); add it to allowOut", ErrInvalidPolicy, k, blocked)
		}
		e.hosts = append(e.hosts, h)
	}
	if p.EgressProxy != nil {
		if err := checkEgressProxy(*p.EgressProxy); err != nil {
			return e, err
		}
		pr := *p.EgressProxy
		e.proxy = &pr
	}
	return e, nil
}

func checkTransform(host string, t *Transform) error {
	if t == nil {
		return nil
	}
	if len(t.Headers) > maxRuleHeaders {
		return fmt.Errorf("%w: rules for %q: %d headers; at most %d", ErrInvalidPolicy, host, len(t.Headers), maxRuleHeaders)
	}
	for name, v := range t.Headers {
		if !httpguts.ValidHeaderFieldName(name) {
			return fmt.Errorf("%w: rules for %q: %q is not a valid header name", ErrInvalidPolicy, host, name)
		}
		if forbiddenRuleHeaders[http1Canonical(name)] {
			return fmt.Errorf("%w: rules for %q: header %q cannot be set by a rule (it frames or routes the request)", ErrInvalidPolicy, host, name)
		}
		if len(v) > maxRuleHeaderLen || !httpguts.ValidHeaderFieldValue(v) {
			return fmt.Errorf("%w: rules for %q: the value of header %q is not a valid header value (at most %d bytes, no control characters)", ErrInvalidPolicy, host, name, maxRuleHeaderLen)
		}
	}
	return nil
}

// ruleHostBlocked says why a rule host can never be reached under the
// policy ("" if it can): a rule for it would silently do nothing.
func ruleHostBlocked(h RuleHost, c compiled, denyAll bool) string {
	if h.Domain != "" {
		if matchDomain(c.allowDomains, h.Domain) || (strings.HasPrefix(h.Domain, "*.") && coversPattern(c.allowDomains, h.Domain)) {
			return ""
		}
		if denyAll {
			return "denyOut denies all traffic and allowOut does not name the domain"
		}
		return ""
	}
	for _, a := range c.allowNets {
		if a.Contains(h.Net.Addr()) {
			return ""
		}
	}
	for _, d := range c.denyNets {
		if d.Overlaps(h.Net) {
			return "denyOut covers it and allowOut does not name it"
		}
	}
	return ""
}

// coversPattern reports whether a wildcard rule key is covered by an
// allowOut pattern ("*.example.com" by "*.example.com" or "*.com").
func coversPattern(patterns []string, wildcard string) bool {
	suffix := strings.TrimPrefix(wildcard, "*.")
	for _, p := range patterns {
		if p == "*" || p == wildcard {
			return true
		}
		if ps, ok := strings.CutPrefix(p, "*."); ok && strings.HasSuffix(suffix, "."+ps) {
			return true
		}
	}
	return false
}

func checkEgressProxy(p EgressProxy) error {
	host, port, err := net.SplitHostPort(strings.TrimSpace(p.Address))
	if err != nil || host == "" {
		return fmt.Errorf("%w: egressProxy.address %q is not host:port", ErrInvalidPolicy, p.Address)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("%w: egressProxy.address %q: port must be 1-65535", ErrInvalidPolicy, p.Address)
	}
	if _, err := netip.ParseAddr(host); err != nil {
		if _, ok := normalizeDomain(host); !ok || strings.Contains(host, "*") {
			return fmt.Errorf("%w: egressProxy.address %q: %q is not a host name or IP address", ErrInvalidPolicy, p.Address, host)
		}
	}
	if len(p.Username) > 255 || len(p.Password) > 255 {
		return fmt.Errorf("%w: egressProxy username and password are at most 255 bytes each (RFC 1929)", ErrInvalidPolicy)
	}
	if p.Password != "" && p.Username == "" {
		return fmt.Errorf("%w: egressProxy.password needs a username", ErrInvalidPolicy)
	}
	return nil
}

// http1Canonical is the canonical form of a header name (textproto's).
func http1Canonical(s string) string {
	b := []byte(strings.ToLower(s))
	upper := true
	for i, c := range b {
		if upper && c >= 'a' && c <= 'z' {
			b[i] = c - 'a' + 'A'
		}
		upper = c == '-'
	}
	return string(b)
}

// Egress is what Airlock's egress proxy needs to know about the sandbox a
// connection comes from.
type Egress struct {
	ID string
	// Owner scopes the sandbox's secrets (the API key that created it).
	Owner string
	Hosts []RuleHost
	Proxy *EgressProxy
}

// RulesFor returns the rules for a request to host (a name from SNI or the
// Host header, or "") at address dst, in the order of Hosts (domain keys
// by name, address keys by dst).
func (e Egress) RulesFor(host string, dst netip.Addr) []Rule {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	var out []Rule
	for _, h := range e.Hosts {
		if h.Domain != "" && host != "" && matchDomain([]string{h.Domain}, host) ||
			h.Net.IsValid() && h.Net.Contains(dst.Unmap()) {
			out = append(out, h.Rules...)
		}
	}
	return out
}

// HasRules reports whether any rule host is a domain matching host or an
// address range holding dst.
func (e Egress) HasRules(host string, dst netip.Addr) bool {
	return len(e.RulesFor(host, dst)) > 0
}

// EgressFor returns the egress view of the sandbox with address src, if
// its egress is intercepted.
func (n *Network) EgressFor(src netip.Addr) (Egress, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	st, ok := n.byIP[src.Unmap()]
	if !ok || !st.c.egress.intercepts() {
		return Egress{}, false
	}
	return Egress{ID: st.ID, Owner: st.policy.Owner, Hosts: st.c.egress.hosts, Proxy: st.c.egress.proxy}, true
}

// NameOf returns the name the sandbox at src resolved to dst through
// Airlock's DNS, if it is a rule host or an allowOut domain still in its
// TTL: the egress proxy hands it to a SOCKS5 proxy (remote DNS) and uses it
// for plain-HTTP rule matching when the request has no Host.
func (n *Network) NameOf(src, dst netip.Addr) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	st, ok := n.byIP[src.Unmap()]
	if !ok {
		return ""
	}
	if l, ok := st.learned[dst.Unmap()]; ok {
		return l.name
	}
	if l, ok := st.ruleLearned[dst.Unmap()]; ok {
		return l.name
	}
	return ""
}

// Intercepts reports whether this server runs an egress proxy, which
// network rules and egressProxy need.
func (n *Network) Intercepts() bool { return n.cfg.EgressPort != 0 }

// CheckEgressProxy refuses an egress proxy a sandbox could not use or
// should not: a name that does not resolve, and addresses the host's own
// or closed to sandboxes (loopback, link-local, the sandbox range, private
// ranges not opened by --allow-private). Otherwise a sandbox could have
// the host connect, on its behalf, where it may not connect itself.
func (n *Network) CheckEgressProxy(ctx context.Context, p EgressProxy) error {
	host, _, err := net.SplitHostPort(strings.TrimSpace(p.Address))
	if err != nil {
		return fmt.Errorf("%w: egressProxy.address %q is not host:port", ErrInvalidPolicy, p.Address)
	}
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
	} else {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		addrs, err = net.DefaultResolver.LookupNetIP(ctx, "ip4", host)
		if err != nil || len(addrs) == 0 {
			return fmt.Errorf("%w: egressProxy.address %q: %q does not resolve to an IPv4 address (%v)", ErrInvalidPolicy, p.Address, host, err)
		}
	}
	for _, a := range addrs {
		a = a.Unmap()
		switch {
		case !a.Is4():
			return fmt.Errorf("%w: egressProxy.address %q: only IPv4 proxies are supported", ErrInvalidPolicy, p.Address)
		case a.IsLoopback() || a.IsUnspecified() || a.IsLinkLocalUnicast() || a.IsMulticast() || n.cfg.CIDR.Contains(a):
			return fmt.Errorf("%w: egressProxy.address %q resolves to %s, an address of the host or its sandboxes", ErrInvalidPolicy, p.Address, a)
		case inRanges(n.fw.closed, a):
			return fmt.Errorf("%w: egressProxy.address %q resolves to %s, a private address this server does not open (serve --allow-private)", ErrInvalidPolicy, p.Address, a)
		}
	}
	return nil
}
