// Package e2bclient is Airlock's one Go client of the E2B wire protocol: the
// control plane's REST API, and, through the sandbox proxy, envd's Connect
// services and /files and the code interpreter's /execute. internal/mcp (the
// MCP tools) and internal/bench speak the wire through it, so the auth and
// routing headers, the URLs and the error mapping are written once, here; the
// bodies are e2bwire's, the same types the server uses.
//
// Errors: a non-2xx answer from the API, envd or the interpreter is an *Error
// carrying the HTTP status and the server's own message (what an agent should
// read); a failure to reach the server or to read its answer is wrapped with
// what the client was doing. Connect RPCs return connect's errors unchanged.
package e2bclient

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/api/gen/filesystem/filesystemconnect"
	"github.com/airlock-sandbox/airlock/api/gen/process/processconnect"
	"github.com/airlock-sandbox/airlock/internal/e2bwire"
	"github.com/airlock-sandbox/airlock/internal/timing"
)

// maxAnswer bounds a control-plane answer read into memory; real ones are a
// few KiB, so only a misbehaving server reaches it.
const maxAnswer = 16 << 20

// Config says where Airlock's E2B API and sandbox proxy are and which key to use.
type Config struct {
	APIURL, APIKey string
	// SandboxURL is the sandbox proxy (E2B_SANDBOX_URL). Empty: asked of the
	// server (e2bwire.InfoPath) on first use, because guessing it from the API
	// URL would reach whatever listens on the guessed port.
	SandboxURL string
	// HTTPClient carries every request; nil is http.DefaultClient.
	HTTPClient *http.Client
}

// Client talks to one Airlock server. It is safe for concurrent use.
type Client struct {
	api, key string
	http     *http.Client

	// mu guards the sandbox proxy's URL and the Connect clients bound to it,
	// set on first use when the config named no URL.
	mu   sync.Mutex
	sbx  string
	proc processconnect.ProcessClient
	fs   filesystemconnect.FilesystemClient
}

// New returns a client for the server cfg names.
func New(cfg Config) *Client {
	hc := cfg.HTTPClient
	if hc == nil {
		hc = http.DefaultClient
	}
	c := &Client{api: strings.TrimRight(cfg.APIURL, "/"), key: cfg.APIKey, http: hc}
	if cfg.SandboxURL != "" {
		c.setSandboxURL(cfg.SandboxURL)
	}
	return c
}

// APIURL is the control plane's base URL, without a trailing slash.
func (c *Client) APIURL() string { return c.api }

func (c *Client) setSandboxURL(u string) {
	c.sbx = strings.TrimRight(u, "/")
	c.proc = processconnect.NewProcessClient(c.http, c.sbx, connect.WithProtoJSON())
	c.fs = filesystemconnect.NewFilesystemClient(c.http, c.sbx, connect.WithProtoJSON())
}

// sandboxURL returns the sandbox proxy's URL and Connect clients, asking the
// server where its proxy is the first time. A failure is not remembered: the
// server may simply not have started yet.
func (c *Client) sandboxURL(ctx context.Context) (string, processconnect.ProcessClient, filesystemconnect.FilesystemClient, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sbx != "" {
		return c.sbx, c.proc, c.fs, nil
	}
	info, err := c.ServerInfo(ctx)
	if err != nil {
		return "", nil, nil, fmt.Errorf("ask %s where its sandbox proxy is (or set E2B_SANDBOX_URL / --sandbox-url): %w", c.api, err)
	}
	if info.SandboxURL == "" {
		return "", nil, nil, fmt.Errorf("%s%s names no sandboxUrl; set E2B_SANDBOX_URL or --sandbox-url", c.api, e2bwire.InfoPath)
	}
	c.setSandboxURL(info.SandboxURL)
	return c.sbx, c.proc, c.fs, nil
}

// SandboxURL is the sandbox proxy's URL, asked of the server if the config
// named none.
func (c *Client) SandboxURL(ctx context.Context) (string, error) {
	u, _, _, err := c.sandboxURL(ctx)
	return u, err
}

// Error is a non-2xx answer: its HTTP status and the server's message (the
// JSON body's "message", else the body's text, else the status line).
type Error struct {
	Status  int
	Message string
	// Header is the answer's header (Retry-After on a 429 or 503).
	Header http.Header
}

func (e *Error) Error() string { return fmt.Sprintf("%s (HTTP %d)", e.Message, e.Status) }

// RetryAfter is the answer's Retry-After in seconds, and whether it had one:
// the API sends it on rate limits (429) and while a template is still being
// built (503). A value that is not a number of seconds counts as zero.
func (e *Error) RetryAfter() (time.Duration, bool) {
	v := e.Header.Get("Retry-After")
	if v == "" {
		return 0, false
	}
	n, _ := strconv.Atoi(v)
	return time.Duration(n) * time.Second, true
}

// errorFrom reads a non-2xx answer into an *Error. Both the API and envd send
// {"code", "message"}; the proxy adds fields to it, and the interpreter answers
// in plain text.
func errorFrom(resp *http.Response) *Error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var body e2bwire.Error
	msg := strings.TrimSpace(string(b))
	if json.Unmarshal(b, &body) == nil && body.Message != "" {
		msg = body.Message
	}
	if msg == "" {
		msg = resp.Status
	}
	return &Error{Status: resp.StatusCode, Message: msg, Header: resp.Header}
}

// --- control plane ---------------------------------------------------------------

// do sends one REST request with the API key and decodes a 2xx JSON answer into
// out (if not nil). It returns the answer's header (X-Next-Token).
func (c *Client) do(ctx context.Context, method, path string, body, out any) (http.Header, error) {
	hdr, _, err := c.doStatus(ctx, method, path, body, out)
	return hdr, err
}

