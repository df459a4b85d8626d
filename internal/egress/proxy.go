// Package egress is Airlock's egress proxy: the host-side end of the TCP
// connections the firewall takes out of a sandbox's path (see
// internal/netpolicy/intercept.go) because the sandbox has network.rules or
// an egressProxy.
//
// Lifecycle of one connection:
//
//  1. Accept. The source address names the sandbox (Directory.EgressFor);
//     the original destination comes from conntrack (SO_ORIGINAL_DST). A
//     connection that was not redirected (a sandbox dialling the port
//     directly) or from an unknown source is closed.
//  2. Sniff, only where a rule could apply (port 443 or 80 and the sandbox
//     has rules): the TLS ClientHello's server name, or the first HTTP
//     request's Host. If no rule host matches, the bytes read so far are
//     replayed to the destination and the connection is spliced: it is
//     never decrypted or parsed further.
//  3. Intercept a rule host: TLS is terminated with a certificate the
//     server's CA issues for the name (the CA is in the sandbox's trust
//     store), each request gets its rules' headers with secret markers
//     filled in on the host, and goes to the original destination over
//     TLS that verifies the real server's certificate for the same name.
//     Rules are read per request, so updateNetwork applies to connections
//     already open. Upstream connections are kept alive and reused by the
//     sandbox's later connections to the same destination and name (never
//     by another sandbox's).
//  4. Dial: directly, or through the sandbox's SOCKS5 egressProxy (remote
//     DNS with the name the sandbox resolved, when known). A failure closes
//     the sandbox's connection with a reset, or answers 502 with a reason
//     once HTTP is being spoken: never a silent direct connection.
package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/proxy"

	"github.com/airlock-sandbox/airlock/internal/netpolicy"
)

// Directory tells the proxy about the sandbox behind a source address.
// *netpolicy.Network implements it.
type Directory interface {
	EgressFor(src netip.Addr) (netpolicy.Egress, bool)
	NameOf(src, dst netip.Addr) string
}

// FillFunc replaces the secret markers in a header value with the owner's
// secrets' values; an unknown secret is an error naming it.
type FillFunc func(ctx context.Context, owner, value string) (string, error)

// Config configures a Proxy.
type Config struct {
	Directory Directory
	CA        *CA
	Fill      FillFunc
	// Roots verify the real servers of intercepted hosts; nil means the
	// host's system roots.
	Roots  *x509.CertPool
	Logger *slog.Logger
	// DialTimeout bounds a dial to a destination or an egress proxy.
	DialTimeout time.Duration
}

// Proxy is the egress proxy.
type Proxy struct {
	cfg Config
	log *slog.Logger

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	ln     net.Listener

	// upstreams are the kept-alive upstream transports (see upstream).
	umu       sync.Mutex
	upstreams map[upstreamKey]*upstreamTransport
	ucl       atomic.Bool // closed: upstream keeps nothing more
}

// sniffTimeout bounds how long a client may take to send its ClientHello
// or request head.
const sniffTimeout = 10 * time.Second

// maxHead bounds a sniffed HTTP request head.
const maxHead = 64 << 10

// New makes a Proxy; Serve starts it.
func New(cfg Config) *Proxy {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	return &Proxy{cfg: cfg, log: cfg.Logger, conns: map[net.Conn]struct{}{}, upstreams: map[upstreamKey]*upstreamTransport{}}
}

// Listen opens the proxy's listener on addr ("0.0.0.0:0" for a free port):
// the firewall redirects to that port on whichever host address the
// connection arrived at, and only sandbox interfaces may reach it.
func Listen(addr string) (net.Listener, error) {
	l, err := net.Listen("tcp4", addr)
	if err != nil {
		return nil, fmt.Errorf("egress: listen %s: %w", addr, err)
	}
	return l, nil
}

