package dnsfilter

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/miekg/dns"
)

// Rules are the domain half of one sandbox's egress policy, as the DNS
// forwarder needs it. The CIDR/IP half (and the firewall) lives elsewhere;
// the caller maps an E2B network config onto Rules like this:
//
//   - Allow: the domain entries of allowOut ("example.com", "*.example.com", "*").
//   - Deny: domain patterns to refuse. E2B has no such thing (its API rejects
//     domains in denyOut, and so does Airlock's), so this is empty for every
//     sandbox created through the E2B API; it exists for Airlock's own
//     callers and costs nothing.
//   - DenyAll: denyOut contains 0.0.0.0/0 (ALL_TRAFFIC), or internet access
//     is off. This is what makes a sandbox "domain filtered".
//
// Semantics, following E2B (docs "Internet access" and the orchestrator's
// egress check, read 2026-11): allow entries always take precedence over
// deny entries; a destination matching neither is allowed. E2B applies that
// per connection (the TLS SNI or HTTP Host must match an allowOut domain,
// otherwise the IP is checked against the CIDRs); Airlock applies it to the
// name the sandbox resolves, so Decide(name) is:
//
//  1. name matches an Allow pattern  -> allowed, and the answer's addresses
//     are handed to Config.OnAnswer so the firewall opens them (this is how
//     an allowOut domain wins over a denyOut CIDR, including ALL_TRAFFIC);
//  2. else DenyAll                    -> denied, never forwarded upstream;
//  3. else name matches a Deny pattern -> denied;
//  4. else                            -> allowed, forwarded, but OnAnswer is
//     NOT called: reaching the addresses is up to the CIDR rules, exactly as
//     in E2B where a name that matches no allowOut domain gets no special
//     treatment. Opening them here would let any name punch through a
//     denyOut CIDR.
//
// Lookup is called for every query, so a rules change (PUT
// /sandboxes/{id}/network) applies to the next query.
//
// A wildcard is a grant to a whole zone, including its DNS servers: with
// "*.example.com" a sandbox can put anything in the leftmost labels and
// example.com's authoritative servers will see it. That is inherent in
// allowing a wildcard and is the user's choice; names outside the allowed
// zones never leave the host.
//
// Patterns are case-insensitive and a trailing dot is ignored.
// "example.com" matches only example.com; "*.example.com" matches any name
// below example.com at any depth (a.example.com, a.b.example.com) but not
// example.com itself; "*" matches every name. Matching compares DNS labels,
// not strings (see nameLabels), because labels are what upstream servers
// route on.
type Rules struct {
	Allow []string
	Deny  []string
	// DenyAll reports that the sandbox's denyOut contains 0.0.0.0/0
	// (ALL_TRAFFIC) or that internet access is off: only Allow names resolve.
	DenyAll bool
	// Watch are patterns whose answers go to Config.OnAnswer even when the
	// name is only default-allowed (case 4): the hosts of network.rules,
	// whose addresses the egress proxy must see. OnAnswer decides what an
	// answer opens; Watch never makes a name resolvable.
	Watch []string
}

// verdict is the outcome of matching a name, finer than Decide's bool
// because only explicitly allowed names open the firewall.
type verdict int

const (
	verdictDenied         verdict = iota
	verdictAllowed                // matched an Allow pattern: open the firewall for the answer
	verdictDefaultAllowed         // matched nothing and nothing is denied by default: resolve only
)

// Decide reports whether the sandbox may resolve name. See Rules for the
// precedence. A name that is not a valid DNS name is never allowed.
func (r Rules) Decide(name string) (allowed bool) {
	return r.match(name) != verdictDenied
}

func (r Rules) match(name string) verdict {
	labels, ok := nameLabels(name)
	if !ok {
		return verdictDenied
	}
	for _, p := range r.Allow {
		if patternMatches(p, labels) {
			return verdictAllowed
		}
	}
	if r.DenyAll {
		return verdictDenied
	}
	for _, p := range r.Deny {
		if patternMatches(p, labels) {
			return verdictDenied
		}
	}
	return verdictDefaultAllowed
}

