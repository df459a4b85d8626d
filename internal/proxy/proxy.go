// Package proxy is the sandbox-traffic proxy: it routes every SDK request for
// a sandbox (by its E2b-Sandbox-Id/Port headers, a <port>-<id>.<domain> Host,
// or a signed /files URL) to envd, the code interpreter or a user port inside
// it (docs/E2B-WIRE.md §1). The listeners it serves on are set up by internal/daemon.
package proxy

import (
	"context"
	"crypto/subtle"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/airlock-sandbox/airlock/internal/apikey"
	"github.com/airlock-sandbox/airlock/internal/e2bwire"
	"github.com/airlock-sandbox/airlock/internal/envdapi"
	"github.com/airlock-sandbox/airlock/internal/grant"
)

// Sandboxes is what the proxy needs from the sandbox manager.
type Sandboxes interface {
	// EnvdTransport returns the transport to a running sandbox's envd, or an
	// error when the sandbox is unknown, dead or paused.
	EnvdTransport(id string) (http.RoundTripper, error)
	// MatchToken returns the running sandboxes whose access token (with
	// their owner) accept takes.
	MatchToken(accept func(token, owner string) bool) []string
	// Access returns a running sandbox's access token ("" for none) and its
	// owner (the team), or an error when it is unknown, dead or paused.
	Access(id string) (token, owner string, err error)
	// UserPortTarget returns the address a running sandbox's user ports are
	// reached at (invalid when it has no network), the traffic access
	// token they require ("" for none) and the Host header their requests
	// carry (E2B's network.maskRequestHost, e2bwire.MaskPortPlaceholder standing
	// for the port; "" keeps the client's).
	UserPortTarget(id string) (addr netip.Addr, token, maskHost string, err error)
	// InterpTransport returns the transport to a running sandbox's code
	// interpreter (in-sandbox port 49999), which envd serves on a unix
	// socket so it is reachable whatever the sandbox's network mode.
	InterpTransport(id string) (http.RoundTripper, error)
}

// trafficTokenHeader carries the traffic access token of a sandbox created
// with network.allowPublicTraffic=false.
const trafficTokenHeader = "E2b-Traffic-Access-Token"

var validID = regexp.MustCompile(`^[a-z0-9]+$`)

var (
	errMissingRoute = errors.New("missing header: E2b-Sandbox-Id (or a Host of the form <port>-<sandboxID>.<domain>)")
	errBadSignature = errors.New("invalid signature")
)

// Proxy routes sandbox traffic. A request names its sandbox and port by the
// E2b-Sandbox-Id / E2b-Sandbox-Port headers (the E2B_SANDBOX_URL case), by a
// Host of the form <port>-<id>.<domain>, or, for header-less signed /files URLs
// handed out by downloadUrl/uploadUrl, by which sandbox's token made the
// signature.
type Proxy struct {
	sandboxes Sandboxes
	log       *slog.Logger
	rp        *httputil.ReverseProxy
	// ports reaches user ports over the sandbox network: one dialer for all
	// sandboxes, since the address is in each request's URL.
	ports *http.Transport
	// budgets meter each sandbox's traffic (Budget); nil: unmetered.
	budgets *budgets
	// stats hears the traffic (SetStats); nil: nobody. countTo and
	// countFrom tell it the bytes of each direction (nil without stats).
	stats              Stats
	countTo, countFrom func(int)
	// grants checks the per-key grants clients present (SetGrants); nil:
	// tokens go to envd as they came.
	grants *grant.Checker
}

// Stats hears what the proxy carries, for the server's metrics: each
// request routed to a sandbox, by what it reaches (KindEnvd, KindInterpreter,
// KindPort), and the bytes of each direction as they pass.
type Stats interface {
	Request(kind string)
	Bytes(toSandbox bool, n int)
}

// What a request reaches, for Stats.
const (
	KindEnvd        = "envd"
	KindInterpreter = "interpreter"
	KindPort        = "port"
)

// SetStats makes the proxy report its traffic to s; call it before serving.
func (p *Proxy) SetStats(s Stats) {
	p.stats = s
	p.countTo = func(n int) { s.Bytes(true, n) }
	p.countFrom = func(n int) { s.Bytes(false, n) }
}