// Serve accepts connections until Close.
func (p *Proxy) Serve(l net.Listener) error {
	p.mu.Lock()
	p.ln = l
	p.mu.Unlock()
	for {
		c, err := l.Accept()
		if err != nil {
			p.mu.Lock()
			closed := p.closed
			p.mu.Unlock()
			if closed {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("egress: accept: %w", err)
		}
		if !p.track(c, true) {
			c.Close()
			continue
		}
		go func() {
			defer p.track(c, false)
			defer c.Close()
			p.handle(c)
		}()
	}
}

// Close stops accepting and closes every open connection.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	l := p.ln
	conns := make([]net.Conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	p.ucl.Store(true)
	p.closeUpstreams()
	var err error
	if l != nil {
		err = l.Close()
	}
	for _, c := range conns {
		c.Close()
	}
	return err
}

func (p *Proxy) track(c net.Conn, add bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if add {
		if p.closed {
			return false
		}
		p.conns[c] = struct{}{}
	} else {
		delete(p.conns, c)
	}
	return true
}

// flow is one sandbox connection being handled.
type flow struct {
	src, dst netip.AddrPort
	eg       netpolicy.Egress
	// name is what the sandbox resolved dst from, if Airlock's DNS knows.
	name string
}

func (p *Proxy) handle(c net.Conn) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return
	}
	src := netip.MustParseAddrPort(c.RemoteAddr().String())
	dst, err := originalDst(tc)
	if err != nil {
		p.log.Debug("egress: no original destination", "src", src, "err", err)
		return
	}
	if local := netip.MustParseAddrPort(c.LocalAddr().String()); dst == local {
		return // dialled directly, not redirected
	}
	eg, ok := p.cfg.Directory.EgressFor(src.Addr())
	if !ok {
		return
	}
	f := &flow{src: src, dst: dst, eg: eg, name: p.cfg.Directory.NameOf(src.Addr(), dst.Addr())}
	if len(eg.Hosts) > 0 {
		switch dst.Port() {
		case 443:
			p.handleTLS(tc, f)
			return
		case 80:
			p.handleHTTP(tc, f)
			return
		}
	}
	p.splice(tc, f, nil)
}

// dial connects to the flow's destination, through the sandbox's egress
// proxy if it has one.
func (p *Proxy) dial(ctx context.Context, f *flow) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.DialTimeout)
	defer cancel()
	d := &net.Dialer{}
	if f.eg.Proxy == nil {
		return d.DialContext(ctx, "tcp", f.dst.String())
	}
	var auth *proxy.Auth
	if f.eg.Proxy.Username != "" {
		auth = &proxy.Auth{User: f.eg.Proxy.Username, Password: f.eg.Proxy.Password}
	}
	sd, err := proxy.SOCKS5("tcp", f.eg.Proxy.Address, auth, d)
	if err != nil {
		return nil, fmt.Errorf("egress proxy %s: %w", f.eg.Proxy.Address, err)
	}
	target := f.dst.String()
	if f.name != "" && !strings.HasPrefix(f.name, "*") {
		// Remote DNS for a name the sandbox resolved, as E2B does
		// (ATYP=domain): the proxy sees which host was meant.
		target = net.JoinHostPort(f.name, strconv.Itoa(int(f.dst.Port())))
	}
	c, err := sd.(proxy.ContextDialer).DialContext(ctx, "tcp", target)
	if err != nil {
		return nil, fmt.Errorf("egress proxy %s: %w", f.eg.Proxy.Address, err)
	}
	return c, nil
}

// splice connects the sandbox's connection to its destination untouched,
// after replaying what sniffing read.
func (p *Proxy) splice(c *net.TCPConn, f *flow, head []byte) {
	_ = c.SetReadDeadline(time.Time{})
	up, err := p.dial(context.Background(), f)
	if err != nil {
		p.log.Info("egress: dial failed", "sandbox", f.eg.ID, "dst", f.dst, "err", err)
		_ = c.SetLinger(0) // a reset: the sandbox's client sees the failure at once
		return
	}
	defer up.Close()
	if len(head) > 0 {
		if _, err := up.Write(head); err != nil {
			return
		}
	}
	pipe(c, up)
}

