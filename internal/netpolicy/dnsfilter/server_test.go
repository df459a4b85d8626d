package dnsfilter

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// fakeUpstream is a real DNS server on loopback that records what reaches it.
type fakeUpstream struct {
	addr string
	mu   sync.Mutex
	seen []*dns.Msg
}

func (u *fakeUpstream) queries() []*dns.Msg {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.seen)
}

// startUpstream serves answer on UDP and TCP of one loopback port. UDP
// replies are truncated to the size the query offers, as a real server does.
func startUpstream(t testing.TB, answer func(req *dns.Msg) *dns.Msg) *fakeUpstream {
	t.Helper()
	u := &fakeUpstream{}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		u.mu.Lock()
		u.seen = append(u.seen, req.Copy())
		u.mu.Unlock()
		m := answer(req)
		if m == nil {
			return // blackhole
		}
		if w.LocalAddr().Network() == "udp" {
			size := dns.MinMsgSize
			if opt := req.IsEdns0(); opt != nil {
				size = int(opt.UDPSize())
			}
			m.Truncate(size)
		}
		_ = w.WriteMsg(m)
	})
	pc, l := listenPair(t)
	u.addr = pc.LocalAddr().String()
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: h}, {Listener: l, Handler: h}} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		go func() { _ = srv.ActivateAndServe() }()
		<-started
		t.Cleanup(func() { _ = srv.Shutdown() })
	}
	return u
}

// listenPair opens UDP and TCP on the same loopback port.
func listenPair(t testing.TB) (net.PacketConn, net.Listener) {
	t.Helper()
	for range 20 {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		l, err := net.Listen("tcp", pc.LocalAddr().String())
		if err != nil {
			pc.Close() // port taken on TCP; try another
			continue
		}
		return pc, l
	}
	t.Fatal("no free loopback port pair")
	return nil, nil
}

// answerWith builds a reply to req from zone-file lines.
func answerWith(t testing.TB, rcode int, lines ...string) func(req *dns.Msg) *dns.Msg {
	return func(req *dns.Msg) *dns.Msg {
		m := new(dns.Msg)
		m.SetRcode(req, rcode)
		m.RecursionAvailable = true
		for _, l := range lines {
			rr, err := dns.NewRR(l)
			if err != nil {
				t.Errorf("bad test RR %q: %v", l, err)
				continue
			}
			if strings.HasPrefix(l, "glue ") || rr.Header().Rrtype == dns.TypeNS {
				m.Extra = append(m.Extra, rr)
			} else {
				m.Answer = append(m.Answer, rr)
			}
		}
		return m
	}
}

type onAnswerCall struct {
	src   netip.Addr
	name  string
	addrs []netip.Addr
	ttl   time.Duration
}

type recorder struct {
	mu    sync.Mutex
	calls []onAnswerCall
	err   error
	hook  func() // runs inside OnAnswer
}

func (r *recorder) onAnswer(_ context.Context, src netip.Addr, name string, addrs []netip.Addr, ttl time.Duration) error {
	if r.hook != nil {
		r.hook()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, onAnswerCall{src, name, addrs, ttl})
	return r.err
}

func (r *recorder) get() []onAnswerCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

var sandboxIP = netip.MustParseAddr("127.0.0.1")

// startFilter runs a Server on loopback UDP+TCP (same port) and returns its
// address. The sandbox is 127.0.0.1; every other source is unknown.
func startFilter(t *testing.T, cfg Config, rules Rules) string {
	t.Helper()
	if cfg.Lookup == nil {
		cfg.Lookup = func(src netip.Addr) (Rules, bool) {
			if src == sandboxIP {
				return rules, true
			}
			return Rules{}, false
		}
	}
	s := New(cfg)
	pc, l := listenPair(t)
	done := make(chan error, 1)
	go func() { done <- s.Serve(pc, l) }()
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve returned %v after Close, want nil", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return after Close")
		}
	})
	return pc.LocalAddr().String()
}

func query(t *testing.T, netw, server, name string, qtype uint16) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	r, err := exchange(netw, server, m, nil)
	if err != nil {
		t.Fatalf("query %s %s over %s: %v", name, dns.TypeToString[qtype], netw, err)
	}
	return r
}