// doStatus is do, also returning the 2xx status the server chose (connect
// answers 201 when it resumed the sandbox, 200 when it was running).
func (c *Client) doStatus(ctx context.Context, method, path string, body, out any) (http.Header, int, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, 0, fmt.Errorf("encode request: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.api+path, rd)
	if err != nil {
		return nil, 0, fmt.Errorf("build request: %w", err)
	}
	req.Header.Set(e2bwire.HeaderAPIKey, c.key)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, 0, fmt.Errorf("airlock API: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return nil, 0, errorFrom(resp)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return nil, 0, fmt.Errorf("airlock API: read answer: %w", err)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return nil, 0, fmt.Errorf("airlock API %s %s: decode answer: %w", method, path, err)
		}
	}
	return resp.Header, resp.StatusCode, nil
}

func sandboxPath(id string) string { return "/sandboxes/" + url.PathEscape(id) }

// ServerInfo asks an Airlock server where its sandbox proxy is (not part of
// E2B's API).
func (c *Client) ServerInfo(ctx context.Context) (e2bwire.ServerInfo, error) {
	var info e2bwire.ServerInfo
	_, err := c.do(ctx, http.MethodGet, e2bwire.InfoPath, nil, &info)
	return info, err
}

// Create creates a sandbox (POST /v2/sandboxes). The answer carries the
// envd access token, which Sandbox needs.
func (c *Client) Create(ctx context.Context, body e2bwire.NewSandbox) (e2bwire.Sandbox, error) {
	sb, _, err := c.CreateTimed(ctx, body)
	return sb, err
}

// CreateTimed is Create that also returns where the server says the create's
// time went (its Server-Timing header; none from a server that sends none).
func (c *Client) CreateTimed(ctx context.Context, body e2bwire.NewSandbox) (e2bwire.Sandbox, []timing.Span, error) {
	var sb e2bwire.Sandbox
	h, err := c.do(ctx, http.MethodPost, "/v2/sandboxes", body, &sb)
	if err != nil {
		return sb, nil, err
	}
	return sb, timing.ParseServerTiming(h.Get("Server-Timing")), nil
}

// Get returns a sandbox's details, its state and access token among them.
func (c *Client) Get(ctx context.Context, id string) (e2bwire.SandboxDetail, error) {
	var sb e2bwire.SandboxDetail
	_, err := c.do(ctx, http.MethodGet, sandboxPath(id), nil, &sb)
	return sb, err
}

// Kill kills a sandbox; an unknown one is an *Error with status 404.
func (c *Client) Kill(ctx context.Context, id string) error {
	_, err := c.do(ctx, http.MethodDelete, sandboxPath(id), nil, nil)
	return err
}

// SetTimeout sets how long from now the sandbox lives (whole seconds).
func (c *Client) SetTimeout(ctx context.Context, id string, d time.Duration) error {
	secs := int64(d / time.Second)
	_, err := c.do(ctx, http.MethodPost, sandboxPath(id)+"/timeout", e2bwire.TimeoutRequest{Timeout: &secs}, nil)
	return err
}

// Metrics returns the sandbox's retained metrics samples, as the server orders them.
func (c *Client) Metrics(ctx context.Context, id string) ([]e2bwire.SandboxMetric, error) {
	var ms []e2bwire.SandboxMetric
	_, err := c.do(ctx, http.MethodGet, sandboxPath(id)+"/metrics", nil, &ms)
	return ms, err
}

// ListQuery filters GET /v2/sandboxes.
type ListQuery struct {
	// State is "running", "paused" or both comma-separated; empty is both.
	State string
	// Metadata must all match.
	Metadata map[string]string
	// PageSize is the limit of each page; 0 is 100, the server's maximum.
	PageSize int
}

// List returns every sandbox the query matches, following X-Next-Token
// through all pages.
func (c *Client) List(ctx context.Context, q ListQuery) ([]e2bwire.ListedSandbox, error) {
	var all []e2bwire.ListedSandbox
	for next := ""; ; {
		page, n, err := c.listPage(ctx, q, next)
		if err != nil {
			return nil, err
		}
		all = append(all, page...)
		if n == "" || len(page) == 0 {
			return all, nil
		}
		next = n
	}
}

// ListPage returns the first page of the sandboxes the query matches, as
// the SDKs' paginator's first nextItems() does.
func (c *Client) ListPage(ctx context.Context, q ListQuery) ([]e2bwire.ListedSandbox, error) {
	page, _, err := c.listPage(ctx, q, "")
	return page, err
}

// listPage is one GET /v2/sandboxes, from the page next names ("" the
// first); it returns the token of the page after it ("" when none).
func (c *Client) listPage(ctx context.Context, q ListQuery, next string) ([]e2bwire.ListedSandbox, string, error) {
	v := url.Values{"limit": {strconv.Itoa(cmp.Or(q.PageSize, 100))}}
	if q.State != "" {
		v.Set("state", q.State)
	}
	if len(q.Metadata) > 0 {
		// The metadata filter is a query string of its own, escaped once more
		// as a whole, as the JS SDK sends it (docs/E2B-WIRE.md §2.5): the
		// server unescapes the parameter value again before splitting on "&".
		md := url.Values{}
		for k, val := range q.Metadata {
			md.Set(k, val)
		}
		v.Set("metadata", url.QueryEscape(md.Encode()))
	}
	if next != "" {
		v.Set("nextToken", next)
	}
	var page []e2bwire.ListedSandbox
	hdr, err := c.do(ctx, http.MethodGet, "/v2/sandboxes?"+v.Encode(), nil, &page)
	if err != nil {
		return nil, "", err
	}
	return page, hdr.Get(e2bwire.HeaderNextToken), nil
}