// pipe copies both ways until both directions are done, passing half-closes on.
func pipe(a, b net.Conn) {
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		} else {
			dst.Close()
		}
		done <- struct{}{}
	}
	go cp(a, b)
	go cp(b, a)
	<-done
	<-done
}

// errHelloRead ends a handshake once the ClientHello has been read.
var errHelloRead = errors.New("client hello read")

// readClientHello reads the ClientHello from c and returns its server name
// and every byte read, to be replayed.
func readClientHello(c net.Conn) (string, []byte, error) {
	var buf bytes.Buffer
	var sni string
	got := false
	err := tls.Server(readOnly{io.TeeReader(c, &buf)}, &tls.Config{
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			sni, got = h.ServerName, true
			return nil, errHelloRead
		},
	}).Handshake()
	if !got {
		return "", buf.Bytes(), fmt.Errorf("no TLS ClientHello: %w", err)
	}
	return sni, buf.Bytes(), nil
}

// readOnly is a net.Conn that can only be read: the handshake used to read
// a ClientHello never gets to write.
type readOnly struct{ r io.Reader }

func (r readOnly) Read(b []byte) (int, error)       { return r.r.Read(b) }
func (readOnly) Write([]byte) (int, error)          { return 0, errors.New("read-only") }
func (readOnly) Close() error                       { return nil }
func (readOnly) LocalAddr() net.Addr                { return &net.TCPAddr{} }
func (readOnly) RemoteAddr() net.Addr               { return &net.TCPAddr{} }
func (readOnly) SetDeadline(time.Time) error        { return nil }
func (readOnly) SetReadDeadline(time.Time) error    { return nil }
func (readOnly) SetWriteDeadline(t time.Time) error { return nil }

// prefixed replays head before reading on from the connection.
type prefixed struct {
	net.Conn
	r io.Reader
}

func (p *prefixed) Read(b []byte) (int, error) { return p.r.Read(b) }

func (p *Proxy) handleTLS(c *net.TCPConn, f *flow) {
	_ = c.SetReadDeadline(time.Now().Add(sniffTimeout))
	sni, head, err := readClientHello(c)
	if err != nil {
		// Not TLS on 443: not ours to read.
		p.splice(c, f, head)
		return
	}
	if !f.eg.HasRules(sni, f.dst.Addr()) {
		p.splice(c, f, head)
		return
	}
	name := sni
	if name == "" {
		name = f.dst.Addr().String()
	}
	_ = c.SetReadDeadline(time.Now().Add(sniffTimeout))
	tc := tls.Server(&prefixed{Conn: c, r: io.MultiReader(bytes.NewReader(head), c)}, &tls.Config{
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return p.cfg.CA.Leaf(name) },
		NextProtos:     []string{"http/1.1"},
		MinVersion:     tls.VersionTLS12,
	})
	if err := tc.Handshake(); err != nil {
		p.log.Debug("egress: TLS handshake with the sandbox failed", "sandbox", f.eg.ID, "name", name, "err", err)
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	p.serveHTTP(tc, f, "https", name)
}

func (p *Proxy) handleHTTP(c *net.TCPConn, f *flow) {
	_ = c.SetReadDeadline(time.Now().Add(sniffTimeout))
	br := bufio.NewReaderSize(c, maxHead)
	host, err := peekHost(br)
	if err != nil || !p.httpRuleApplies(f, host) {
		n := br.Buffered()
		head, _ := br.Peek(n)
		p.splice(c, f, head)
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	p.serveHTTP(&prefixed{Conn: c, r: br}, f, "http", "")
}

// httpRuleApplies: plain HTTP proves nothing about the server, so a rule
// applies only when the sandbox connected to an address its rule host
// resolved to (or an address rule), never merely because the request names
// the host: a sandbox could otherwise send a rule host's Host to any
// address and collect the secret there.
func (p *Proxy) httpRuleApplies(f *flow, host string) bool {
	if f.eg.HasRules("", f.dst.Addr()) {
		return true
	}
	h := hostOnly(host)
	return h != "" && f.name != "" && strings.EqualFold(h, f.name) && f.eg.HasRules(h, f.dst.Addr())
}

// peekHost returns the Host of the first request in br without consuming it.
func peekHost(br *bufio.Reader) (string, error) {
	for n := 1; ; n = br.Buffered() + 1 {
		b, err := br.Peek(n)
		if i := bytes.Index(b, []byte("\r\n\r\n")); i >= 0 {
			req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(b[:i+4])))
			if err != nil {
				return "", err
			}
			return req.Host, nil
		}
		if err != nil {
			return "", err
		}
		if n >= maxHead {
			return "", errors.New("request head too large")
		}
	}
}