func exchange(netw, server string, m *dns.Msg, local net.Addr) (*dns.Msg, error) {
	c := &dns.Client{Net: netw, Timeout: 10 * time.Second}
	if local != nil {
		c.Dialer = &net.Dialer{LocalAddr: local, Timeout: 10 * time.Second}
	}
	r, _, err := c.Exchange(m, server)
	return r, err
}

func addrsOf(m *dns.Msg) []string {
	var out []string
	for _, sec := range [][]dns.RR{m.Answer, m.Ns, m.Extra} {
		for _, rr := range sec {
			switch r := rr.(type) {
			case *dns.A:
				out = append(out, r.A.String())
			case *dns.AAAA:
				out = append(out, r.AAAA.String())
			}
		}
	}
	return out
}

func TestAllowedNameIsForwardedAndOpenedBeforeReply(t *testing.T) {
	up := startUpstream(t, answerWith(t, dns.RcodeSuccess,
		"www.Example.com. 300 IN CNAME cdn.elsewhere.net.",
		"cdn.elsewhere.net. 60 IN A 192.0.2.10",
		"cdn.elsewhere.net. 60 IN A 192.0.2.11",
		// Not on the chain: must neither be opened nor reach the sandbox.
		"unrelated.test. 60 IN A 198.51.100.1",
		"glue 60 IN A 198.51.100.2",
	))
	entered := make(chan struct{})
	release := make(chan struct{})
	rec := &recorder{hook: func() { close(entered); <-release }}
	addr := startFilter(t, Config{Upstreams: []string{up.addr}, OnAnswer: rec.onAnswer},
		Rules{Allow: []string{"*.EXAMPLE.com."}, DenyAll: true})

	type result struct {
		m   *dns.Msg
		err error
	}
	got := make(chan result, 1)
	go func() {
		m := new(dns.Msg)
		m.SetQuestion("wWw.example.COM.", dns.TypeA)
		r, err := exchange("udp", addr, m, nil)
		got <- result{r, err}
	}()
	select {
	case <-entered:
	case r := <-got:
		t.Fatalf("reply (%v, %v) arrived without OnAnswer being called", r.m, r.err)
	}
	select {
	case r := <-got:
		t.Fatalf("reply released while OnAnswer was still running: %v", r.m)
	default:
	}
	close(release)
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.m.Rcode != dns.RcodeSuccess {
		t.Fatalf("rcode %s", dns.RcodeToString[r.m.Rcode])
	}
	if got, want := addrsOf(r.m), []string{"192.0.2.10", "192.0.2.11"}; !slices.Equal(got, want) {
		t.Errorf("reply addresses %v, want %v (off-chain records must be dropped)", got, want)
	}
	if len(r.m.Answer) != 3 {
		t.Errorf("answer has %d records, want CNAME + 2 A: %v", len(r.m.Answer), r.m.Answer)
	}
	if q := r.m.Question[0].Name; q != "wWw.example.COM." {
		t.Errorf("reply question %q, want the client's exact name", q)
	}
	calls := rec.get()
	if len(calls) != 1 {
		t.Fatalf("OnAnswer called %d times, want 1", len(calls))
	}
	c := calls[0]
	wantAddrs := []netip.Addr{netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("192.0.2.11")}
	if c.src != sandboxIP || c.name != "www.example.com" || !slices.Equal(c.addrs, wantAddrs) || c.ttl != 60*time.Second {
		t.Errorf("OnAnswer(%v, %q, %v, %v), want (%v, www.example.com, %v, 1m0s)", c.src, c.name, c.addrs, c.ttl, sandboxIP, wantAddrs)
	}
	// The CNAME's TTL (300) is capped to what the firewall was told.
	for _, rr := range r.m.Answer {
		if rr.Header().Ttl > 60 {
			t.Errorf("record %v outlives the firewall opening (60 s)", rr)
		}
	}
	qs := up.queries()
	if len(qs) != 1 || qs[0].Question[0].Name != "wWw.example.COM." || qs[0].Question[0].Qtype != dns.TypeA {
		t.Errorf("upstream saw %v, want one A query for the exact name", qs)
	}
}