// New returns the sandbox-traffic handler.
func New(s Sandboxes, log *slog.Logger) *Proxy {
	if log == nil {
		log = slog.Default()
	}
	p := &Proxy{sandboxes: s, log: log, budgets: newBudgets(DefaultBudget)}
	p.ports = &http.Transport{
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConnsPerHost:   16,
		IdleConnTimeout:       30 * time.Second,
		DisableCompression:    true,
		ForceAttemptHTTP2:     false,
		ResponseHeaderTimeout: 0,
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			rt := r.In.Context().Value(routeKey{}).(route)
			if rt.addr.IsValid() {
				// A user port: the server in the sandbox sees the Host the
				// client used (<port>-<id>.<domain>), as on E2B.
				r.Out.URL.Scheme = "http"
				r.Out.URL.Host = netip.AddrPortFrom(rt.addr, uint16(rt.port)).String()
				r.Out.Host = r.In.Host
				if rt.host != "" {
					// Unless the sandbox asked for another
					// (network.maskRequestHost).
					r.Out.Host = rt.host
				}
				r.Out.Header.Del(trafficTokenHeader)
				r.SetXForwarded()
				return
			}
			r.Out.URL.Scheme = "http"
			r.Out.URL.Host = "envd"
			r.Out.Host = "envd"
			if rt.interp {
				// The traffic token is the proxy's business, as for user ports.
				r.Out.Header.Del(trafficTokenHeader)
			}
			// envd has no use for where the client thought it was connecting.
			r.Out.Header.Del("Forwarded")
		},
		Transport: routedTransport{},
		// "read error during body copy" (a sandbox that died mid-response)
		// is what a kill looks like from here, not a server fault.
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		ModifyResponse: func(res *http.Response) error {
			// The response headers go out next: the last moment to tell an
			// HTTP/1.1 client its connection ends with this response.
			if res.StatusCode != http.StatusSwitchingProtocols {
				closeIfBodyUnread(res.Request.Context(), res.Header)
			}
			rt := res.Request.Context().Value(routeKey{}).(route)
			// Innermost, so what the client is sent is what was paid for.
			res.Body = meter(res.Request.Context(), res.Body, rt.bucket, p.countFrom, p.countTo)
			if res.StatusCode == http.StatusOK && res.ContentLength < 0 &&
				strings.HasPrefix(res.Header.Get("Content-Type"), "application/connect+") {
				res.Body = &connectTail{body: res.Body, id: rt.id}
			}
			// An upgraded connection's body must stay the transport's
			// io.ReadWriteCloser: ReverseProxy refuses to relay anything else.
			if rt.addr.IsValid() && res.StatusCode != http.StatusSwitchingProtocols {
				res.Body = p.endWithSandbox(rt.id, res.Body)
			}
			return nil
		},
		// Streams (process output, watch events) must reach the client as they
		// are produced.
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			rt := r.Context().Value(routeKey{}).(route)
			closeIfBodyUnread(r.Context(), w.Header())
			if errors.Is(err, context.Canceled) {
				return
			}
			log.Debug("sandbox proxy", "sandbox", rt.id, "port", rt.port, "err", err)
			if rt.addr.IsValid() {
				portClosed(w, r, rt.id, rt.port)
				return
			}
			if rt.interp {
				// envd serves the interpreter in every sandbox since
				// interp existed; an older envd (a sandbox recovered
				// across an upgrade) has no socket.
				WriteError(w, r, http.StatusBadGateway, map[string]any{
					"sandboxId": rt.id, "code": http.StatusBadGateway, "port": rt.port,
					"message": "The sandbox has no code interpreter (its envd does not serve port 49999): " + err.Error(),
				})
				return
			}
			sandboxGone(w, r, rt.id)
		},
	}
	return p
}

// SetBudget replaces the per-sandbox traffic budget (DefaultBudget; a zero
// Rate turns it off). Call it before the proxy serves.
func (p *Proxy) SetBudget(b Budget) { p.budgets = newBudgets(b) }

type routeKey struct{}

type route struct {
	id        string
	port      int
	addr      netip.Addr // set for user ports
	host      string     // the Host a user port's request carries, when masked
	interp    bool       // the code interpreter (port 49999)
	transport http.RoundTripper
	body      *proxyBody // nil when the request has no body
	bucket    *bucket    // the sandbox's traffic budget; nil: unmetered
}

// routedTransport sends a request over the transport the router chose for it.
type routedTransport struct{}

func (routedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	return r.Context().Value(routeKey{}).(route).transport.RoundTrip(r)
}

