// Package server holds Airlock's HTTP listeners: the control-plane API and the
// sandbox-traffic proxy that routes every SDK request for a sandbox to the
// envd inside it (spec/e2b-compat.md §1.4, §1.5).
package server

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/envd"
)

// Sandboxes is what the proxy needs from the sandbox manager.
type Sandboxes interface {
	// EnvdTransport returns the transport to a running sandbox's envd, or an
	// error when the sandbox is unknown, dead or paused.
	EnvdTransport(id string) (http.RoundTripper, error)
	// MatchToken returns the running sandboxes whose access token accept takes.
	MatchToken(accept func(token string) bool) []string
	// UserPortTarget returns the address a running sandbox's user ports are
	// reached at (invalid when it has no network) and the traffic access
	// token they require ("" for none).
	UserPortTarget(id string) (netip.Addr, string, error)
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
}

// NewProxy returns the sandbox-traffic handler.
func NewProxy(s Sandboxes, log *slog.Logger) *Proxy {
	if log == nil {
		log = slog.Default()
	}
	p := &Proxy{sandboxes: s, log: log}
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
		// Streams (process output, watch events) must reach the client as they
		// are produced.
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			rt := r.Context().Value(routeKey{}).(route)
			if errors.Is(err, context.Canceled) {
				return
			}
			log.Debug("sandbox proxy", "sandbox", rt.id, "port", rt.port, "err", err)
			if rt.addr.IsValid() {
				portClosed(w, rt.id, rt.port)
				return
			}
			if rt.interp {
				// envd serves the interpreter in every sandbox since
				// interp existed; an older envd (a sandbox recovered
				// across an upgrade) has no socket.
				writeJSON(w, http.StatusBadGateway, map[string]any{
					"sandboxId": rt.id, "code": http.StatusBadGateway, "port": rt.port,
					"message": "The sandbox has no code interpreter (its envd does not serve port 49999): " + err.Error(),
				})
				return
			}
			sandboxGone(w, rt.id)
		},
	}
	return p
}

type routeKey struct{}

type route struct {
	id        string
	port      int
	addr      netip.Addr // set for user ports
	interp    bool       // the code interpreter (port 49999)
	transport http.RoundTripper
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
	var rt route
	switch port {
	case envd.Port:
		tr, err := p.sandboxes.EnvdTransport(id)
		if err != nil {
			sandboxGone(w, id)
			return
		}
		rt = route{id: id, port: port, transport: tr}
	case envd.InterpPort:
		// A user port as far as the traffic token goes (E2B routes it like
		// any other), but served by envd over its own socket.
		_, token, err := p.sandboxes.UserPortTarget(id)
		if err != nil {
			sandboxGone(w, id)
			return
		}
		if token != "" && !tokenEqual(r.Header.Get(trafficTokenHeader), token) {
			portForbidden(w, id)
			return
		}
		tr, err := p.sandboxes.InterpTransport(id)
		if err != nil {
			sandboxGone(w, id)
			return
		}
		rt = route{id: id, port: port, transport: tr, interp: true}
	default:
		addr, token, err := p.sandboxes.UserPortTarget(id)
		if err != nil {
			sandboxGone(w, id)
			return
		}
		if token != "" && !tokenEqual(r.Header.Get(trafficTokenHeader), token) {
			portForbidden(w, id)
			return
		}
		if !addr.IsValid() {
			// No sandbox network on this server: nothing can listen on it.
			portClosed(w, id, port)
			return
		}
		rt = route{id: id, port: port, addr: addr, transport: p.ports}
	}
	// envd often answers (and flushes) before the proxy has forwarded the end of
	// the request body; without full duplex, net/http's HTTP/1.1 server then
	// closes the request body, the transport's write to envd fails, and it
	// closes the connection under the response still streaming back.
	_ = http.NewResponseController(w).EnableFullDuplex()
	ctx := context.WithValue(r.Context(), routeKey{}, rt)
	p.rp.ServeHTTP(w, r.WithContext(ctx))
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
// signature. Signed URLs carry no sandbox id; a signature is a keyed hash, so
// at most one live token matches.
func (p *Proxy) bySignature(r *http.Request) (string, int, error) {
	q := r.URL.Query()
	op := "read"
	if r.Method == http.MethodPost || r.Method == http.MethodPut {
		op = "write"
	}
	var exp int64
	if s := q.Get("signature_expiration"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return "", 0, errors.New("invalid signature_expiration")
		}
		exp = v
	}
	sig, path, user := q.Get("signature"), q.Get("path"), q.Get("username")
	ids := p.sandboxes.MatchToken(func(token string) bool {
		return envd.FileSignature(path, op, user, token, exp) == sig
	})
	if len(ids) != 1 {
		return "", 0, errBadSignature
	}
	return ids[0], envd.Port, nil
}

func hostOnly(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	return hostport
}

// portClosed is the answer for a user port nothing listens on, in the shape
// E2B's proxy gives (the SDKs show its message).
func portClosed(w http.ResponseWriter, id string, port int) {
	writeJSON(w, http.StatusBadGateway, map[string]any{
		"sandboxId": id, "message": "The sandbox is running but port is not open", "port": port, "code": http.StatusBadGateway,
	})
}

func portForbidden(w http.ResponseWriter, id string) {
	writeJSON(w, http.StatusForbidden, map[string]any{
		"sandboxId": id, "code": http.StatusForbidden,
		"message": "missing or invalid " + trafficTokenHeader + " header: this sandbox's ports are not public",
	})
}

func tokenEqual(got, want string) bool {
	return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

func sandboxGone(w http.ResponseWriter, id string) {
	writeJSON(w, http.StatusBadGateway, map[string]any{
		"sandboxId": id, "message": "The sandbox was not found", "code": http.StatusBadGateway,
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