func TestDeniedNameNeverLeaves(t *testing.T) {
	up := startUpstream(t, answerWith(t, dns.RcodeSuccess, "x. 60 IN A 192.0.2.1"))
	rec := &recorder{}
	addr := startFilter(t, Config{Upstreams: []string{up.addr}, OnAnswer: rec.onAnswer},
		Rules{Allow: []string{"*.example.com", "api.example.org"}, DenyAll: true})

	for _, tc := range []struct {
		name  string
		qtype uint16
	}{
		{"c2VjcmV0.attacker.test.", dns.TypeA},
		{"c2VjcmV0.attacker.test.", dns.TypeTXT},
		{"example.com.", dns.TypeA},          // apex is not covered by *.example.com
		{"x.api.example.org.", dns.TypeAAAA}, // exact pattern covers no subdomain
		{`data\.example.com.`, dns.TypeA},    // one label "data.example" under com
		{`a.b\.example.com.attacker.test.`, dns.TypeA},
		{"4.3.2.1.in-addr.arpa.", dns.TypePTR},
	} {
		for _, netw := range []string{"udp", "tcp"} {
			m := new(dns.Msg)
			m.SetQuestion(tc.name, tc.qtype)
			m.SetEdns0(1232, false)
			r, err := exchange(netw, addr, m, nil)
			if err != nil {
				t.Fatalf("%s %s: %v", tc.name, netw, err)
			}
			if r.Rcode != dns.RcodeNameError {
				t.Errorf("%s %s over %s: rcode %s, want NXDOMAIN", tc.name, dns.TypeToString[tc.qtype], netw, dns.RcodeToString[r.Rcode])
			}
			var ede *dns.EDNS0_EDE
			if opt := r.IsEdns0(); opt != nil {
				for _, o := range opt.Option {
					if e, ok := o.(*dns.EDNS0_EDE); ok {
						ede = e
					}
				}
			}
			if ede == nil || ede.InfoCode != dns.ExtendedErrorCodeBlocked {
				t.Errorf("%s: no Extended DNS Error Blocked in %v", tc.name, r)
			}
		}
	}
	if qs := up.queries(); len(qs) != 0 {
		t.Errorf("denied names reached the upstream: %v", qs)
	}
	if c := rec.get(); len(c) != 0 {
		t.Errorf("OnAnswer called for denied names: %v", c)
	}
}

func TestUpstreamSeesOnlyTheQuestion(t *testing.T) {
	up := startUpstream(t, answerWith(t, dns.RcodeSuccess, "a.example.com. 60 IN TXT \"hi\""))
	addr := startFilter(t, Config{Upstreams: []string{up.addr}}, Rules{Allow: []string{"*.example.com"}, DenyAll: true})
	m := new(dns.Msg)
	m.SetQuestion("a.example.com.", dns.TypeTXT)
	m.SetEdns0(4096, true)
	opt := m.IsEdns0()
	opt.Option = append(opt.Option,
		&dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0123456789abcdef"},
		&dns.EDNS0_LOCAL{Code: 65001, Data: []byte("exfiltrated secret")})
	r, err := exchange("udp", addr, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Answer) != 1 {
		t.Fatalf("want the TXT answer, got %v", r)
	}
	qs := up.queries()
	if len(qs) != 1 {
		t.Fatalf("upstream saw %d queries", len(qs))
	}
	uo := qs[0].IsEdns0()
	if uo == nil || !uo.Do() {
		t.Errorf("DO bit not forwarded: %v", qs[0])
	}
	if uo != nil && len(uo.Option) != 0 {
		t.Errorf("client EDNS options reached the upstream: %v", uo.Option)
	}
}

func TestDefaultAllowedNameResolvesWithoutOpening(t *testing.T) {
	up := startUpstream(t, answerWith(t, dns.RcodeSuccess, "free.test. 60 IN A 192.0.2.7"))
	rec := &recorder{}
	addr := startFilter(t, Config{Upstreams: []string{up.addr}, OnAnswer: rec.onAnswer},
		Rules{Deny: []string{"blocked.test"}})
	r := query(t, "udp", addr, "free.test.", dns.TypeA)
	if got := addrsOf(r); !slices.Equal(got, []string{"192.0.2.7"}) {
		t.Errorf("answer %v", got)
	}
	if c := rec.get(); len(c) != 0 {
		t.Errorf("OnAnswer called for a name no Allow pattern matched: %v (it would bypass denyOut CIDRs)", c)
	}
	if r := query(t, "udp", addr, "blocked.test.", dns.TypeA); r.Rcode != dns.RcodeNameError {
		t.Errorf("Deny pattern: rcode %s, want NXDOMAIN", dns.RcodeToString[r.Rcode])
	}
	if n := len(up.queries()); n != 1 {
		t.Errorf("upstream saw %d queries, want 1", n)
	}
}