func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, port, err := p.target(r)
	if errors.Is(err, errBadSignature) {
		// Same answer envd gives a wrong signature, so a tampered signed URL
		// fails the same way whether or not it could be routed.
		writeJSON(w, http.StatusUnauthorized, map[string]any{"code": http.StatusUnauthorized, "message": "invalid signature"})
		return
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if (port == envdapi.Port || port == envdapi.InterpPort) && !p.admit(w, r, id) {
		return
	}
	var rt route
	switch port {
	case envdapi.Port:
		tr, err := p.sandboxes.EnvdTransport(id)
		if err != nil {
			sandboxGone(w, r, id)
			return
		}
		rt = route{id: id, port: port, transport: tr}
	case envdapi.InterpPort:
		// A user port as far as the traffic token goes (E2B routes it like
		// any other), but served by envd over its own socket.
		_, token, _, err := p.sandboxes.UserPortTarget(id)
		if err != nil {
			sandboxGone(w, r, id)
			return
		}
		if token != "" && !tokenEqual(r.Header.Get(trafficTokenHeader), token) {
			portForbidden(w, r, id)
			return
		}
		tr, err := p.sandboxes.InterpTransport(id)
		if err != nil {
			sandboxGone(w, r, id)
			return
		}
		rt = route{id: id, port: port, transport: tr, interp: true}
	default:
		addr, token, mask, err := p.sandboxes.UserPortTarget(id)
		if err != nil {
			sandboxGone(w, r, id)
			return
		}
		if token != "" && !tokenEqual(r.Header.Get(trafficTokenHeader), token) {
			portForbidden(w, r, id)
			return
		}
		if !addr.IsValid() {
			// No sandbox network on this server: nothing can listen on it.
			portClosed(w, r, id, port)
			return
		}
		rt = route{id: id, port: port, addr: addr, transport: p.ports}
		if mask != "" {
			rt.host = strings.ReplaceAll(mask, e2bwire.MaskPortPlaceholder, strconv.Itoa(port))
		}
	}
	// envd often answers (and flushes) before the proxy has forwarded the end of
	// the request body; without full duplex, net/http's HTTP/1.1 server then
	// closes the request body, the transport's write to envd fails, and it
	// closes the connection under the response still streaming back.
	if p.stats != nil {
		kind := KindPort
		switch {
		case port == envdapi.Port:
			kind = KindEnvd
		case rt.interp:
			kind = KindInterpreter
		}
		p.stats.Request(kind)
	}
	rc := http.NewResponseController(w)
	_ = rc.EnableFullDuplex()
	ctx := r.Context()
	// Held for the whole exchange: ReverseProxy copies the response (and an
	// upgraded connection) before it returns.
	rt.bucket = p.budgets.acquire(id)
	defer p.budgets.release(rt.bucket)
	if r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0 {
		// The transport may wait on the budget inside a Read that finish
		// then waits out; cancelling the wait first keeps finish prompt.
		bodyCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		rt.body = &proxyBody{rc: r.Body, http1: r.ProtoMajor == 1, stopWait: cancel}
		if rt.bucket != nil || p.countTo != nil {
			rt.body.rc = &meteredBody{meteredReader: meteredReader{r: r.Body, bk: rt.bucket, ctx: bodyCtx, count: p.countTo}, rc: r.Body}
		}
		// Deferred, so it also runs when ReverseProxy aborts a response whose
		// upstream died mid-copy (panic(http.ErrAbortHandler)).
		defer rt.body.finish(rc)
		stop := make(chan struct{})
		defer close(stop) // runs before finish
		go rt.body.watch(rc, stop)
		ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
			GotConn: func(ci httptrace.GotConnInfo) { rt.body.upstream.Store(&ci.Conn) },
		})
	}
	// A copy of the request, since the server looks at the original's Body
	// after the handler: whether it gave up draining a large body decides
	// how it closes the connection.
	out := r.WithContext(context.WithValue(ctx, routeKey{}, rt))
	if rt.body != nil {
		out.Body = rt.body
	}
	p.rp.ServeHTTP(w, out)
}

