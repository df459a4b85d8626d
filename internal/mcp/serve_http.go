package mcp

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/apikey"
	"github.com/airlock-sandbox/airlock/internal/e2bclient"
	"github.com/airlock-sandbox/airlock/internal/e2bwire"
	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// NewStreamableHandler serves MCP over streamable HTTP (mounted at /mcp on the
// API listener). The bearer token must be one authenticate accepts: no key,
// no session. Each key gets an MCP server whose tools call the server's own
// E2B API (apiURL) and sandbox proxy (sandboxURL) with that key, so MCP
// clients get exactly the rights, limits and rate limits of that key.
//
// Both eras of the protocol are served on the one endpoint, chosen per
// request (eraRouter): 2026-07-28 requests (stateless, no session) by a
// stateless handler, which is the only kind the go-sdk accepts them on, and
// initialize and everything of a session (Mcp-Session-Id) by a stateful one,
// so clients of 2025-11-25 and before keep their sessions.
func NewStreamableHandler(apiURL, sandboxURL string, identify func(string) (apikey.Principal, error)) http.Handler {
	return newStreamableHandler(func(key string) Backend {
		return NewHTTPBackend(e2bclient.Config{APIURL: apiURL, SandboxURL: sandboxURL, APIKey: key})
	}, identify)
}

// newStreamableHandler is NewStreamableHandler with the backend of a key
// made by backendFor (tests give a fake).
func newStreamableHandler(backendFor func(key string) Backend, identify func(string) (apikey.Principal, error)) http.Handler {
	verify := func(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
		if token == "" {
			return nil, auth.ErrInvalidToken
		}
		p, err := identify(token)
		if err != nil {
			return nil, auth.ErrInvalidToken
		}
		// The digest binds a session to the key that opened it, without
		// keeping the key itself in the session table.
		sum := sha256.Sum256([]byte(token))
		return &auth.TokenInfo{UserID: hex.EncodeToString(sum[:8]), Extra: map[string]any{"key": token, "scopes": p.Scopes}}, nil
	}
	servers := &serverCache{backendFor: backendFor, byUser: map[string]*mcpsdk.Server{}}
	router := &eraRouter{
		stateful: mcpsdk.NewStreamableHTTPHandler(servers.get, &mcpsdk.StreamableHTTPOptions{SessionTimeout: 30 * time.Minute}),
		// A 2026-07-28 request is the whole exchange: when its client goes
		// away, so may the work it asked for.
		stateless: mcpsdk.NewStreamableHTTPHandler(servers.get, &mcpsdk.StreamableHTTPOptions{Stateless: true, PropagateRequestCancellation: true}),
		supported: mcpsdk.SupportedProtocolVersions(),
	}
	return auth.RequireBearerToken(verify, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})(router)
}

// serverCache keeps one MCP server per API key (by its digest). A stateless
// request gets a server of its own each time it comes, and the SDK asks
// for the server more than once per request, so building one (every tool's
// schemas) per request would cost more than the request; one per key also
// shares the envd tokens its backend has learnt between the key's sessions.
// The keys are serve's own, so the cache stays as small as their list.
type serverCache struct {
	backendFor func(key string) Backend

	mu     sync.Mutex
	byUser map[string]*mcpsdk.Server
}

func (c *serverCache) get(r *http.Request) *mcpsdk.Server {
	info := auth.TokenInfoFromContext(r.Context())
	if info == nil {
		return nil // RequireBearerToken let nothing through without a token
	}
	key, _ := info.Extra["key"].(string)
	scopes, _ := info.Extra["scopes"].([]apikey.Scope)
	// By key and scopes: a key whose scopes change gets a server with the
	// tools they allow now.
	id := info.UserID + " " + fmt.Sprint(scopes)
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.byUser[id]
	if !ok {
		s = NewServer(c.backendFor(key), Options{Scopes: scopes})
		c.byUser[id] = s
	}
	return s
}

// The MCP HTTP headers and the first revision of the stateless era.
const (
	headerProtocolVersion = "Mcp-Protocol-Version"
	headerSessionID       = "Mcp-Session-Id"
	metaProtocolVersion   = "io.modelcontextprotocol/protocolVersion"
	statelessEra          = "2026-07-28"
	methodDiscover        = "server/discover"
)