func TestUnknownSourceRefused(t *testing.T) {
	up := startUpstream(t, answerWith(t, dns.RcodeSuccess, "a.example.com. 60 IN A 192.0.2.1"))
	addr := startFilter(t, Config{Upstreams: []string{up.addr}}, Rules{Allow: []string{"*"}})
	m := new(dns.Msg)
	m.SetQuestion("a.example.com.", dns.TypeA)
	for _, local := range []net.Addr{&net.UDPAddr{IP: net.IPv4(127, 0, 0, 2)}, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}} {
		netw := "udp"
		if _, ok := local.(*net.TCPAddr); ok {
			netw = "tcp"
		}
		r, err := exchange(netw, addr, m, local)
		if err != nil {
			t.Fatalf("%s: %v", netw, err)
		}
		if r.Rcode != dns.RcodeRefused {
			t.Errorf("%s: rcode %s, want REFUSED", netw, dns.RcodeToString[r.Rcode])
		}
	}
	if qs := up.queries(); len(qs) != 0 {
		t.Errorf("unknown source's query reached the upstream: %v", qs)
	}
}

func TestUpstreamFailover(t *testing.T) {
	blackhole := startUpstream(t, func(*dns.Msg) *dns.Msg { return nil })
	servfail := startUpstream(t, answerWith(t, dns.RcodeServerFailure))
	good := startUpstream(t, answerWith(t, dns.RcodeSuccess, "a.example.com. 60 IN A 192.0.2.1"))
	// A port with nothing on it: the kernel answers "connection refused".
	dead, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.LocalAddr().String()
	dead.Close()

	addr := startFilter(t, Config{
		Upstreams:       []string{deadAddr, blackhole.addr, servfail.addr, good.addr},
		UpstreamTimeout: 300 * time.Millisecond,
	}, Rules{Allow: []string{"*.example.com"}, DenyAll: true})
	for i := range 3 {
		r := query(t, "udp", addr, "a.example.com.", dns.TypeA)
		if got := addrsOf(r); r.Rcode != dns.RcodeSuccess || !slices.Equal(got, []string{"192.0.2.1"}) {
			t.Fatalf("query %d: %s %v", i, dns.RcodeToString[r.Rcode], got)
		}
	}
	// The blackhole timed out once and was then tried only after the
	// healthy ones; SERVFAIL is about the name, so that one stays in front.
	if n := len(blackhole.queries()); n != 1 {
		t.Errorf("blackhole upstream got %d queries, want 1 (it should be skipped once down)", n)
	}
	if n := len(servfail.queries()); n != 3 {
		t.Errorf("servfail upstream got %d queries, want 3", n)
	}
	if n := len(good.queries()); n != 3 {
		t.Errorf("good upstream got %d queries, want 3", n)
	}
}

func TestAllUpstreamsFailingIsServfail(t *testing.T) {
	dead, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.LocalAddr().String()
	dead.Close()
	addr := startFilter(t, Config{Upstreams: []string{deadAddr}}, Rules{})
	if r := query(t, "udp", addr, "a.example.com.", dns.TypeA); r.Rcode != dns.RcodeServerFailure {
		t.Errorf("rcode %s, want SERVFAIL", dns.RcodeToString[r.Rcode])
	}
}