// proxyBody is the inbound request body as the transport to the sandbox sees
// it. The transport reads it from its own goroutine, which can outlive the
// handler: RoundTrip returns as soon as a response (or an error: the sandbox
// died, its socket refuses) is in, whether or not the body was sent. Two things
// then go wrong with net/http's HTTP/1.1 server in full-duplex mode:
//
//   - the server, after the handler returns, drains the unread body, and
//     reaching its end starts the connection's background read; the keep-alive
//     loop then reads the next request beside it and panics with "invalid
//     concurrent Body.Read call" (golang.org/issue/68560). A request to a
//     sandbox that was killed, or whose envd died, took this path every time.
//   - a Read still in flight in the transport's goroutine races with the
//     server's own drain and its reuse of the connection.
//
// So the handler keeps the body to itself: finish stops the transport's reads
// (interrupting one in flight) before the handler returns, and an HTTP/1.1
// response sent before the body was read to its end says Connection: close
// (closeIfBodyUnread), so the server never reads another request from a
// connection whose request it did not fully consume.
//
// The other way round, a transport whose upstream connection died while it
// waited for the client's next bytes does not return from RoundTrip until
// that Read does (it waits for its writer), so a client that paused mid-upload
// would never hear that its sandbox is gone: watch cuts such a Read.
type proxyBody struct {
	rc       io.ReadCloser
	stopWait context.CancelFunc // ends a wait on the sandbox's budget in rc
	http1    bool
	mu       sync.Mutex // held across each Read, so finish can wait one out
	done     bool       // under mu: Reads fail from now on
	eof      atomic.Bool
	inRead   atomic.Bool
	upstream atomic.Pointer[net.Conn] // the connection the transport writes the body to
	gone     atomic.Bool              // watch found it closed and cut the Read
}

var (
	// errProxyDone is what the transport reads once the handler is finishing.
	errProxyDone = errors.New("sandbox proxy: request finished")
	// errUpstreamClosed is what it reads once its connection to the sandbox
	// closed under a Read that waited on the client.
	errUpstreamClosed = errors.New("sandbox proxy: the connection to the sandbox closed")
)

// drainGrace bounds how long the server may wait, after the response, for the
// rest of a request body it drains so that closing the connection does not
// reset it under a response the client has not read yet.
const drainGrace = 2 * time.Second

// watchEvery is how often watch looks at the upstream connection while a Read
// waits on the client.
const watchEvery = 200 * time.Millisecond

func (b *proxyBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done {
		return 0, errProxyDone
	}
	b.inRead.Store(true)
	n, err := b.rc.Read(p)
	b.inRead.Store(false)
	if err != nil && b.gone.Load() {
		return n, errUpstreamClosed
	}
	if err == io.EOF {
		b.eof.Store(true)
	}
	return n, err
}

// Close does nothing: the transport closes the body when it is done with it,
// possibly after the handler returned, and the server owns the body's end.
func (b *proxyBody) Close() error { return nil }

// unread reports whether the body may still hold bytes the client sends, or
// watch cut a Read of it (the cut may race with the Read reaching the end).
func (b *proxyBody) unread() bool { return b != nil && (!b.eof.Load() || b.gone.Load()) }

// watch cuts a Read blocked on the client once the transport's connection to
// the sandbox is closed (the transport closes it when the sandbox's side
// failed), until stop. Setting a zero write deadline is a no-op on a live
// connection the transport never gives a write deadline, and fails on a
// closed one: a way to ask without reading.
func (b *proxyBody) watch(rc *http.ResponseController, stop <-chan struct{}) {
	t := time.NewTicker(watchEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		c := b.upstream.Load()
		if c == nil || !b.inRead.Load() || b.eof.Load() || (*c).SetWriteDeadline(time.Time{}) == nil {
			continue
		}
		b.gone.Store(true)
		// HTTP/1.1: the connection is not reused (the body is unread, so the
		// answer says Connection: close). HTTP/2: only the stream's body is
		// failed; the answer still goes out.
		_ = rc.SetReadDeadline(time.Now())
		return
	}
}

// finish returns once no transport Read of the body is in flight and none can
// start. A Read blocked on a client that sends nothing more is cut with a read
// deadline in the past: over HTTP/1.1 the connection is not reused then
// (closeIfBodyUnread) and the server gets drainGrace to drain the rest; over
// HTTP/2 it fails only the stream's body, not the response.
func (b *proxyBody) finish(rc *http.ResponseController) {
	b.stopWait()
	if !b.mu.TryLock() {
		if !b.eof.Load() {
			_ = rc.SetReadDeadline(time.Now())
		}
		// Past the end a Read returns at once. The deadline is left alone
		// then: over HTTP/1.1 the connection's background read is running,
		// and a timeout there would cancel the next request's context.
		b.mu.Lock()
	}
	b.done = true
	b.mu.Unlock()
	if b.http1 && !b.eof.Load() {
		_ = rc.SetReadDeadline(time.Now().Add(drainGrace))
	}
}