// nameLabels turns a presentation-format name (as miekg/dns prints query
// names, with \. and \DDD escapes) into its lower-cased wire labels,
// most-significant last. Going through the wire form is what makes the
// comparison label-exact: the string `a\.evil.org.` ends in ".evil.org." but
// its labels are "a.evil" and "org", so it is not below evil.org and must not
// match "*.evil.org" (it would be sent to org's servers).
func nameLabels(name string) ([]string, bool) {
	if name == "" {
		return nil, false
	}
	var buf [256]byte
	n, err := dns.PackDomainName(dns.Fqdn(name), buf[:], 0, nil, false)
	if err != nil {
		return nil, false
	}
	var labels []string
	for off := 0; off < n; {
		l := int(buf[off])
		if l == 0 {
			break
		}
		if l > 63 || off+1+l > n {
			return nil, false
		}
		labels = append(labels, strings.ToLower(string(buf[off+1:off+1+l])))
		off += 1 + l
	}
	return labels, true
}

// patternMatches reports whether a pattern matches a name given as labels.
// A malformed pattern matches nothing (ValidPattern keeps them out of
// stored configs; this keeps a bad one from widening anything).
func patternMatches(pattern string, labels []string) bool {
	if ValidPattern(pattern) != nil {
		return false
	}
	p := strings.ToLower(strings.TrimSuffix(pattern, "."))
	if p == "*" {
		return true
	}
	wildcard := strings.HasPrefix(p, "*.")
	p = strings.TrimPrefix(p, "*.")
	pl := strings.Split(p, ".")
	if wildcard {
		if len(labels) <= len(pl) {
			return false
		}
	} else if len(labels) != len(pl) {
		return false
	}
	off := len(labels) - len(pl)
	for i, l := range pl {
		if labels[off+i] != l {
			return false
		}
	}
	return true
}

// ValidPattern checks a domain pattern as accepted in allowOut: a host name
// ("example.com"), a wildcard for every name below one ("*.example.com"), or
// "*" for every name. Labels are letters, digits, '-' and '_' (1..63 bytes,
// no leading or trailing '-'), the whole name at most 253 bytes, one
// optional trailing dot. Internationalized names must be given in punycode.
// IP addresses and CIDRs are not domain patterns (the caller routes those to
// the firewall), and neither is a port suffix.
func ValidPattern(p string) error {
	if p == "*" {
		return nil
	}
	host := strings.TrimPrefix(p, "*.")
	host = strings.TrimSuffix(host, ".")
	if host == "" {
		return errors.New("empty domain pattern")
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return fmt.Errorf("domain pattern %q is an IP address", p)
	}
	if _, err := netip.ParsePrefix(host); err == nil {
		return fmt.Errorf("domain pattern %q is a CIDR", p)
	}
	if len(host) > 253 {
		return fmt.Errorf("domain pattern %q is longer than 253 bytes", p)
	}
	for _, label := range strings.Split(host, ".") {
		if label == "" {
			return fmt.Errorf("domain pattern %q has an empty label", p)
		}
		if len(label) > 63 {
			return fmt.Errorf("domain pattern %q has a label longer than 63 bytes", p)
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("domain pattern %q has a label starting or ending with '-'", p)
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				if c == '*' {
					return fmt.Errorf("domain pattern %q: '*' is only allowed as a whole leading label (\"*.example.com\") or alone", p)
				}
				return fmt.Errorf("domain pattern %q has an invalid character %q", p, c)
			}
		}
	}
	return nil
}

// matchAny reports whether name matches one of the patterns (label-exact,
// as Allow and Deny are).
func matchAny(patterns []string, name string) bool {
	labels, ok := nameLabels(name)
	if !ok {
		return false
	}
	for _, p := range patterns {
		if patternMatches(p, labels) {
			return true
		}
	}
	return false
}
