package dnsfilter

import (
	"context"
	"net/netip"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// blockedText is the Extended DNS Error text of a denied name; `dig` shows
// it, so a user can tell policy from a real NXDOMAIN.
const blockedText = "denied by sandbox egress policy"

// handle answers one raw query from src and returns the raw reply, or nil
// to drop it. tcp selects the reply size limit.
func (s *Server) handle(ctx context.Context, src netip.Addr, raw []byte, tcp bool) []byte {
	req := new(dns.Msg)
	if err := req.Unpack(raw); err != nil {
		return nil
	}
	if req.Response {
		return nil // never answer answers: no loops, no reflection
	}
	ctx, cancel := context.WithTimeout(ctx, queryDeadline)
	defer cancel()
	m := s.resolve(ctx, src, req)
	return pack(req, m, tcp)
}

// resolve decides and, if allowed, forwards. It returns the reply before
// size limits; its Question is the request's.
func (s *Server) resolve(ctx context.Context, src netip.Addr, req *dns.Msg) *dns.Msg {
	if req.Opcode != dns.OpcodeQuery {
		return reply(req, dns.RcodeNotImplemented)
	}
	if len(req.Question) != 1 {
		return reply(req, dns.RcodeFormatError)
	}
	rules, ok := s.cfg.Lookup(src)
	if !ok {
		s.log.Debug("dns: query from unknown source", "src", src)
		return reply(req, dns.RcodeRefused)
	}
	q := req.Question[0]
	if q.Qclass != dns.ClassINET {
		return reply(req, dns.RcodeRefused)
	}
	switch q.Qtype {
	case dns.TypeAXFR, dns.TypeIXFR, dns.TypeANY, dns.TypeMAILA, dns.TypeMAILB, dns.TypeOPT, dns.TypeTSIG, dns.TypeTKEY:
		return reply(req, dns.RcodeNotImplemented)
	}
	v := rules.match(q.Name)
	if v == verdictDenied {
		s.log.Debug("dns: denied", "src", src, "name", q.Name, "type", dns.TypeToString[q.Qtype])
		m := reply(req, dns.RcodeNameError)
		if opt := req.IsEdns0(); opt != nil {
			m.SetEdns0(maxUDPReply, opt.Do())
			m.IsEdns0().Option = append(m.IsEdns0().Option, &dns.EDNS0_EDE{
				InfoCode:  dns.ExtendedErrorCodeBlocked,
				ExtraText: blockedText,
			})
		}
		return m
	}

	up := new(dns.Msg)
	up.Id = dns.Id()
	up.RecursionDesired = true
	up.CheckingDisabled = req.CheckingDisabled
	up.Question = []dns.Question{q}
	do := false
	if opt := req.IsEdns0(); opt != nil {
		do = opt.Do()
	}
	up.SetEdns0(upstreamUDPSize, do)
	resp, err := s.exchange(ctx, up)
	if err != nil {
		s.log.Warn("dns: upstream failed", "src", src, "name", q.Name, "err", err)
		return reply(req, dns.RcodeServerFailure)
	}
	if !sameQuestion(resp, q) || resp.Id != up.Id || !resp.Response {
		s.log.Warn("dns: upstream answered another question", "src", src, "name", q.Name)
		return reply(req, dns.RcodeServerFailure)
	}
	ans := sanitize(resp, q)
	watched := v == verdictDefaultAllowed && len(rules.Watch) > 0 && matchAny(rules.Watch, q.Name)
	if (v == verdictAllowed || watched) && len(ans.addrs) > 0 && s.cfg.OnAnswer != nil {
		name := strings.ToLower(strings.TrimSuffix(q.Name, "."))
		actx, cancel := context.WithTimeout(ctx, onAnswerTimeout)
		err := s.cfg.OnAnswer(actx, src, name, ans.addrs, ans.ttl)
		cancel()
		if err != nil {
			s.log.Warn("dns: opening answer failed", "src", src, "name", name, "err", err)
			return reply(req, dns.RcodeServerFailure)
		}
	}
	m := reply(req, resp.Rcode)
	m.Answer = ans.answer
	m.Ns = ans.ns
	// AD is only meaningful to a client that asked for it (RFC 6840 5.8).
	m.AuthenticatedData = resp.AuthenticatedData && (req.AuthenticatedData || do)
	if opt := req.IsEdns0(); opt != nil {
		m.SetEdns0(maxUDPReply, do)
	}
	return m
}

func reply(req *dns.Msg, rcode int) *dns.Msg {
	m := new(dns.Msg)
	m.SetRcode(req, rcode)
	m.RecursionAvailable = true
	return m
}

// pack applies the transport's size limit (setting TC when records had to
// go) and serialises. A reply that cannot be packed becomes SERVFAIL.
func pack(req, m *dns.Msg, tcp bool) []byte {
	size := dns.MaxMsgSize
	if !tcp {
		size = dns.MinMsgSize
		if opt := req.IsEdns0(); opt != nil {
			size = min(max(int(opt.UDPSize()), dns.MinMsgSize), maxUDPReply)
		}
	}
	if m.Rcode > 0xF && m.IsEdns0() == nil {
		// An extended rcode needs an OPT record the client did not offer.
		m = reply(req, dns.RcodeServerFailure)
	}
	m.Truncate(size)
	b, err := m.Pack()
	if err != nil {
		fail := reply(req, dns.RcodeServerFailure)
		if b, err = fail.Pack(); err != nil {
			return nil
		}
	}
	return b
}

func sameQuestion(resp *dns.Msg, q dns.Question) bool {
	if len(resp.Question) != 1 {
		return false
	}
	r := resp.Question[0]
	return r.Qtype == q.Qtype && r.Qclass == q.Qclass && strings.EqualFold(r.Name, q.Name)
}

// answer is a reply reduced to what a sandbox may see.
type answer struct {
	answer, ns []dns.RR
	addrs      []netip.Addr
	ttl        time.Duration
}

// maxChain bounds CNAME chains; resolvers give up long before.
const maxChain = 16

// sanitize keeps the CNAME chain that starts at the question, the records of
// the asked type on it (SVCB/HTTPS without address hints), their RRSIGs, and
// the negative-caching part of the authority section; it collects the A/AAAA
// addresses on the chain and the TTL they may be kept for.
func sanitize(resp *dns.Msg, q dns.Question) answer {
	chain := map[string]bool{dns.CanonicalName(q.Name): true}
	cur := dns.CanonicalName(q.Name)
	for range maxChain {
		next := ""
		for _, rr := range resp.Answer {
			if c, ok := rr.(*dns.CNAME); ok && dns.CanonicalName(c.Hdr.Name) == cur {
				next = dns.CanonicalName(c.Target)
				break
			}
		}
		if next == "" || chain[next] {
			break
		}
		chain[next] = true
		cur = next
	}

	var a answer
	seen := map[netip.Addr]bool{}
	minTTL := uint32(0)
	haveTTL := false
	for _, rr := range resp.Answer {
		h := rr.Header()
		if h.Class != dns.ClassINET || !chain[dns.CanonicalName(h.Name)] {
			continue
		}
		var keep dns.RR
		switch r := rr.(type) {
		case *dns.CNAME:
			keep = r
		case *dns.RRSIG:
			keep = r
		case *dns.A:
			if q.Qtype == dns.TypeA {
				if ip, ok := netip.AddrFromSlice(r.A.To4()); ok {
					keep = r
					if !seen[ip] {
						seen[ip] = true
						a.addrs = append(a.addrs, ip)
					}
				}
			}
		case *dns.AAAA:
			if q.Qtype == dns.TypeAAAA {
				if ip, ok := netip.AddrFromSlice(r.AAAA.To16()); ok {
					keep = r
					ip = ip.Unmap()
					if !seen[ip] {
						seen[ip] = true
						a.addrs = append(a.addrs, ip)
					}
				}
			}
		case *dns.SVCB:
			if q.Qtype == dns.TypeSVCB {
				c := *r
				c.Value = withoutHints(r.Value)
				keep = &c
			}
		case *dns.HTTPS:
			if q.Qtype == dns.TypeHTTPS {
				c := *r
				c.Value = withoutHints(r.Value)
				keep = &c
			}
		default:
			if h.Rrtype == q.Qtype {
				keep = rr
			}
		}
		if keep == nil {
			continue
		}
		if _, sig := keep.(*dns.RRSIG); !sig {
			if !haveTTL || h.Ttl < minTTL {
				minTTL, haveTTL = h.Ttl, true
			}
		}
		a.answer = append(a.answer, keep)
	}
	for _, rr := range resp.Ns {
		switch rr.(type) {
		case *dns.SOA, *dns.NSEC, *dns.NSEC3, *dns.RRSIG:
			if intact(rr) {
				a.ns = append(a.ns, rr)
			}
		}
	}

	a.ttl = min(max(time.Duration(minTTL)*time.Second, MinTTL), MaxTTL)
	capTTL := uint32(a.ttl / time.Second)
	for _, rr := range a.answer {
		if h := rr.Header(); h.Ttl > capTTL {
			h.Ttl = capTTL
		}
	}
	return a
}

// withoutHints drops ipv4hint and ipv6hint: a client may connect to them
// before (or instead of) resolving A/AAAA, and they never pass OnAnswer.
func withoutHints(in []dns.SVCBKeyValue) []dns.SVCBKeyValue {
	out := make([]dns.SVCBKeyValue, 0, len(in))
	for _, kv := range in {
		switch kv.Key() {
		case dns.SVCB_IPV4HINT, dns.SVCB_IPV6HINT:
			continue
		}
		out = append(out, kv)
	}
	return out
}

// intact reports whether rr survives being packed and parsed again. miekg/dns
// accepts some records with empty rdata (an SOA of rdlength 0) that it then packs
// into bytes no resolver, itself included, can parse; such a record from upstream
// is dropped rather than passed on broken.
func intact(rr dns.RR) bool {
	buf := make([]byte, dns.Len(rr)+64)
	n, err := dns.PackRR(rr, buf, 0, nil, false)
	if err != nil {
		return false
	}
	_, _, err = dns.UnpackRR(buf[:n], 0)
	return err == nil
}