// closeIfBodyUnread marks an HTTP/1.1 response Connection: close when the
// request body has not been read to its end: the transport may stop reading it
// (the sandbox died, or answered early), and a connection is only safe to reuse
// once its request was consumed (see proxyBody).
func closeIfBodyUnread(ctx context.Context, h http.Header) {
	rt, _ := ctx.Value(routeKey{}).(route)
	if rt.body != nil && rt.body.http1 && rt.body.unread() {
		h.Set("Connection", "close")
	}
}

// target finds the sandbox id and port a request is for.
func (p *Proxy) target(r *http.Request) (string, int, error) {
	idHdr, portHdr := r.Header.Get("E2b-Sandbox-Id"), r.Header.Get("E2b-Sandbox-Port")
	host := hostOnly(r.Host)
	if idHdr != "" || portHdr != "" {
		if idHdr == "" {
			return "", 0, errors.New("missing header: E2b-Sandbox-Id")
		}
		if portHdr == "" {
			return "", 0, errors.New("missing header: E2b-Sandbox-Port")
		}
		return parseTarget(idHdr, portHdr)
	}
	if label, _, ok := strings.Cut(host, "."); ok && net.ParseIP(host) == nil {
		if portStr, id, ok := strings.Cut(label, "-"); ok {
			return parseTarget(id, portStr)
		}
	}
	if r.URL.Path == "/files" && r.URL.Query().Get("signature") != "" {
		return p.bySignature(r)
	}
	return "", 0, errMissingRoute
}