func TestTCPAndTruncation(t *testing.T) {
	var lines []string
	for i := range 100 {
		lines = append(lines, fmt.Sprintf("big.example.com. 60 IN A 192.0.2.%d", i+1))
	}
	up := startUpstream(t, answerWith(t, dns.RcodeSuccess, lines...))
	rec := &recorder{}
	addr := startFilter(t, Config{Upstreams: []string{up.addr}, OnAnswer: rec.onAnswer},
		Rules{Allow: []string{"big.example.com"}, DenyAll: true})

	// Plain UDP (512 bytes): truncated, TC set.
	r := query(t, "udp", addr, "big.example.com.", dns.TypeA)
	if !r.Truncated || len(r.Answer) >= 100 {
		t.Errorf("UDP reply: TC=%v with %d records, want TC and fewer than 100", r.Truncated, len(r.Answer))
	}
	r.Compress = true // as it went on the wire
	if n, err := r.Pack(); err != nil || len(n) > dns.MinMsgSize {
		t.Errorf("UDP reply is %d bytes (%v), want <= 512", len(n), err)
	}
	// TCP: everything.
	r = query(t, "tcp", addr, "big.example.com.", dns.TypeA)
	if r.Truncated || len(r.Answer) != 100 {
		t.Errorf("TCP reply: TC=%v with %d records, want 100", r.Truncated, len(r.Answer))
	}
	// The upstream truncated its own UDP answer (1232 bytes), so the
	// forwarder must have retried it over TCP: all 100 addresses opened.
	for _, c := range rec.get() {
		if len(c.addrs) != 100 {
			t.Errorf("OnAnswer got %d addresses, want 100", len(c.addrs))
		}
	}
	if len(rec.get()) != 2 {
		t.Errorf("OnAnswer called %d times, want 2", len(rec.get()))
	}
}

func TestOnAnswerErrorIsServfail(t *testing.T) {
	up := startUpstream(t, answerWith(t, dns.RcodeSuccess, "a.example.com. 60 IN A 192.0.2.1"))
	rec := &recorder{err: errors.New("nft: no room")}
	addr := startFilter(t, Config{Upstreams: []string{up.addr}, OnAnswer: rec.onAnswer},
		Rules{Allow: []string{"a.example.com"}, DenyAll: true})
	r := query(t, "udp", addr, "a.example.com.", dns.TypeA)
	if r.Rcode != dns.RcodeServerFailure || len(r.Answer) != 0 {
		t.Errorf("rcode %s with %v, want SERVFAIL and no addresses", dns.RcodeToString[r.Rcode], r.Answer)
	}
}

func TestHTTPSRecordLosesAddressHints(t *testing.T) {
	up := startUpstream(t, answerWith(t, dns.RcodeSuccess,
		`a.example.com. 300 IN HTTPS 1 . alpn="h3,h2" ipv4hint="198.51.100.9" ipv6hint="2001:db8::9"`))
	rec := &recorder{}
	addr := startFilter(t, Config{Upstreams: []string{up.addr}, OnAnswer: rec.onAnswer},
		Rules{Allow: []string{"*.example.com"}, DenyAll: true})
	r := query(t, "udp", addr, "a.example.com.", dns.TypeHTTPS)
	if len(r.Answer) != 1 {
		t.Fatalf("want one HTTPS record, got %v", r.Answer)
	}
	h, ok := r.Answer[0].(*dns.HTTPS)
	if !ok {
		t.Fatalf("got %T", r.Answer[0])
	}
	var keys []string
	for _, kv := range h.Value {
		keys = append(keys, kv.Key().String())
	}
	if !slices.Equal(keys, []string{"alpn"}) {
		t.Errorf("HTTPS parameters %v, want only alpn (hints never pass the firewall)", keys)
	}
	if c := rec.get(); len(c) != 0 {
		t.Errorf("OnAnswer called for an HTTPS query: %v", c)
	}
}