func hostOnly(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return strings.ToLower(h)
	}
	return strings.ToLower(strings.Trim(hostport, "[]"))
}

// serveHTTP serves the requests on an intercepted connection: each gets
// its rules (read anew per request) and goes to the original destination.
// tlsName is the verified identity for https ("" for http).
func (p *Proxy) serveHTTP(c net.Conn, f *flow, scheme, tlsName string) {
	tr, shared := p.upstream(f, scheme, tlsName)
	if !shared {
		defer tr.CloseIdleConnections()
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = scheme
			pr.Out.URL.Host = pr.In.Host
			if pr.Out.URL.Host == "" {
				pr.Out.URL.Host = f.dst.String()
			}
			pr.Out.Host = pr.In.Host
		},
		Transport: tr,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			p.log.Info("egress: request failed", "sandbox", f.eg.ID, "dst", f.dst, "err", err)
			http.Error(w, "airlock egress: "+err.Error(), http.StatusBadGateway)
		},
		FlushInterval: -1,
	}
	l := newOneConnListener(c)
	var hijacked atomic.Bool
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := p.applyRules(r, f, tlsName); err != nil {
			p.log.Info("egress: request refused", "sandbox", f.eg.ID, "dst", f.dst, "err", err)
			http.Error(w, "airlock egress: "+err.Error(), http.StatusBadGateway)
			return
		}
		rp.ServeHTTP(w, r)
		if hijacked.Load() {
			// An upgraded connection (websocket) was copied to its end
			// inside ServeHTTP.
			l.done()
		}
	})
	srv := &http.Server{Handler: h, ReadHeaderTimeout: time.Minute, ErrorLog: slog.NewLogLogger(p.log.Handler(), slog.LevelDebug)}
	srv.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateClosed:
			l.done()
		case http.StateHijacked:
			hijacked.Store(true)
		}
	}
	_ = srv.Serve(l)
}

// Upstream connections of intercepted hosts are kept alive and shared by
// the sandbox's connections to the same destination and name (and egress
// proxy): a client that opens a new connection per request pays for the
// upstream TCP and TLS handshakes once, not per request. Never across
// sandboxes. A transport unused for upstreamIdle is forgotten when the next
// one is made; its idle connections have closed by then.
const (
	upstreamIdle  = 90 * time.Second
	maxUpstreams  = 4096
	maxIdlePerKey = 4
)

type upstreamKey struct {
	sandbox               string
	dst                   netip.AddrPort
	name, scheme, tlsName string
	proxy                 netpolicy.EgressProxy
	viaProxy              bool
}

type upstreamTransport struct {
	tr   *http.Transport
	used time.Time
}

