package mcp

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/e2bclient"
	"github.com/airlock-sandbox/airlock/internal/e2bwire"
	"github.com/modelcontextprotocol/go-sdk/auth"
	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// NewStreamableHandler serves MCP over streamable HTTP (mounted at /mcp on the
// API listener). The bearer token must be one authenticate accepts: no key,
// no session. Each session gets an MCP server whose tools call the server's
// own E2B API (apiURL) and sandbox proxy (sandboxURL) with the caller's key,
// so MCP clients get exactly the rights, limits and rate limits of that key.
func NewStreamableHandler(apiURL, sandboxURL string, authenticate func(string) bool) http.Handler {
	verify := func(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
		if token == "" || !authenticate(token) {
			return nil, auth.ErrInvalidToken
		}
		// The digest binds a session to the key that opened it, without
		// keeping the key itself in the session table.
		sum := sha256.Sum256([]byte(token))
		return &auth.TokenInfo{UserID: hex.EncodeToString(sum[:8]), Extra: map[string]any{"key": token}}, nil
	}
	streamable := mcpsdk.NewStreamableHTTPHandler(func(r *http.Request) *mcpsdk.Server {
		info := auth.TokenInfoFromContext(r.Context())
		key, _ := info.Extra["key"].(string)
		return NewServer(NewHTTPBackend(e2bclient.Config{APIURL: apiURL, SandboxURL: sandboxURL, APIKey: key}), Options{})
	}, &mcpsdk.StreamableHTTPOptions{SessionTimeout: 30 * time.Minute})
	return auth.RequireBearerToken(verify, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})(streamable)
}

// InfoHandler answers e2bwire.InfoPath: where the sandbox proxy is, so `airlock mcp`
// (and any client) need not guess it. A proxy listening on every address is
// reported under the host name the client used for the API.
func InfoHandler(sandboxAddr net.Addr) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u := "http://" + sandboxAddr.String()
		if tcp, ok := sandboxAddr.(*net.TCPAddr); ok && (tcp.IP == nil || tcp.IP.IsUnspecified()) {
			host := r.Host
			if h, _, err := net.SplitHostPort(r.Host); err == nil {
				host = h
			}
			if host == "" {
				host = "127.0.0.1"
			}
			u = "http://" + net.JoinHostPort(strings.Trim(host, "[]"), strconv.Itoa(tcp.Port))
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(e2bwire.ServerInfo{SandboxURL: u})
	})
}
