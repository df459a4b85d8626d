// Package dnsfilter is the filtering DNS forwarder that sandboxes use as
// their resolver, so that egress rules can name domains.
//
// Every query is attributed to a sandbox by its source address
// (Config.Lookup), checked against that sandbox's Rules, and only then
// forwarded upstream. A name the rules deny is answered locally and never
// leaves the host, so a sandbox restricted to a few domains cannot use DNS
// to smuggle data out through other names. For names that match an Allow
// pattern the final addresses of the answer are handed to Config.OnAnswer
// before the answer is released, so the firewall has opened them by the
// time the sandbox connects.
//
// Choices, and why:
//
//   - A denied name gets NXDOMAIN, with an RFC 8914 Extended DNS Error
//     "Blocked" (code 15, text "denied by sandbox egress policy") when the
//     query carried EDNS. NXDOMAIN ends resolution at once: getaddrinfo says
//     "Name or service not known" and curl "Could not resolve host". REFUSED
//     would make glibc retry and try other servers, end in the misleading
//     "Temporary failure in name resolution" (EAI_AGAIN), and make tools
//     that retry transient errors (pip, apt, npm) spin. REFUSED is kept for
//     what it means: a source that is not a known sandbox.
//   - A CNAME from an allowed name to a name the rules do not allow is
//     followed: the upstream resolver walks the chain, the sandbox never
//     sends the target name anywhere, and the firewall opens only the final
//     addresses, which the allowed name's owner chose. Rules are about
//     which names a sandbox may ask for, not where they are hosted.
//   - Answers are rebuilt, not relayed: only the CNAME chain from the
//     question and the records of the asked type on it are kept, the
//     authority section keeps only SOA/NSEC/NSEC3/RRSIG (negative caching),
//     the additional section is dropped, and SVCB/HTTPS records lose their
//     ipv4hint/ipv6hint parameters. Every address a sandbox sees therefore
//     came from an A/AAAA record that went through OnAnswer; a client that
//     used an HTTPS record's hints (browsers, curl with HTTPS-RR support)
//     would otherwise connect to addresses the firewall never opened.
//   - The upstream query is rebuilt too: only the question (name with its
//     case, type, class), RD, CD and the DO bit are forwarded. EDNS options
//     from the sandbox (cookies, client subnet, padding...) could carry data
//     and are not forwarded.
//   - TTL given to OnAnswer is the smallest TTL of the kept answer records,
//     clamped to [MinTTL, MaxTTL]; records in the reply are capped at that
//     value so the sandbox never caches an address longer than the firewall
//     keeps it open.
//   - Zone transfers (AXFR/IXFR), ANY, non-IN classes and non-QUERY opcodes
//     are not forwarded (NOTIMP / REFUSED): a sandbox resolver has no use
//     for them and they only widen what a query can do.
//
// Bounds: queries are at most 4096 bytes (larger ones are dropped); each
// source has a token bucket and a cap on in-flight queries and TCP
// connections, with global caps above them; a query that exceeds them is
// dropped (UDP) or its connection closed (TCP), which stub resolvers treat
// as a timeout and retry later. Every upstream attempt and every OnAnswer
// call has a deadline. Malformed packets and responses are dropped.
package dnsfilter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// Config configures a Server. Upstreams and Lookup are required.
type Config struct {
	// Upstreams are the recursive resolvers, "ip:port", tried in order. One
	// that fails at the transport level is skipped for a while so a dead
	// first upstream does not add its timeout to every query.
	Upstreams []string
	// Lookup returns the rules of the sandbox that owns src; false means src
	// is not a sandbox and gets REFUSED.
	Lookup func(src netip.Addr) (Rules, bool)
	// OnAnswer is called, before the answer is released, for an A or AAAA
	// answer to a name that matched an Allow pattern and has addresses
	// (see Rules for why only those). name is the question name, lower-cased
	// and without the trailing dot; addrs are the final addresses of its
	// CNAME chain, unmapped and deduplicated, exactly as upstream gave them
	// (private ones included: the firewall's fixed deny set must outrank
	// anything opened here); ttl is clamped to [MinTTL, MaxTTL]. An error
	// makes the sandbox get SERVFAIL instead of the answer.
	OnAnswer func(ctx context.Context, src netip.Addr, name string, addrs []netip.Addr, ttl time.Duration) error
	// Logger is optional.
	Logger *slog.Logger

	// Optional bounds; zero means the default in parentheses.
	MaxInflightPerSource int           // queries being resolved per source (32)
	QueriesPerSecond     float64       // sustained rate per source (100; burst is twice that)
	MaxTCPConnsPerSource int           // open TCP connections per source (8)
	UpstreamTimeout      time.Duration // per upstream attempt (2 s)
}

