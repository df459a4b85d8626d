package mcpgateway

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"net/http"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Handler serves the gateway over HTTP: MCP's streamable transport at /mcp
// behind the bearer token, and GET /health without it.
//
// The transport is stateless, which is how the SDK serves both protocol
// eras from one handler: 2026-07-28 clients (server/discover, no session),
// which the SDK accepts only in stateless mode, and 2025-11-25, 2025-06-18
// and 2025-03-26 clients, whose initialize it still negotiates. Requests
// arrive through Airlock's sandbox proxy with the sandbox's public Host
// header, which the SDK's DNS-rebinding protection would refuse on a
// loopback connection; the bearer token is what protects the gateway.
func (g *Gateway) Handler(token string) http.Handler {
	mcpHandler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return g.server }, &mcp.StreamableHTTPOptions{
		Stateless:                    true,
		DisableLocalhostProtection:   true,
		PropagateRequestCancellation: true,
		Logger:                       g.log,
	})
	mux := http.NewServeMux()
	mux.Handle("/mcp", requireBearer(token, mcpHandler))
	mux.HandleFunc("GET /health", g.serveHealth)
	return mux
}

// requireBearer admits requests whose Authorization is `Bearer <token>`.
// Written here rather than with the SDK's auth.RequireBearerToken: that one
// is made for OAuth access tokens (expiry, scopes, resource metadata) and
// links the OAuth packages into envd; this gateway has one static secret.
// The comparison is of SHA-256 digests in constant time, so neither the
// token's bytes nor its length leak through timing.
func requireBearer(token string, next http.Handler) http.Handler {
	want := sha256.Sum256([]byte(token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, got, ok := strings.Cut(r.Header.Get("Authorization"), " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(got) == "" {
			writeUnauthorized(w, "missing bearer token: send Authorization: Bearer <token> (the SDK's Sandbox.getMcpToken(), also in /etc/mcp-gateway/.token)")
			return
		}
		sum := sha256.Sum256([]byte(strings.TrimSpace(got)))
		if subtle.ConstantTimeCompare(sum[:], want[:]) != 1 {
			writeUnauthorized(w, "invalid bearer token")
			return
		}
		next.ServeHTTP(w, r)
	})
}

func writeUnauthorized(w http.ResponseWriter, msg string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="mcp-gateway"`)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusUnauthorized)
	_ = json.NewEncoder(w).Encode(map[string]any{"code": http.StatusUnauthorized, "message": msg})
}

// Health is what GET /health answers: the gateway is up; each server's state.
type Health struct {
	Status  string         `json:"status"` // "ok", or "degraded" while a server is not ready
	Servers []ServerHealth `json:"servers"`
}

// ServerHealth is one server's state.
type ServerHealth struct {
	Name      string `json:"name"`
	Prefix    string `json:"prefix"`
	State     string `json:"state"` // starting, ready, restarting, stopped
	Tools     int    `json:"tools"`
	Prompts   int    `json:"prompts"`
	Resources int    `json:"resources"`
	Restarts  int    `json:"restarts"`
	LastError string `json:"lastError,omitempty"`
}

// Health reports the servers' states.
func (g *Gateway) Health() Health {
	h := Health{Status: "ok", Servers: []ServerHealth{}}
	for _, u := range g.ups {
		u.mu.Lock()
		f := u.features
		s := ServerHealth{
			Name: u.spec.Key, Prefix: u.spec.Prefix, State: u.state,
			Tools: len(f.tools), Prompts: len(f.prompts), Resources: len(f.resources) + len(f.templates),
			Restarts: u.restarts, LastError: u.down,
		}
		u.mu.Unlock()
		if s.State != stateReady {
			h.Status = "degraded"
		}
		h.Servers = append(h.Servers, s)
	}
	return h
}

func (g *Gateway) serveHealth(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(g.Health())
}