// maxPeek is how much of a request body the router reads to choose: the
// SDK's own limit on a body, so a body it would take is never cut here.
const maxPeek = mcpsdk.DefaultMaxRequestBodyBytes

// eraRouter sends each request to the handler of its protocol era.
//
//   - A request of a session (Mcp-Session-Id), and every GET and DELETE
//     (which only sessions have), goes to the stateful handler.
//   - A POST whose Mcp-Protocol-Version header or body `_meta` protocol
//     version is 2026-07-28 or later, or that is server/discover, goes to the
//     stateless handler.
//   - Everything else (initialize, and old clients' requests) goes to the
//     stateful handler, which starts a session at initialize.
//
// A version the server does not speak, in the header or in `_meta`, is
// answered here with a JSON-RPC error (-32022, UnsupportedProtocolVersion)
// listing the versions it does, as HTTP 400: the SDK would answer an unknown
// old version in the header with plain text. initialize with an unknown
// version is not an error: as the spec says, the server answers it with a
// version it supports, and the client decides whether it can speak that.
type eraRouter struct {
	stateful, stateless http.Handler
	supported           []string
}

func (e *eraRouter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.Header.Get(headerSessionID) != "" {
		e.stateful.ServeHTTP(w, r)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxPeek+1))
	if err != nil {
		http.Error(w, "reading the request: "+err.Error(), http.StatusBadRequest)
		return
	}
	// The handler reads the body again: what was read, then the rest (a
	// body over the limit reaches the SDK whole, which refuses it).
	r.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(body), r.Body), r.Body}
	msg := peekMessage(body)
	headerVersion := r.Header.Get(headerProtocolVersion)
	for _, v := range []string{headerVersion, msg.metaVersion} {
		if v != "" && !slices.Contains(e.supported, v) {
			e.unsupported(w, msg.id, v)
			return
		}
	}
	if headerVersion >= statelessEra || msg.metaVersion >= statelessEra || msg.method == methodDiscover {
		e.stateless.ServeHTTP(w, r)
		return
	}
	e.stateful.ServeHTTP(w, r)
}

// unsupported answers a request at a protocol version the server does not
// speak, with the versions it does (SEP-2575's UnsupportedProtocolVersion).
func (e *eraRouter) unsupported(w http.ResponseWriter, id json.RawMessage, requested string) {
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	data, _ := json.Marshal(mcpsdk.UnsupportedProtocolVersionData{Supported: e.supported, Requested: requested})
	resp := struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   jsonrpc.Error   `json:"error"`
	}{"2.0", id, jsonrpc.Error{
		Code:    mcpsdk.CodeUnsupportedProtocolVersion,
		Message: fmt.Sprintf("unsupported protocol version %q; this server supports %s", requested, strings.Join(e.supported, ", ")),
		Data:    data,
	}}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusBadRequest)
	_ = json.NewEncoder(w).Encode(resp)
}

// peeked is what the router needs of a request body: the first message's
// id, method and `_meta` protocol version.
type peeked struct {
	id          json.RawMessage
	method      string
	metaVersion string
}

// peekMessage reads the first message of a body (a message or a batch);
// a body that is not JSON-RPC gives nothing, and the SDK says what is wrong.
func peekMessage(body []byte) peeked {
	var m struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Params struct {
			Meta map[string]json.RawMessage `json:"_meta"`
		} `json:"params"`
	}
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if len(trimmed) > 0 && trimmed[0] == '[' {
		var batch []json.RawMessage
		if json.Unmarshal(trimmed, &batch) != nil || len(batch) == 0 {
			return peeked{}
		}
		trimmed = batch[0]
	}
	if json.Unmarshal(trimmed, &m) != nil {
		return peeked{}
	}
	p := peeked{id: m.ID, method: m.Method}
	if raw, ok := m.Params.Meta[metaProtocolVersion]; ok {
		if json.Unmarshal(raw, &p.metaVersion) != nil {
			// Not a string: no version the server speaks.
			p.metaVersion = string(raw)
		}
	}
	return p
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