// Limits that are not worth configuring.
const (
	maxQuerySize      = 4096             // larger queries are dropped; real ones are < 300 bytes
	maxUDPReply       = 1232             // DNS flag day 2020: avoids IP fragmentation
	upstreamUDPSize   = 1232             // what we advertise upstream
	maxInflightGlobal = 1024             // queries being resolved, all sources
	maxTCPConnsGlobal = 256              // open TCP connections, all sources
	queryDeadline     = 8 * time.Second  // whole query, upstreams and OnAnswer included
	onAnswerTimeout   = 3 * time.Second  // OnAnswer alone
	tcpIdleTimeout    = 10 * time.Second // between queries on one TCP connection
	tcpWriteTimeout   = 5 * time.Second
	upstreamDownFor   = 10 * time.Second // how long a failed upstream goes to the back
	maxSources        = 65536            // tracked sources; new ones beyond are dropped
	MinTTL            = 5 * time.Second
	MaxTTL            = time.Hour
)

// Server is a filtering DNS forwarder. Create it with New, run it with
// Serve and stop it with Close.
type Server struct {
	cfg      Config
	log      *slog.Logger
	ctx      context.Context
	cancel   context.CancelFunc
	limiter  *limiter
	upstream *upstreams
	global   chan struct{} // in-flight query slots, all sources

	// exchange sends one query upstream; tests and fuzzing replace it.
	exchange func(ctx context.Context, m *dns.Msg) (*dns.Msg, error)

	mu      sync.Mutex
	closed  bool
	closers map[any]func() error // packet conns, listeners, TCP conns
	tcpConn map[netip.Addr]int   // open TCP connections per source
	tcpAll  int
	wg      sync.WaitGroup
}

// New returns a Server for cfg. It does not listen; see Serve.
func New(cfg Config) *Server {
	if cfg.MaxInflightPerSource <= 0 {
		cfg.MaxInflightPerSource = 32
	}
	if cfg.QueriesPerSecond <= 0 {
		cfg.QueriesPerSecond = 100
	}
	if cfg.MaxTCPConnsPerSource <= 0 {
		cfg.MaxTCPConnsPerSource = 8
	}
	if cfg.UpstreamTimeout <= 0 {
		cfg.UpstreamTimeout = 2 * time.Second
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		cfg:      cfg,
		log:      log,
		ctx:      ctx,
		cancel:   cancel,
		limiter:  newLimiter(cfg.QueriesPerSecond, cfg.MaxInflightPerSource),
		upstream: newUpstreams(cfg.Upstreams, cfg.UpstreamTimeout),
		global:   make(chan struct{}, maxInflightGlobal),
		closers:  make(map[any]func() error),
		tcpConn:  make(map[netip.Addr]int),
	}
	s.exchange = s.upstream.exchange
	return s
}

// Serve answers queries on pc (UDP) and l (TCP); either may be nil, not
// both. It returns nil once Close is called, or the first error that stops
// a listener. Serve may be called more than once (for several addresses).
func (s *Server) Serve(pc net.PacketConn, l net.Listener) error {
	if pc == nil && l == nil {
		return errors.New("dnsfilter: Serve needs a packet conn or a listener")
	}
	if len(s.cfg.Upstreams) == 0 || s.cfg.Lookup == nil {
		return errors.New("dnsfilter: Config needs Upstreams and Lookup")
	}
	if !s.track(pc, l) {
		// Closed already: the caller handed us these, so close them.
		if pc != nil {
			pc.Close()
		}
		if l != nil {
			l.Close()
		}
		return nil
	}
	errc := make(chan error, 2)
	n := 0
	if pc != nil {
		n++
		go func() { errc <- s.serveUDP(pc) }()
	}
	if l != nil {
		n++
		go func() { errc <- s.serveTCP(l) }()
	}
	var first error
	for range n {
		err := <-errc
		if err != nil && first == nil {
			first = err
			// One half failed; stop the other so Serve returns.
			if pc != nil {
				pc.Close()
			}
			if l != nil {
				l.Close()
			}
		}
	}
	if s.isClosed() {
		return nil
	}
	return first
}

func (s *Server) track(pc net.PacketConn, l net.Listener) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	if pc != nil {
		s.closers[pc] = pc.Close
	}
	if l != nil {
		s.closers[l] = l.Close
	}
	return true
}

func (s *Server) untrack(c any) {
	s.mu.Lock()
	delete(s.closers, c)
	s.mu.Unlock()
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Close stops every Serve call, closes their sockets and waits for queries
// in flight to end (they are cancelled, so this is quick).
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.cancel()
	var errs []error
	for c, closeFn := range s.closers {
		if err := closeFn(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, fmt.Errorf("close %T: %w", c, err))
		}
	}
	s.mu.Unlock()
	s.wg.Wait()
	return errors.Join(errs...)
}