// upstream returns the transport for the flow's requests; shared reports
// that it is kept for later connections (else the caller closes it).
func (p *Proxy) upstream(f *flow, scheme, tlsName string) (tr *http.Transport, shared bool) {
	k := upstreamKey{sandbox: f.eg.ID, dst: f.dst, name: f.name, scheme: scheme, tlsName: tlsName}
	if f.eg.Proxy != nil {
		k.proxy, k.viaProxy = *f.eg.Proxy, true
	}
	p.umu.Lock()
	defer p.umu.Unlock()
	now := time.Now()
	if u, ok := p.upstreams[k]; ok {
		u.used = now
		return u.tr, true
	}
	fl := *f // the dial needs dst, name and the egress proxy: all in the key
	tr = p.newTransport(&fl, tlsName)
	if p.upstreams == nil || p.ucl.Load() {
		return tr, false
	}
	for old, u := range p.upstreams {
		if now.Sub(u.used) > upstreamIdle {
			u.tr.CloseIdleConnections()
			delete(p.upstreams, old)
		}
	}
	if len(p.upstreams) >= maxUpstreams {
		return tr, false
	}
	p.upstreams[k] = &upstreamTransport{tr: tr, used: now}
	return tr, true
}

// closeUpstreams closes every kept upstream connection (Close).
func (p *Proxy) closeUpstreams() {
	p.umu.Lock()
	defer p.umu.Unlock()
	for k, u := range p.upstreams {
		u.tr.CloseIdleConnections()
		delete(p.upstreams, k)
	}
}

// newTransport dials the flow's destination, and for https verifies the
// real server's certificate for tlsName.
func (p *Proxy) newTransport(f *flow, tlsName string) *http.Transport {
	return &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return p.dial(ctx, f) },
		DialTLSContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			raw, err := p.dial(ctx, f)
			if err != nil {
				return nil, err
			}
			tc := tls.Client(raw, &tls.Config{ServerName: tlsName, RootCAs: p.cfg.Roots, NextProtos: []string{"http/1.1"}})
			if err := tc.HandshakeContext(ctx); err != nil {
				raw.Close()
				return nil, fmt.Errorf("TLS to %s (%s): %w", tlsName, f.dst, err)
			}
			return tc, nil
		},
		MaxIdleConnsPerHost:   maxIdlePerKey,
		IdleConnTimeout:       upstreamIdle,
		ResponseHeaderTimeout: 0,
		ForceAttemptHTTP2:     false,
	}
}

// applyRules sets the headers of every rule that applies to the request,
// with secrets filled in. It reads the sandbox's rules now, so a change
// made while the connection is open applies to its next request.
func (p *Proxy) applyRules(r *http.Request, f *flow, tlsName string) error {
	eg, ok := p.cfg.Directory.EgressFor(f.src.Addr())
	if !ok {
		return nil // interception ended with the rules: forward as is
	}
	var rules []netpolicy.Rule
	if tlsName != "" {
		rules = eg.RulesFor(tlsName, f.dst.Addr())
	} else if fl := (&flow{dst: f.dst, eg: eg, name: f.name}); p.httpRuleApplies(fl, r.Host) {
		rules = eg.RulesFor(hostOnly(r.Host), f.dst.Addr())
	}
	for _, rule := range rules {
		if rule.Transform == nil {
			continue
		}
		for k, v := range rule.Transform.Headers {
			filled, err := p.cfg.Fill(r.Context(), eg.Owner, v)
			if err != nil {
				return fmt.Errorf("rule header %s: %w", k, err)
			}
			r.Header.Set(k, filled)
		}
	}
	return nil
}

// oneConnListener hands out a single connection, then blocks until it is
// done, so that http.Server serves exactly that connection.
type oneConnListener struct {
	c      net.Conn
	once   sync.Once
	closed chan struct{}
	taken  bool
	mu     sync.Mutex
}

func newOneConnListener(c net.Conn) *oneConnListener {
	return &oneConnListener{c: c, closed: make(chan struct{})}
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	if !l.taken {
		l.taken = true
		l.mu.Unlock()
		return l.c, nil
	}
	l.mu.Unlock()
	<-l.closed
	return nil, net.ErrClosed
}

func (l *oneConnListener) done()          { l.once.Do(func() { close(l.closed) }) }
func (l *oneConnListener) Close() error   { l.done(); return nil }
func (l *oneConnListener) Addr() net.Addr { return l.c.LocalAddr() }
