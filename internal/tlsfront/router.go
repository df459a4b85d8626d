package tlsfront

import (
	"crypto/tls"
	"fmt"
	"log"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/proxy"
)

// Router routes a request by its Host (any port): api.D to API, sandbox.D
// and <port>-<id>.D to Sandbox (which reads the sandbox and port from the
// Host or the E2b-Sandbox-Id/Port headers). Other names under D get a 404,
// a Host that is not a host name a 400.
type Router struct {
	Domain       string
	API, Sandbox http.Handler
}

func (rt *Router) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	host, ok := splitHost(r.Host)
	if !ok {
		notServed(w, r, http.StatusBadRequest, fmt.Sprintf("malformed Host %q: expected api.%s, sandbox.%s or <port>-<sandboxID>.%s", r.Host, rt.Domain, rt.Domain, rt.Domain))
		return
	}
	sub, under := strings.CutSuffix(host, "."+rt.Domain)
	switch {
	case under && sub == "api":
		rt.API.ServeHTTP(w, r)
	case under && sub == "sandbox":
		rt.Sandbox.ServeHTTP(w, r)
	case under && isSandboxLabel(sub):
		rt.Sandbox.ServeHTTP(w, r)
	case under && label.MatchString(sub):
		notServed(w, r, http.StatusNotFound, fmt.Sprintf("nothing is served at %s: the API is api.%s, sandboxes are <port>-<sandboxID>.%s", host, rt.Domain, rt.Domain))
	case host == rt.Domain:
		notServed(w, r, http.StatusNotFound, fmt.Sprintf("nothing is served at %s itself: the API is api.%s, sandboxes are <port>-<sandboxID>.%s", host, rt.Domain, rt.Domain))
	default:
		notServed(w, r, http.StatusNotFound, fmt.Sprintf("unknown host %s: this server serves %s and its subdomains", host, rt.Domain))
	}
}

// isSandboxLabel reports whether l has the form <port>-<id> (digits, a dash,
// then the id: the proxy checks both further).
func isSandboxLabel(l string) bool {
	port, id, ok := strings.Cut(l, "-")
	if !ok || port == "" || id == "" {
		return false
	}
	for _, c := range port {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// splitHost returns Host's name, lower case, without port or trailing dot;
// false when it is not a host name (or a bracketed address).
func splitHost(hostport string) (string, bool) {
	host := hostport
	if strings.Contains(hostport, ":") {
		h, port, err := net.SplitHostPort(hostport)
		if err != nil || port == "" {
			return "", false
		}
		for _, c := range port {
			if c < '0' || c > '9' {
				return "", false
			}
		}
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if host == "" || len(host) > 253 {
		return "", false
	}
	if net.ParseIP(host) != nil {
		return host, true
	}
	for _, l := range strings.Split(host, ".") {
		// Underscores appear in real host names (and in nothing Airlock
		// serves): let them reach the 404.
		if !label.MatchString(strings.ReplaceAll(l, "_", "-")) {
			return "", false
		}
	}
	return host, true
}

// ClientDomain is the domain as the client of r named it: its Host's name
// after "api." with the port it used (E2B_DOMAIN=D:8443 must get sandbox URLs
// on :8443 too), when r came through the front door for domain; ok is false
// otherwise.
func ClientDomain(r *http.Request, domain string) (string, bool) {
	if r.TLS == nil {
		return "", false
	}
	host, port, err := net.SplitHostPort(r.Host)
	if err != nil {
		host, port = r.Host, ""
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if host != "api."+domain {
		return "", false
	}
	if port == "" || port == "443" {
		return domain, true
	}
	return domain + ":" + port, true
}

// notServed answers a request the front door has no handler for: E2B's
// error body for API clients, a short page for browsers (as the proxy's
// own errors).
func notServed(w http.ResponseWriter, r *http.Request, status int, msg string) {
	proxy.WriteError(w, r, status, map[string]any{"code": status, "message": msg})
}

// NewServer returns the front door's server: HTTP/2 and HTTP/1.1 (ALPN) over
// TLS 1.2+, certificates from src for names within domain only, requests
// routed by router. Serve it with ServeTLS(ln, "", "").
func NewServer(domain string, src CertSource, router http.Handler, errorLog *log.Logger) *http.Server {
	return &http.Server{
		Handler: router,
		TLSConfig: &tls.Config{
			MinVersion:     tls.VersionTLS12,
			NextProtos:     []string{"h2", "http/1.1"},
			GetCertificate: restrict(domain, src),
		},
		ReadHeaderTimeout: 30 * time.Second,
		ErrorLog:          errorLog,
	}
}