func (s *Server) serveUDP(pc net.PacketConn) error {
	defer s.untrack(pc)
	buf := make([]byte, maxQuerySize+1)
	for {
		n, addr, err := pc.ReadFrom(buf)
		if err != nil {
			if s.isClosed() {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("dnsfilter: read udp: %w", err)
		}
		if n > maxQuerySize || n < 12 {
			continue // oversized or shorter than a DNS header
		}
		src, ok := addrOf(addr)
		if !ok {
			continue
		}
		release, ok := s.admit(src)
		if !ok {
			continue
		}
		pkt := make([]byte, n)
		copy(pkt, buf[:n])
		if !s.addWork() {
			release()
			return nil
		}
		go func() {
			defer s.wg.Done()
			defer release()
			reply := s.handle(s.ctx, src, pkt, false)
			if reply != nil {
				if _, err := pc.WriteTo(reply, addr); err != nil && !s.isClosed() {
					s.log.Debug("dns: write udp reply", "src", src, "err", err)
				}
			}
		}()
	}
}

func (s *Server) serveTCP(l net.Listener) error {
	defer s.untrack(l)
	for {
		c, err := l.Accept()
		if err != nil {
			if s.isClosed() {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("dnsfilter: accept tcp: %w", err)
		}
		src, ok := addrOf(c.RemoteAddr())
		if !ok || !s.openTCP(src, c) {
			c.Close()
			continue
		}
		go func() {
			defer s.wg.Done() // added by openTCP
			defer s.closeTCP(src, c)
			s.serveTCPConn(src, c)
		}()
	}
}

func (s *Server) openTCP(src netip.Addr, c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.tcpAll >= maxTCPConnsGlobal || s.tcpConn[src] >= s.cfg.MaxTCPConnsPerSource {
		return false
	}
	s.tcpAll++
	s.tcpConn[src]++
	s.closers[c] = c.Close
	s.wg.Add(1)
	return true
}

// addWork counts a query goroutine unless Close has begun. Adding under the
// lock that Close takes before Wait keeps Add from racing with Wait.
func (s *Server) addWork() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.wg.Add(1)
	return true
}

func (s *Server) closeTCP(src netip.Addr, c net.Conn) {
	c.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.closers, c)
	s.tcpAll--
	if s.tcpConn[src]--; s.tcpConn[src] <= 0 {
		delete(s.tcpConn, src)
	}
}

// serveTCPConn answers length-prefixed queries (RFC 7766) one at a time
// until the client goes idle, sends something unreasonable, or we close.
func (s *Server) serveTCPConn(src netip.Addr, c net.Conn) {
	var lenBuf [2]byte
	buf := make([]byte, maxQuerySize)
	for {
		if err := c.SetReadDeadline(time.Now().Add(tcpIdleTimeout)); err != nil {
			return
		}
		if _, err := readFull(c, lenBuf[:]); err != nil {
			return
		}
		n := int(lenBuf[0])<<8 | int(lenBuf[1])
		if n < 12 || n > maxQuerySize {
			return
		}
		if _, err := readFull(c, buf[:n]); err != nil {
			return
		}
		release, ok := s.admit(src)
		if !ok {
			return
		}
		reply := s.handle(s.ctx, src, buf[:n], true)
		release()
		if reply == nil {
			// Malformed: on a stream there is no resynchronising.
			return
		}
		out := make([]byte, 2+len(reply))
		out[0], out[1] = byte(len(reply)>>8), byte(len(reply))
		copy(out[2:], reply)
		if err := c.SetWriteDeadline(time.Now().Add(tcpWriteTimeout)); err != nil {
			return
		}
		if _, err := c.Write(out); err != nil {
			return
		}
	}
}

func readFull(c net.Conn, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := c.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// admit takes a global and a per-source slot for one query; release gives
// them back.
func (s *Server) admit(src netip.Addr) (release func(), ok bool) {
	select {
	case s.global <- struct{}{}:
	default:
		return nil, false
	}
	done, ok := s.limiter.acquire(src, time.Now())
	if !ok {
		<-s.global
		return nil, false
	}
	return func() { done(); <-s.global }, true
}

func addrOf(a net.Addr) (netip.Addr, bool) {
	switch a := a.(type) {
	case *net.UDPAddr:
		return a.AddrPort().Addr().Unmap(), true
	case *net.TCPAddr:
		return a.AddrPort().Addr().Unmap(), true
	}
	return netip.Addr{}, false
}