func parseTarget(id, portStr string) (string, int, error) {
	if !validID.MatchString(id) {
		return "", 0, errors.New("invalid sandbox ID")
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port <= 0 || port > 65535 {
		return "", 0, errors.New("invalid sandbox port")
	}
	return id, port, nil
}

// bySignature finds the one sandbox whose access token produced the URL's
// signature (with SetGrants: one of whose team's keys' grants did).
// Signed URLs carry no sandbox id; a signature is a keyed hash, so at most
// one live token matches. The signature is checked over the query's own
// bytes (signatureOf), as envd checks it.
func (p *Proxy) bySignature(r *http.Request) (string, int, error) {
	s, _ := signatureOf(r)
	if s.exp != "" {
		if _, err := strconv.ParseInt(s.exp, 10, 64); err != nil {
			return "", 0, errors.New("invalid signature_expiration")
		}
	}
	match := func(token, _ string) bool { return s.madeWith(token) }
	if p.grants != nil {
		signers := p.grants.Signers()
		match = func(secret, owner string) bool {
			_, err := signers.Signed(owner, secret, apikey.SandboxesWrite, s.madeWith)
			var se *grant.ScopeError
			return err == nil || errors.As(err, &se) // admit answers the scope
		}
	}
	ids := p.sandboxes.MatchToken(match)
	if len(ids) != 1 {
		return "", 0, errBadSignature
	}
	return ids[0], envdapi.Port, nil
}

func hostOnly(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	return hostport
}

// portClosed is the answer for a user port nothing listens on, in the shape
// E2B's proxy gives (the SDKs show its message).
func portClosed(w http.ResponseWriter, r *http.Request, id string, port int) {
	WriteError(w, r, http.StatusBadGateway, map[string]any{
		"sandboxId": id, "message": "The sandbox is running but port is not open", "port": port, "code": http.StatusBadGateway,
	})
}

func portForbidden(w http.ResponseWriter, r *http.Request, id string) {
	WriteError(w, r, http.StatusForbidden, map[string]any{
		"sandboxId": id, "code": http.StatusForbidden,
		"message": "missing or invalid " + trafficTokenHeader + " header: this sandbox's ports are not public",
	})
}

func tokenEqual(got, want string) bool {
	return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

func sandboxGone(w http.ResponseWriter, r *http.Request, id string) {
	WriteError(w, r, http.StatusBadGateway, map[string]any{
		"sandboxId": id, "message": "The sandbox was not found", "code": http.StatusBadGateway,
	})
}

// WriteError answers an error: E2B's JSON body ({"code", "message", …})
// for API clients, and for a browser (Accept: text/html, as one opening
// https://<port>-<id>.<domain> sends) a short page with the same message.
func WriteError(w http.ResponseWriter, r *http.Request, status int, body map[string]any) {
	if r != nil && strings.Contains(r.Header.Get("Accept"), "text/html") {
		msg, _ := body["message"].(string)
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(status)
		fmt.Fprintf(w, "<!doctype html>\n<title>%d %s</title>\n<h1>%d %s</h1>\n<p>%s</p>\n",
			status, http.StatusText(status), status, http.StatusText(status), html.EscapeString(msg))
		return
	}
	writeJSON(w, status, body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// connectTail ends a Connect streaming response (commands.run, watchDir, …)
// whose upstream died — the sandbox was killed, or its envd — with the error
// message the protocol has for it, so the client sees "unavailable: the
// sandbox stopped answering" rather than a truncated response. That is only
// possible between two messages; a response cut inside one still aborts.
type connectTail struct {
	body  io.ReadCloser
	id    string
	hdr   [5]byte // the current envelope's header, hdrN bytes of it seen
	hdrN  int
	left  uint32 // payload bytes of the current envelope still to come
	ended bool   // the upstream's own end-of-stream message went through
	tail  []byte // the end-of-stream message being sent in its place
	eof   bool   // tail is all that is left
}

// connectEndStream is the Connect envelope flag of the end-of-stream message.
const connectEndStream = 0x02

func (c *connectTail) Read(p []byte) (int, error) {
	if c.eof {
		n := copy(p, c.tail)
		c.tail = c.tail[n:]
		if len(c.tail) == 0 {
			return n, io.EOF
		}
		return n, nil
	}
	n, err := c.body.Read(p)
	c.track(p[:n])
	if err != nil && err != io.EOF && !c.ended && c.hdrN == 0 && c.left == 0 {
		msg, _ := json.Marshal(map[string]any{"error": map[string]string{
			"code":    "unavailable",
			"message": "The sandbox " + c.id + " stopped answering: it was killed or reached its end of life",
		}})
		c.tail = binary.BigEndian.AppendUint32([]byte{connectEndStream}, uint32(len(msg)))
		c.tail = append(c.tail, msg...)
		c.eof = true
		if n > 0 {
			return n, nil
		}
		return c.Read(p)
	}
	return n, err
}

// track follows the envelope framing (1 flag byte, 4 length bytes, payload)
// of the bytes passed to the client.
func (c *connectTail) track(b []byte) {
	for len(b) > 0 {
		if c.left > 0 {
			k := min(uint32(len(b)), c.left)
			c.left -= k
			b = b[k:]
			continue
		}
		c.hdr[c.hdrN] = b[0]
		c.hdrN++
		b = b[1:]
		if c.hdrN == len(c.hdr) {
			c.hdrN = 0
			c.left = binary.BigEndian.Uint32(c.hdr[1:])
			if c.hdr[0]&connectEndStream != 0 {
				c.ended = true
			}
		}
	}
}

func (c *connectTail) Close() error { return c.body.Close() }

// sandboxGoneEvery is how often a user-port response checks that its sandbox
// still runs.
const sandboxGoneEvery = 250 * time.Millisecond

// endWithSandbox cuts a user-port response body once its sandbox is gone. A
// user port is a TCP connection into the sandbox's netns: when teardown
// removes the veth before the server's FIN has left, nothing ever ends the
// connection and the client would wait for TCP to give up. envd's unix
// sockets close with the sandbox and need no watch.
func (p *Proxy) endWithSandbox(id string, body io.ReadCloser) io.ReadCloser {
	b := &sandboxBody{ReadCloser: body, stop: make(chan struct{})}
	go func() {
		t := time.NewTicker(sandboxGoneEvery)
		defer t.Stop()
		for {
			select {
			case <-b.stop:
				return
			case <-t.C:
				if _, _, _, err := p.sandboxes.UserPortTarget(id); err != nil {
					// The transport's bodies may be closed while a Read
					// waits: the Read then fails and the copy ends.
					_ = body.Close()
					return
				}
			}
		}
	}()
	return b
}

type sandboxBody struct {
	io.ReadCloser
	stop chan struct{}
	once sync.Once
}

func (b *sandboxBody) Close() error {
	b.once.Do(func() { close(b.stop) })
	return b.ReadCloser.Close()
}
