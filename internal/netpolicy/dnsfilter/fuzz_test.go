package dnsfilter

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// fuzzServer is a Server whose upstream is a function, so fuzzing stays in
// process: upstream(m) answers the rebuilt upstream query m.
func fuzzServer(rules Rules, upstream func(m *dns.Msg) (*dns.Msg, error), opened *[]netip.Addr) *Server {
	s := New(Config{
		Upstreams: []string{"127.0.0.1:1"},
		Lookup:    func(netip.Addr) (Rules, bool) { return rules, true },
		OnAnswer: func(_ context.Context, _ netip.Addr, _ string, addrs []netip.Addr, _ time.Duration) error {
			*opened = append(*opened, addrs...)
			return nil
		},
	})
	s.exchange = func(_ context.Context, m *dns.Msg) (*dns.Msg, error) { return upstream(m) }
	return s
}

func packed(t interface{ Fatal(...any) }, m *dns.Msg) []byte {
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkReply holds for every reply: it parses, answers the request's id,
// fits the transport, and every address in it was opened first.
func checkReply(t *testing.T, raw, out []byte, tcp bool, opened []netip.Addr) {
	t.Helper()
	if out == nil {
		return
	}
	if !tcp && len(out) > maxUDPReply {
		t.Fatalf("UDP reply of %d bytes", len(out))
	}
	r := new(dns.Msg)
	if err := r.Unpack(out); err != nil {
		t.Fatalf("reply does not parse: %v", err)
	}
	if id := uint16(raw[0])<<8 | uint16(raw[1]); r.Id != id || !r.Response {
		t.Fatalf("reply id %d response=%v for request id %d", r.Id, r.Response, id)
	}
	for _, sec := range [][]dns.RR{r.Answer, r.Ns, r.Extra} {
		for _, rr := range sec {
			var ip netip.Addr
			switch x := rr.(type) {
			case *dns.A:
				ip, _ = netip.AddrFromSlice(x.A.To4())
			case *dns.AAAA:
				ip, _ = netip.AddrFromSlice(x.AAAA)
				ip = ip.Unmap()
			case *dns.SVCB:
				checkNoHints(t, x.Value)
				continue
			case *dns.HTTPS:
				checkNoHints(t, x.Value)
				continue
			default:
				continue
			}
			if !slices.Contains(opened, ip) {
				t.Fatalf("reply carries %v, which OnAnswer never saw (opened %v)", ip, opened)
			}
		}
	}
}

func checkNoHints(t *testing.T, kv []dns.SVCBKeyValue) {
	t.Helper()
	for _, v := range kv {
		if k := v.Key(); k == dns.SVCB_IPV4HINT || k == dns.SVCB_IPV6HINT {
			t.Fatalf("SVCB hint %v reached the sandbox", v)
		}
	}
}

// FuzzServeMessage feeds arbitrary bytes as a query. The upstream answers
// any question with a CNAME chain, addresses and an HTTPS record with hints.
func FuzzServeMessage(f *testing.F) {
	seed := func(name string, qtype uint16, edns bool) {
		m := new(dns.Msg)
		m.SetQuestion(name, qtype)
		if edns {
			m.SetEdns0(4096, true)
		}
		f.Add(packed(f, m), false)
	}
	seed("www.example.com.", dns.TypeA, false)
	seed("www.example.com.", dns.TypeAAAA, true)
	seed("www.example.com.", dns.TypeHTTPS, true)
	seed("denied.test.", dns.TypeTXT, true)
	seed(`a\.b.example.com.`, dns.TypeA, false)
	f.Add([]byte{0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 0x0c, 0, 1, 0, 1}, true)

	upstream := func(m *dns.Msg) (*dns.Msg, error) {
		r := new(dns.Msg)
		r.SetReply(m)
		q := m.Question[0]
		for _, l := range []string{
			q.Name + " 30 IN CNAME target.elsewhere.",
			"target.elsewhere. 30 IN A 192.0.2.1",
			"target.elsewhere. 30 IN AAAA 2001:db8::1",
			"other.elsewhere. 30 IN A 198.51.100.66",
			q.Name + ` 30 IN HTTPS 1 . alpn=h2 ipv4hint=198.51.100.7`,
		} {
			if rr, err := dns.NewRR(l); err == nil {
				r.Answer = append(r.Answer, rr)
			}
		}
		if rr, err := dns.NewRR("glue.elsewhere. 30 IN A 198.51.100.8"); err == nil {
			r.Extra = append(r.Extra, rr)
		}
		return r, nil
	}
	rules := Rules{Allow: []string{"*.example.com"}, DenyAll: true}
	f.Fuzz(func(t *testing.T, raw []byte, tcp bool) {
		if len(raw) > maxQuerySize || len(raw) < 2 {
			return // the read loops drop these before handle
		}
		var opened []netip.Addr
		s := fuzzServer(rules, upstream, &opened)
		defer s.Close()
		out := s.handle(context.Background(), sandboxIP, raw, tcp)
		checkReply(t, raw, out, tcp, opened)
	})
}

// FuzzUpstreamAnswer feeds arbitrary bytes as the upstream's answer to an
// allowed query: whatever comes back, nothing unopened reaches the sandbox.
func FuzzUpstreamAnswer(f *testing.F) {
	good := new(dns.Msg)
	good.SetQuestion("www.example.com.", dns.TypeA)
	good.Response = true
	for _, l := range []string{
		"www.example.com. 30 IN CNAME a.elsewhere.",
		"a.elsewhere. 30 IN CNAME www.example.com.", // loop
		"a.elsewhere. 30 IN A 192.0.2.1",
		"www.example.com. 30 IN AAAA ::ffff:192.0.2.2",
		`www.example.com. 30 IN HTTPS 1 . ipv6hint=2001:db8::7`,
	} {
		rr, err := dns.NewRR(l)
		if err != nil {
			f.Fatal(err)
		}
		good.Answer = append(good.Answer, rr)
	}
	f.Add(packed(f, good), uint16(dns.TypeA))
	f.Add(packed(f, good), uint16(dns.TypeHTTPS))
	f.Add([]byte{}, uint16(dns.TypeAAAA))

	rules := Rules{Allow: []string{"*.example.com"}, DenyAll: true}
	f.Fuzz(func(t *testing.T, answer []byte, qtype uint16) {
		upstream := func(m *dns.Msg) (*dns.Msg, error) {
			r := new(dns.Msg)
			if err := r.Unpack(answer); err != nil {
				return nil, errors.New("garbage from upstream")
			}
			// Make it match so the reply goes through sanitize.
			r.Id, r.Response, r.Question = m.Id, true, m.Question
			return r, nil
		}
		var opened []netip.Addr
		s := fuzzServer(rules, upstream, &opened)
		defer s.Close()
		q := new(dns.Msg)
		q.SetQuestion("www.example.com.", qtype)
		q.SetEdns0(1232, false)
		raw := packed(t, q)
		for _, tcp := range []bool{false, true} {
			out := s.handle(context.Background(), sandboxIP, raw, tcp)
			checkReply(t, raw, out, tcp, opened)
		}
	})
}