func TestMalformedAndHostileInputIsDropped(t *testing.T) {
	up := startUpstream(t, answerWith(t, dns.RcodeSuccess, "a.example.com. 60 IN A 192.0.2.1"))
	addr := startFilter(t, Config{Upstreams: []string{up.addr}}, Rules{Allow: []string{"*.example.com"}, DenyAll: true})
	c, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	resp := new(dns.Msg)
	resp.SetQuestion("a.example.com.", dns.TypeA)
	resp.Response = true
	respBytes, _ := resp.Pack()
	for _, p := range [][]byte{
		{0x00},
		[]byte("not a dns message at all"),
		make([]byte, 12+5000), // oversized
		respBytes,             // a response: never answered (no reflection)
		{0x12, 0x34, 0x01, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xc0, 0x0c}, // compression loop
	} {
		if _, err := c.Write(p); err != nil {
			t.Fatal(err)
		}
	}
	// The next real query is answered, and is the only thing answered.
	q := new(dns.Msg)
	q.SetQuestion("a.example.com.", dns.TypeA)
	qb, _ := q.Pack()
	if _, err := c.Write(qb); err != nil {
		t.Fatal(err)
	}
	if err := c.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2048)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	r := new(dns.Msg)
	if err := r.Unpack(buf[:n]); err != nil {
		t.Fatal(err)
	}
	if r.Id != q.Id || r.Rcode != dns.RcodeSuccess {
		t.Errorf("first datagram back is %v, want the answer to the real query", r)
	}

	// A TCP frame claiming more than the query limit closes the connection.
	tc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	if _, err := tc.Write([]byte{0xff, 0xff}); err != nil {
		t.Fatal(err)
	}
	if err := tc.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := tc.Read(buf); err == nil {
		t.Error("oversized TCP frame: connection still open")
	}
}

func TestOtherRequestsAreRefusedOrNotImplemented(t *testing.T) {
	up := startUpstream(t, answerWith(t, dns.RcodeSuccess))
	addr := startFilter(t, Config{Upstreams: []string{up.addr}}, Rules{Allow: []string{"*"}})
	for _, tc := range []struct {
		name  string
		build func(m *dns.Msg)
		want  int
	}{
		{"AXFR", func(m *dns.Msg) { m.SetQuestion("example.com.", dns.TypeAXFR) }, dns.RcodeNotImplemented},
		{"ANY", func(m *dns.Msg) { m.SetQuestion("example.com.", dns.TypeANY) }, dns.RcodeNotImplemented},
		{"CHAOS", func(m *dns.Msg) {
			m.SetQuestion("version.bind.", dns.TypeTXT)
			m.Question[0].Qclass = dns.ClassCHAOS
		}, dns.RcodeRefused},
		{"UPDATE", func(m *dns.Msg) { m.SetUpdate("example.com.") }, dns.RcodeNotImplemented},
		{"two questions", func(m *dns.Msg) {
			m.SetQuestion("a.example.com.", dns.TypeA)
			m.Question = append(m.Question, dns.Question{Name: "b.example.com.", Qtype: dns.TypeA, Qclass: dns.ClassINET})
		}, dns.RcodeFormatError},
	} {
		m := new(dns.Msg)
		tc.build(m)
		r, err := exchange("tcp", addr, m, nil)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if r.Rcode != tc.want {
			t.Errorf("%s: rcode %s, want %s", tc.name, dns.RcodeToString[r.Rcode], dns.RcodeToString[tc.want])
		}
	}
	if qs := up.queries(); len(qs) != 0 {
		t.Errorf("upstream saw %v", qs)
	}
}

func TestTCPConnectionsPerSourceAreCapped(t *testing.T) {
	up := startUpstream(t, answerWith(t, dns.RcodeSuccess, "a.example.com. 60 IN A 192.0.2.1"))
	addr := startFilter(t, Config{Upstreams: []string{up.addr}, MaxTCPConnsPerSource: 1}, Rules{})
	c1, err := (&dns.Client{Net: "tcp", Timeout: 10 * time.Second}).Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	q := new(dns.Msg)
	q.SetQuestion("a.example.com.", dns.TypeA)
	// A round trip on c1 proves the server has accepted and counted it.
	if _, _, err := (&dns.Client{Net: "tcp"}).ExchangeWithConn(q, c1); err != nil {
		t.Fatal(err)
	}
	c2, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if err := c2.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := c2.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Errorf("second connection from the same source: read %v, want it closed at once", err)
	}
	// c1 still works.
	if _, _, err := (&dns.Client{Net: "tcp"}).ExchangeWithConn(q, c1); err != nil {
		t.Errorf("first connection broken: %v", err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestLimiter(t *testing.T) {
	l := newLimiter(1, 2) // 1 q/s, burst 2, 2 in flight
	src := netip.MustParseAddr("10.0.0.2")
	other := netip.MustParseAddr("10.0.0.3")
	t0 := time.Unix(1000, 0)
	d1, ok1 := l.acquire(src, t0)
	d2, ok2 := l.acquire(src, t0)
	if !ok1 || !ok2 {
		t.Fatal("burst of 2 refused")
	}
	if _, ok := l.acquire(src, t0.Add(1500*time.Millisecond)); ok {
		t.Error("third in-flight query admitted")
	}
	d1()
	d2()
	d3, ok3 := l.acquire(src, t0.Add(1500*time.Millisecond))
	if !ok3 {
		t.Fatal("query refused after a token refilled and slots freed")
	}
	d3()
	if _, ok := l.acquire(src, t0.Add(1600*time.Millisecond)); ok {
		t.Error("rate not enforced: bucket should be empty")
	}
	if _, ok := l.acquire(other, t0.Add(1600*time.Millisecond)); !ok {
		t.Error("another source was limited by the first one's bucket")
	}
	// Idle, refilled sources are forgotten.
	l.acquire(other, t0.Add(10*time.Minute))
	if _, ok := l.sources[src]; ok {
		t.Error("idle source not swept")
	}
}

func TestServeAndCloseLifecycle(t *testing.T) {
	s := New(Config{Upstreams: []string{"127.0.0.1:1"}, Lookup: func(netip.Addr) (Rules, bool) { return Rules{}, false }})
	if err := s.Serve(nil, nil); err == nil {
		t.Error("Serve(nil, nil) succeeded")
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(pc, nil) }()
	// Serve registers pc before reading, but give Close a real race anyway:
	// either order must end with Serve returning nil and pc closed.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Errorf("Serve after Close: %v", err)
	}
	if _, err := pc.WriteTo([]byte{0}, pc.LocalAddr()); !errors.Is(err, net.ErrClosed) {
		t.Errorf("packet conn not closed: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestCloseInterruptsPendingUpstream(t *testing.T) {
	blackhole := startUpstream(t, func(*dns.Msg) *dns.Msg { return nil })
	s := New(Config{
		Upstreams:       []string{blackhole.addr},
		UpstreamTimeout: time.Minute, // only Close can end the query in time
		Lookup:          func(netip.Addr) (Rules, bool) { return Rules{}, true },
	})
	pc, l := listenPair(t)
	served := make(chan error, 1)
	go func() { served <- s.Serve(pc, l) }()
	c, err := net.Dial("udp", pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	q := new(dns.Msg)
	q.SetQuestion("slow.test.", dns.TypeA)
	if _, err := c.Write(packed(t, q)); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); len(blackhole.queries()) == 0; {
		if time.Now().After(deadline) {
			t.Fatal("query never reached the upstream")
		}
		time.Sleep(10 * time.Millisecond)
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second): // well under queryDeadline (8 s) and the upstream timeout
		t.Fatal("Close waited for the upstream timeout instead of cancelling")
	}
	if err := <-served; err != nil {
		t.Errorf("Serve: %v", err)
	}
}

// BenchmarkForwardUDP measures one allowed A query end to end on loopback:
// client -> filter -> fake upstream -> OnAnswer -> client.
func BenchmarkForwardUDP(b *testing.B) {
	up := startUpstream(b, answerWith(b, dns.RcodeSuccess, "a.example.com. 60 IN A 192.0.2.1"))
	s := New(Config{
		Upstreams:        []string{up.addr},
		QueriesPerSecond: 1e9,
		Lookup: func(netip.Addr) (Rules, bool) {
			return Rules{Allow: []string{"*.example.com"}, DenyAll: true}, true
		},
		OnAnswer: func(context.Context, netip.Addr, string, []netip.Addr, time.Duration) error { return nil },
	})
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = s.Serve(pc, nil) }()
	defer s.Close()
	c, err := (&dns.Client{Net: "udp", Timeout: 10 * time.Second}).Dial(pc.LocalAddr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	q := new(dns.Msg)
	q.SetQuestion("a.example.com.", dns.TypeA)
	cl := &dns.Client{Net: "udp", Timeout: 10 * time.Second}
	b.ResetTimer()
	for b.Loop() {
		r, _, err := cl.ExchangeWithConn(q, c)
		if err != nil || len(r.Answer) != 1 {
			b.Fatalf("%v %v", r, err)
		}
	}
}
