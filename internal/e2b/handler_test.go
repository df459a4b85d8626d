package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/timing"
)

const testKey = "e2b_0123456789abcdef0123456789abcdef01234567"

func testOptions() Options {
	return Options{
		Authenticate: func(k string) bool { return k == testKey },
		Logger:       slog.New(slog.DiscardHandler),
	}
}

func newTestHandler(t testing.TB, tweak ...func(*Options)) (*Handler, *fakeManager) {
	t.Helper()
	m := newFakeManager()
	opts := testOptions()
	for _, f := range tweak {
		f(&opts)
	}
	return NewHandler(m, opts), m
}

// request sends an authenticated request; pass hdr pairs to override headers
// (an empty value removes the header).
func request(t testing.TB, h http.Handler, method, target, body string, hdr ...string) *httptest.ResponseRecorder {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, target, r)
	req.Header.Set("X-API-KEY", testKey)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i+1] == "" {
			req.Header.Del(hdr[i])
		} else {
			req.Header.Set(hdr[i], hdr[i+1])
		}
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// checkError asserts the one error shape: JSON {"code","message"} with code
// equal to the HTTP status. want is the exact message, or a prefix when it
// ends in "...".
func checkError(t testing.TB, rec *httptest.ResponseRecorder, status int, want string) {
	t.Helper()
	if rec.Code != status {
		t.Fatalf("status = %d, want %d; body %s", rec.Code, status, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", ct)
	}
	var body struct {
		Code    *int    `json:"code"`
		Message *string `json:"message"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("error body is not JSON: %v: %s", err, rec.Body)
	}
	if body.Code == nil || *body.Code != status {
		t.Errorf("body code = %v, want %d; body %s", body.Code, status, rec.Body)
	}
	if body.Message == nil {
		t.Fatalf("body has no message: %s", rec.Body)
	}
	if prefix, ok := strings.CutSuffix(want, "..."); ok {
		if !strings.HasPrefix(*body.Message, prefix) {
			t.Errorf("message = %q, want prefix %q", *body.Message, prefix)
		}
	} else if *body.Message != want {
		t.Errorf("message = %q, want %q", *body.Message, want)
	}
}

func decodeObject(t testing.TB, rec *httptest.ResponseRecorder) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &m); err != nil {
		t.Fatalf("body is not a JSON object: %v: %s", err, rec.Body)
	}
	return m
}

func wantKeys(t testing.TB, obj map[string]any, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if _, ok := obj[k]; !ok {
			t.Errorf("response lacks %q: %v", k, obj)
		}
	}
}

func TestHealthNeedsNoKey(t *testing.T) {
	h, _ := newTestHandler(t)
	rec := request(t, h, "GET", "/health", "", "X-API-KEY", "")
	if rec.Code != http.StatusOK {
		t.Fatalf("status = %d, want 200", rec.Code)
	}
}

func TestAuth(t *testing.T) {
	tests := []struct {
		name   string
		hdr    []string
		status int
		msg    string
	}{
		{"missing", []string{"X-API-KEY", ""}, 401, "Missing API key: send it in the X-API-KEY header"},
		{"wrong", []string{"X-API-KEY", "e2b_nope"}, 401, "Invalid API key"},
		{"lower-case header name", []string{"X-API-KEY", "", "x-api-key", testKey}, 200, ""},
		{"OpenAPI spelling", []string{"X-API-KEY", "", "X-API-Key", testKey}, 200, ""},
		{"bearer", []string{"X-API-KEY", "", "Authorization", "Bearer " + testKey}, 200, ""},
		{"bearer lower-case scheme", []string{"X-API-KEY", "", "Authorization", "bearer " + testKey}, 200, ""},
		{"bearer wrong", []string{"X-API-KEY", "", "Authorization", "Bearer nope"}, 401, "Invalid API key"},
		{"basic is not a key", []string{"X-API-KEY", "", "Authorization", "Basic " + testKey}, 401, "Missing API key: send it in the X-API-KEY header"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, _ := newTestHandler(t)
			rec := request(t, h, "GET", "/v2/sandboxes", "", tt.hdr...)
			if tt.status == 200 {
				if rec.Code != 200 {
					t.Fatalf("status = %d, want 200: %s", rec.Code, rec.Body)
				}
				return
			}
			checkError(t, rec, tt.status, tt.msg)
		})
	}

	// Every endpoint but /health is behind the key, and the manager is never
	// reached without one.
	endpoints := [][2]string{
		{"POST", "/sandboxes"}, {"POST", "/v2/sandboxes"}, {"GET", "/sandboxes"}, {"GET", "/v2/sandboxes"},
		{"GET", "/sandboxes/abc"}, {"DELETE", "/sandboxes/abc"}, {"POST", "/sandboxes/abc/connect"},
		{"POST", "/v2/sandboxes/abc/connect"}, {"POST", "/sandboxes/abc/resume"}, {"POST", "/sandboxes/abc/timeout"},
		{"POST", "/sandboxes/abc/refreshes"}, {"POST", "/sandboxes/abc/pause"}, {"GET", "/sandboxes/abc/metrics"},
		{"PUT", "/sandboxes/abc/network"}, {"POST", "/sandboxes/abc/fork"}, {"POST", "/sandboxes/abc/snapshots"},
		{"GET", "/snapshots"}, {"DELETE", "/templates/abc:default"},
	}
	for _, ep := range endpoints {
		h, m := newTestHandler(t)
		rec := request(t, h, ep[0], ep[1], `{"templateID":"base","timeout":10}`, "X-API-KEY", "wrong")
		checkError(t, rec, 401, "Invalid API key")
		if m.calls != 0 {
			t.Errorf("%s %s reached the manager without a valid key", ep[0], ep[1])
		}
	}

	t.Run("nil Authenticate fails closed", func(t *testing.T) {
		h, _ := newTestHandler(t, func(o *Options) { o.Authenticate = nil })
		checkError(t, request(t, h, "GET", "/v2/sandboxes", ""), 401, "Invalid API key")
	})
}

func TestUnroutedRequestsGetJSONErrors(t *testing.T) {
	h, _ := newTestHandler(t)
	checkError(t, request(t, h, "GET", "/nope", ""), 404, "no route for GET /nope")
	rec := request(t, h, "PATCH", "/sandboxes/abc", "")
	checkError(t, rec, 405, "method PATCH not allowed on /sandboxes/abc")
	if rec.Header().Get("Allow") == "" {
		t.Error("405 without an Allow header")
	}
}

func TestCreate(t *testing.T) {
	yes, no := true, false
	tests := []struct {
		name        string
		path        string
		body        string
		wantTimeout time.Duration
		wantSecure  bool
		wantNet     *bool
		wantMeta    map[string]string
		wantEnv     map[string]string
	}{
		{name: "v1 defaults", path: "/sandboxes", body: `{"templateID":"base"}`, wantTimeout: 15 * time.Second},
		{name: "v1 secure", path: "/sandboxes", body: `{"templateID":"base","timeout":60,"secure":true}`, wantTimeout: time.Minute, wantSecure: true},
		{name: "v1 secure false", path: "/sandboxes", body: `{"templateID":"base","timeout":60,"secure":false}`, wantTimeout: time.Minute},
		{name: "v2 defaults", path: "/v2/sandboxes", body: `{"templateID":"base"}`, wantTimeout: 300 * time.Second, wantSecure: true},
		{name: "v2 ignores secure false", path: "/v2/sandboxes", body: `{"templateID":"base","secure":false}`, wantTimeout: 300 * time.Second, wantSecure: true},
		{name: "v2 timeout", path: "/v2/sandboxes", body: `{"templateID":"base","timeout":86400}`, wantTimeout: 24 * time.Hour, wantSecure: true},
		{name: "template by id", path: "/sandboxes", body: `{"templateID":"rki5dems9wqfm4r03t7g","timeout":300}`, wantTimeout: 300 * time.Second},
		{
			name: "metadata and envVars", path: "/sandboxes",
			body:        `{"templateID":"base","timeout":30,"metadata":{"a b":"c&d","k":""},"envVars":{"FOO":"bar"}}`,
			wantTimeout: 30 * time.Second, wantMeta: map[string]string{"a b": "c&d", "k": ""}, wantEnv: map[string]string{"FOO": "bar"},
		},
		{name: "allow_internet_access false", path: "/sandboxes", body: `{"templateID":"base","timeout":30,"allow_internet_access":false}`, wantTimeout: 30 * time.Second, wantNet: &no},
		{name: "allow_internet_access true", path: "/v2/sandboxes", body: `{"templateID":"base","allow_internet_access":true}`, wantTimeout: 300 * time.Second, wantSecure: true, wantNet: &yes},
		{name: "camelCase allowInternetAccess is not the wire name", path: "/sandboxes", body: `{"templateID":"base","timeout":30,"allowInternetAccess":false}`, wantTimeout: 30 * time.Second},
		{
			name: "unknown and ignored fields", path: "/v2/sandboxes",
			body:        `{"templateID":"base","mcp":null,"iam":{"tokens":{}},"volumeMounts":[],"somethingNew":[1,2]}`,
			wantTimeout: 300 * time.Second, wantSecure: true,
		},
		{name: "network deny all fails closed", path: "/v2/sandboxes", body: `{"templateID":"base","network":{"denyOut":["0.0.0.0/0"],"allowOut":["example.com","1.1.1.1"]}}`, wantTimeout: 300 * time.Second, wantSecure: true, wantNet: &no},
		{name: "explicit allow_internet_access wins over network", path: "/v2/sandboxes", body: `{"templateID":"base","allow_internet_access":true,"network":{"denyOut":["0.0.0.0/0"]}}`, wantTimeout: 300 * time.Second, wantSecure: true, wantNet: &yes},
		{name: "network without deny all", path: "/v2/sandboxes", body: `{"templateID":"base","network":{"allowPublicTraffic":false,"denyOut":["10.0.0.0/8"]}}`, wantTimeout: 300 * time.Second, wantSecure: true},
		{name: "null network", path: "/v2/sandboxes", body: `{"templateID":"base","network":null}`, wantTimeout: 300 * time.Second, wantSecure: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, m := newTestHandler(t)
			rec := request(t, h, "POST", tt.path, tt.body)
			if rec.Code != http.StatusCreated {
				t.Fatalf("status = %d, want 201: %s", rec.Code, rec.Body)
			}
			got := m.lastCreate
			if got.Timeout != tt.wantTimeout {
				t.Errorf("timeout = %v, want %v", got.Timeout, tt.wantTimeout)
			}
			if got.Secure != tt.wantSecure {
				t.Errorf("secure = %v, want %v", got.Secure, tt.wantSecure)
			}
			if (got.AllowInternetAccess == nil) != (tt.wantNet == nil) || (got.AllowInternetAccess != nil && *got.AllowInternetAccess != *tt.wantNet) {
				t.Errorf("allowInternetAccess = %v, want %v", ptrStr(got.AllowInternetAccess), ptrStr(tt.wantNet))
			}
			if !equalMaps(got.Metadata, tt.wantMeta) || !equalMaps(got.EnvVars, tt.wantEnv) {
				t.Errorf("metadata/envVars = %v / %v, want %v / %v", got.Metadata, got.EnvVars, tt.wantMeta, tt.wantEnv)
			}

			obj := decodeObject(t, rec)
			wantKeys(t, obj, "sandboxID", "templateID", "alias", "clientID", "envdVersion", "domain")
			if obj["domain"] != nil {
				t.Errorf("domain = %v, want null when Options.Domain is empty", obj["domain"])
			}
			if obj["templateID"] != "rki5dems9wqfm4r03t7g" || obj["alias"] != "base" || obj["envdVersion"] != "0.6.4" || obj["clientID"] != "fakeclient" {
				t.Errorf("unexpected sandbox body %v", obj)
			}
			tok, hasTok := obj["envdAccessToken"]
			if hasTok != tt.wantSecure {
				t.Errorf("envdAccessToken present = %v, want %v", hasTok, tt.wantSecure)
			}
			if tt.wantSecure && tok != "token-"+obj["sandboxID"].(string) {
				t.Errorf("envdAccessToken = %v", tok)
			}
		})
	}
}

func ptrStr(b *bool) string {
	if b == nil {
		return "nil"
	}
	if *b {
		return "true"
	}
	return "false"
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// A create's answer says where its time went, as a Server-Timing header
// with the handler's template access check, the manager's steps and the
// handler's total.
func TestCreateServerTiming(t *testing.T) {
	h, _ := newTestHandler(t)
	rec := request(t, h, "POST", "/v2/sandboxes", `{"templateID":"base"}`)
	if rec.Code != http.StatusCreated {
		t.Fatalf("status = %d, want 201: %s", rec.Code, rec.Body)
	}
	spans := timing.ParseServerTiming(rec.Header().Get("Server-Timing"))
	if len(spans) != 3 || spans[0].Name != "access" || spans[1].Name != "fake_step" || spans[2].Name != "total" || spans[2].D < spans[0].D+spans[1].D {
		t.Fatalf("Server-Timing %q: want access, fake_step, then a total at least as long as both", rec.Header().Get("Server-Timing"))
	}
	rec = request(t, h, "POST", "/v2/sandboxes", `{"templateID":""}`)
	if rec.Code != http.StatusBadRequest || rec.Header().Get("Server-Timing") != "" {
		t.Fatalf("a refused create: status %d, Server-Timing %q; want 400 and none", rec.Code, rec.Header().Get("Server-Timing"))
	}
}

func TestCreateResponseFallbacksAndDomain(t *testing.T) {
	h, m := newTestHandler(t, func(o *Options) { o.Domain = "sbx.example.com"; o.EnvdVersion = "0.9.9" })
	m.templates["bare"] = "bare"
	rec := request(t, h, "POST", "/v2/sandboxes", `{"templateID":"bare"}`)
	if rec.Code != 201 {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	// Make the manager return an Info without the optional-on-our-side fields.
	info := m.sandboxes["sbx0001"]
	info.ClientID, info.EnvdVersion = "", ""
	rec = request(t, h, "POST", "/v2/sandboxes/sbx0001/connect", "")
	obj := decodeObject(t, rec)
	if obj["domain"] != "sbx.example.com" || obj["clientID"] != DefaultClientID || obj["envdVersion"] != "0.9.9" || obj["alias"] != "" {
		t.Errorf("fallbacks not applied: %v", obj)
	}
}

func TestCreateValidation(t *testing.T) {
	tests := []struct {
		name   string
		path   string
		body   string
		status int
		msg    string
	}{
		{"empty body", "/sandboxes", "", 400, `request body is required: {"templateID": ...}`},
		{"null body", "/v2/sandboxes", "null", 400, `request body is required: {"templateID": ...}`},
		{"truncated JSON", "/sandboxes", `{"templateID":`, 400, "malformed JSON body: unexpected end of JSON input..."},
		{"not an object", "/v2/sandboxes", `[]`, 400, "malformed JSON body: expected an object, got array"},
		{"trailing garbage", "/v2/sandboxes", `{"templateID":"base"} x`, 400, "malformed JSON body: invalid character 'x' after top-level value (at byte 23)"},
		{"missing templateID", "/sandboxes", `{"timeout":10}`, 400, "templateID is required"},
		{"empty templateID", "/v2/sandboxes", `{"templateID":"  "}`, 400, "templateID is required"},
		{"null templateID", "/v2/sandboxes", `{"templateID":null}`, 400, "templateID is required"},
		{"templateID number", "/v2/sandboxes", `{"templateID":5}`, 400, `malformed JSON body: field "templateID" must be a string, got number`},
		{"zero timeout", "/sandboxes", `{"templateID":"base","timeout":0}`, 400, "Timeout must be greater than 0"},
		{"negative timeout", "/v2/sandboxes", `{"templateID":"base","timeout":-5}`, 400, "Timeout must be greater than 0"},
		{"timeout over max", "/v2/sandboxes", `{"templateID":"base","timeout":86401}`, 400, "Timeout cannot be greater than 24 hours"},
		{"timeout overflows", "/v2/sandboxes", `{"templateID":"base","timeout":9223372036854775807}`, 400, "Timeout cannot be greater than 24 hours"},
		{"timeout beyond int64", "/v2/sandboxes", `{"templateID":"base","timeout":1e30}`, 400, `malformed JSON body: field "timeout" must be an integer, got number 1e30`},
		{"fractional timeout", "/v2/sandboxes", `{"templateID":"base","timeout":1.5}`, 400, `malformed JSON body: field "timeout" must be an integer, got number 1.5`},
		{"string timeout", "/sandboxes", `{"templateID":"base","timeout":"300"}`, 400, `malformed JSON body: field "timeout" must be an integer, got string`},
		{"metadata number", "/v2/sandboxes", `{"templateID":"base","metadata":{"a":1}}`, 400, `metadata values must be strings: "a" is a number`},
		{"metadata null value", "/v2/sandboxes", `{"templateID":"base","metadata":{"b":"x","a":null}}`, 400, `metadata values must be strings: "a" is null`},
		{"metadata object value", "/v2/sandboxes", `{"templateID":"base","metadata":{"a":{}}}`, 400, `metadata values must be strings: "a" is an object`},
		{"metadata not object", "/v2/sandboxes", `{"templateID":"base","metadata":"a=b"}`, 400, `malformed JSON body: field "metadata" must be an object, got string`},
		{"envVars bool", "/sandboxes", `{"templateID":"base","timeout":5,"envVars":{"X":true}}`, 400, `envVars values must be strings: "X" is a boolean`},
		{"secure not bool", "/sandboxes", `{"templateID":"base","secure":"yes"}`, 400, `malformed JSON body: field "secure" must be a boolean, got string`},
		{"unknown template", "/v2/sandboxes", `{"templateID":"nope"}`, 404, `template "nope" not found`},
		{"denyOut domain", "/v2/sandboxes", `{"templateID":"base","network":{"denyOut":["example.com"]}}`, 400, `network: denyOut entry "example.com" is not an IP address or CIDR`},
		{"denyOut zoned IPv6", "/v2/sandboxes", `{"templateID":"base","network":{"denyOut":["fe80::1%eth0"]}}`, 400, `network: denyOut entry "fe80::1%eth0" is not an IP address or CIDR`},
		{"allowOut bad IPv6 CIDR", "/v2/sandboxes", `{"templateID":"base","network":{"allowOut":["fd00::/129"]}}`, 400, `network: allowOut entry "fd00::/129" is not an IP address, CIDR or domain`},
		{"allowOut garbage", "/v2/sandboxes", `{"templateID":"base","network":{"allowOut":["not a host!"],"denyOut":["0.0.0.0/0"]}}`, 400, `network: allowOut entry "not a host!" is not an IP address, CIDR or domain`},
		{"allowOut domain needs deny all", "/v2/sandboxes", `{"templateID":"base","network":{"allowOut":["example.com"]}}`, 400, `network: allowing domains in allowOut requires "0.0.0.0/0" (ALL_TRAFFIC) in denyOut`},
		{"egress proxy without address", "/v2/sandboxes", `{"templateID":"base","network":{"egressProxy":{"username":"u"}}}`, 400, "network: egressProxy.address is required"},
		{"mask host with a path", "/v2/sandboxes", `{"templateID":"base","network":{"maskRequestHost":"example.com/x"}}`, 400, "network: mask request host is not valid: example.com/x"},
		{"mask host not ASCII", "/v2/sandboxes", `{"templateID":"base","network":{"maskRequestHost":"bücher.example"}}`, 400, "network: mask request host 'bücher.example' is not ASCII (or holds spaces). Please use ASCII characters only."},
		{"mask host with a space", "/v2/sandboxes", `{"templateID":"base","network":{"maskRequestHost":"a b"}}`, 400, "network: mask request host 'a b' is not ASCII (or holds spaces). Please use ASCII characters only."},
		{"mask host bad port", "/v2/sandboxes", `{"templateID":"base","network":{"maskRequestHost":"localhost:99999"}}`, 400, `network: mask request host is not valid: localhost:99999 (port "99999")`},
		{"mask host empty", "/v2/sandboxes", `{"templateID":"base","network":{"maskRequestHost":""}}`, 400, "network: mask request host is not valid: "},
		{"manager ErrInvalid", "/v2/sandboxes", `{"templateID":"invalid"}`, 400, `create sandbox from "invalid": sandbox invalid cannot do that: invalid request`},
		{"manager plain error", "/v2/sandboxes", `{"templateID":"boom"}`, 500, `create sandbox from "boom": disk on fire`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, _ := newTestHandler(t)
			checkError(t, request(t, h, "POST", tt.path, tt.body), tt.status, tt.msg)
		})
	}

	t.Run("configured max timeout", func(t *testing.T) {
		h, _ := newTestHandler(t, func(o *Options) { o.MaxTimeout = time.Hour })
		checkError(t, request(t, h, "POST", "/v2/sandboxes", `{"templateID":"base","timeout":3601}`), 400, "Timeout cannot be greater than 1 hours")
		h, _ = newTestHandler(t, func(o *Options) { o.MaxTimeout = 90 * time.Minute })
		checkError(t, request(t, h, "POST", "/v2/sandboxes", `{"templateID":"base","timeout":5401}`), 400, "Timeout cannot be greater than 5400 seconds")
	})

	t.Run("body too large", func(t *testing.T) {
		h, _ := newTestHandler(t, func(o *Options) { o.MaxBodySize = 64 })
		big := `{"templateID":"base","metadata":{"k":"` + strings.Repeat("x", 100) + `"}}`
		checkError(t, request(t, h, "POST", "/v2/sandboxes", big), 413, "request body is larger than 64 bytes")
	})
}

// The JS SDK sends request bodies with Transfer-Encoding: chunked and no
// Content-Length; this goes through a real server to make sure of it.
func TestChunkedBodies(t *testing.T) {
	h, m := newTestHandler(t)
	var sawChunked bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sawChunked = len(r.TransferEncoding) == 1 && r.TransferEncoding[0] == "chunked" && r.ContentLength == -1
		h.ServeHTTP(w, r)
	}))
	defer srv.Close()

	send := func(method, path, body string) *http.Response {
		t.Helper()
		pr, pw := io.Pipe()
		go func() {
			_, _ = io.WriteString(pw, body)
			_ = pw.Close()
		}()
		req, err := http.NewRequest(method, srv.URL+path, pr)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-API-KEY", testKey)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if !sawChunked {
			t.Fatalf("%s %s did not arrive chunked", method, path)
		}
		return resp
	}

	if resp := send("POST", "/v2/sandboxes", `{"templateID":"base","timeout":42}`); resp.StatusCode != 201 {
		t.Fatalf("chunked create: status %d", resp.StatusCode)
	}
	if m.lastCreate.Timeout != 42*time.Second {
		t.Errorf("chunked create timeout = %v", m.lastCreate.Timeout)
	}
	// Empty chunked bodies where the body is optional.
	if resp := send("POST", "/v2/sandboxes/sbx0001/connect", ""); resp.StatusCode != 200 {
		t.Errorf("chunked empty connect: status %d", resp.StatusCode)
	}
	if resp := send("POST", "/sandboxes/sbx0001/pause", ""); resp.StatusCode != 204 {
		t.Errorf("chunked empty pause: status %d", resp.StatusCode)
	}
	if resp := send("POST", "/sandboxes/sbx0001/timeout", `{"timeout":7}`); resp.StatusCode != 204 {
		t.Errorf("chunked timeout: status %d", resp.StatusCode)
	}
}

func TestGetSandbox(t *testing.T) {
	h, m := newTestHandler(t, func(o *Options) { o.Domain = "example.com" })
	no := false
	end := time.Date(2025, 1, 2, 4, 0, 0, 0, time.UTC)
	m.add(sandbox.Info{
		ID: "abc123", ClientID: "c", Metadata: map[string]string{"k": "v"}, StartedAt: fakeEpoch, EndAt: end,
		State: sandbox.StatePaused, CPUCount: 2, MemoryMB: 512, DiskSizeMB: 2048, AccessToken: "tok",
		EnvdVersion: "0.6.4", AllowInternetAccess: &no,
	})
	m.add(sandbox.Info{ID: "plain", StartedAt: fakeEpoch, EnvdVersion: "0.6.4"})

	rec := request(t, h, "GET", "/sandboxes/abc123", "")
	if rec.Code != 200 {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	obj := decodeObject(t, rec)
	want := map[string]any{
		"sandboxID": "abc123", "templateID": "rki5dems9wqfm4r03t7g", "alias": "base", "clientID": "c",
		"startedAt": "2025-01-02T03:04:05.6Z", "endAt": "2025-01-02T04:00:00Z", "cpuCount": 2.0, "memoryMB": 512.0,
		"diskSizeMB": 2048.0, "state": "paused", "envdVersion": "0.6.4", "envdAccessToken": "tok",
		"domain": "example.com", "allowInternetAccess": false,
	}
	for k, v := range want {
		if obj[k] != v {
			t.Errorf("%s = %#v, want %#v", k, obj[k], v)
		}
	}
	if md, _ := obj["metadata"].(map[string]any); md["k"] != "v" {
		t.Errorf("metadata = %v", obj["metadata"])
	}

	// Optional fields: metadata always an object, allowInternetAccess null.
	obj = decodeObject(t, request(t, h, "GET", "/sandboxes/plain", ""))
	if md, ok := obj["metadata"].(map[string]any); !ok || len(md) != 0 {
		t.Errorf("metadata = %#v, want {}", obj["metadata"])
	}
	if v, ok := obj["allowInternetAccess"]; !ok || v != nil {
		t.Errorf("allowInternetAccess = %#v (present %v), want null", v, ok)
	}
	if _, ok := obj["envdAccessToken"]; ok {
		t.Error("envdAccessToken present for an unsecured sandbox")
	}

	// Old SDKs address sandboxes as <id>-<clientID>.
	if rec := request(t, h, "GET", "/sandboxes/abc123-c", ""); rec.Code != 200 {
		t.Errorf("composite id: status %d", rec.Code)
	}
}

// Sandbox-addressed endpoints share id validation and not-found mapping.
func TestSandboxIDErrors(t *testing.T) {
	endpoints := []struct{ method, suffix, body string }{
		{"GET", "", ""},
		{"DELETE", "", ""},
		{"POST", "/connect", `{"timeout":10}`},
		{"POST", "/resume", `{"timeout":10}`},
		{"POST", "/timeout", `{"timeout":10}`},
		{"POST", "/refreshes", `{}`},
		{"POST", "/pause", `{}`},
		{"GET", "/metrics", ""},
		{"PUT", "/network", `{}`},
		{"POST", "/fork", `{"count":2}`},
		{"POST", "/snapshots", `{"name":"snap"}`},
	}
	for _, ep := range endpoints {
		prefix := "/sandboxes/"
		for _, v2 := range []bool{false, true} {
			if v2 {
				if ep.suffix != "/connect" {
					continue
				}
				prefix = "/v2/sandboxes/"
			}
			name := ep.method + " " + prefix + "{id}" + ep.suffix
			t.Run(name, func(t *testing.T) {
				h, _ := newTestHandler(t)
				checkError(t, request(t, h, ep.method, prefix+"nosuch1"+ep.suffix, ep.body), 404, `sandbox "nosuch1" not found`)
				checkError(t, request(t, h, ep.method, prefix+"Bad_ID"+ep.suffix, ep.body), 400, `Invalid sandbox ID "Bad_ID": must match ^[a-z0-9]+$`)
				checkError(t, request(t, h, ep.method, prefix+"a-b-c"+ep.suffix, ep.body), 400, `Invalid sandbox ID "a-b-c": must match ^[a-z0-9]+$`)
				checkError(t, request(t, h, ep.method, prefix+"%C3%A9"+ep.suffix, ep.body), 400, `Invalid sandbox ID "é": must match ^[a-z0-9]+$`)
				checkError(t, request(t, h, ep.method, prefix+idBoom+ep.suffix, ep.body), 500, "...")
				checkError(t, request(t, h, ep.method, prefix+idInvalid+ep.suffix, ep.body), 400, "...")
				checkError(t, request(t, h, ep.method, prefix+idConflict+ep.suffix, ep.body), 409, "...")
				checkError(t, request(t, h, ep.method, prefix+idPanic+ep.suffix, ep.body), 500, "internal error: fake manager panicked on purpose")
			})
		}
	}
}

func TestErrorMessagesFromManager(t *testing.T) {
	h, _ := newTestHandler(t)
	checkError(t, request(t, h, "GET", "/sandboxes/boom", ""), 500, "get sandbox: disk on fire")
	checkError(t, request(t, h, "DELETE", "/sandboxes/conflict", ""), 409, "kill sandbox: sandbox conflict is busy: conflict")
	checkError(t, request(t, h, "POST", "/sandboxes/invalid/pause", ""), 400, "pause sandbox: sandbox invalid cannot do that: invalid request")
}

func TestKill(t *testing.T) {
	h, m := newTestHandler(t)
	m.add(sandbox.Info{ID: "abc"})
	rec := request(t, h, "DELETE", "/sandboxes/abc", "")
	if rec.Code != 204 || rec.Body.Len() != 0 {
		t.Fatalf("kill: status %d body %q", rec.Code, rec.Body)
	}
	// The JS SDK's kill() returns false on code 404.
	checkError(t, request(t, h, "DELETE", "/sandboxes/abc", ""), 404, `sandbox "abc" not found`)
}

func TestConnect(t *testing.T) {
	tests := []struct {
		name        string
		path        string
		body        string
		state       sandbox.State
		status      int
		wantTimeout time.Duration
	}{
		{"v2 running empty body", "/v2/sandboxes/abc/connect", "", sandbox.StateRunning, 200, 300 * time.Second},
		{"v2 running {}", "/v2/sandboxes/abc/connect", "{}", sandbox.StateRunning, 200, 300 * time.Second},
		{"v2 paused resumes", "/v2/sandboxes/abc/connect", `{"timeout":60}`, sandbox.StatePaused, 201, time.Minute},
		{"v1 running", "/sandboxes/abc/connect", `{"timeout":120}`, sandbox.StateRunning, 200, 2 * time.Minute},
		{"v1 paused resumes", "/sandboxes/abc/connect", `{"timeout":120,"memory":true}`, sandbox.StatePaused, 201, 2 * time.Minute},
		{"v1 without timeout gets the default", "/sandboxes/abc/connect", `{}`, sandbox.StateRunning, 200, 300 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, m := newTestHandler(t)
			m.add(sandbox.Info{ID: "abc", State: tt.state, AccessToken: "tok", EnvdVersion: "0.6.4"})
			rec := request(t, h, "POST", tt.path, tt.body)
			if rec.Code != tt.status {
				t.Fatalf("status = %d, want %d: %s", rec.Code, tt.status, rec.Body)
			}
			if m.lastConnect != tt.wantTimeout {
				t.Errorf("connect timeout = %v, want %v", m.lastConnect, tt.wantTimeout)
			}
			obj := decodeObject(t, rec)
			wantKeys(t, obj, "sandboxID", "templateID", "clientID", "envdVersion", "envdAccessToken", "domain", "alias")
		})
	}

	errs := []struct {
		name, body string
		status     int
		msg        string
	}{
		{"zero", `{"timeout":0}`, 400, "Timeout must be greater than 0"},
		{"negative", `{"timeout":-1}`, 400, "Timeout must be greater than 0"},
		{"over max", `{"timeout":86401}`, 400, "Timeout cannot be greater than 24 hours"},
		{"malformed", `{"timeout":`, 400, "malformed JSON body: unexpected end of JSON input..."},
		{"wrong type", `{"timeout":"1"}`, 400, `malformed JSON body: field "timeout" must be an integer, got string`},
	}
	for _, tt := range errs {
		for _, path := range []string{"/sandboxes/abc/connect", "/v2/sandboxes/abc/connect"} {
			t.Run(tt.name+" "+path, func(t *testing.T) {
				h, m := newTestHandler(t)
				m.add(sandbox.Info{ID: "abc"})
				checkError(t, request(t, h, "POST", path, tt.body), tt.status, tt.msg)
			})
		}
	}
}

func TestResume(t *testing.T) {
	h, m := newTestHandler(t)
	m.add(sandbox.Info{ID: "paused1", State: sandbox.StatePaused})
	m.add(sandbox.Info{ID: "running1"})

	rec := request(t, h, "POST", "/sandboxes/paused1/resume", "")
	if rec.Code != 201 {
		t.Fatalf("resume paused: status %d: %s", rec.Code, rec.Body)
	}
	if m.lastConnect != 15*time.Second {
		t.Errorf("resume default timeout = %v, want 15s (ResumedSandbox schema default)", m.lastConnect)
	}
	wantKeys(t, decodeObject(t, rec), "sandboxID", "templateID", "clientID", "envdVersion")

	if rec := request(t, h, "POST", "/sandboxes/running1/resume", `{"timeout":30,"autoPause":false}`); rec.Code != 409 {
		t.Fatalf("resume running: status %d", rec.Code)
	}
	checkError(t, request(t, h, "POST", "/sandboxes/running1/resume", `{"timeout":30}`), 409, `sandbox "running1" is already running`)
	checkError(t, request(t, h, "POST", "/sandboxes/paused1/resume", `{"timeout":0}`), 400, "Timeout must be greater than 0")
}

func TestSetTimeout(t *testing.T) {
	tests := []struct {
		name   string
		body   string
		status int
		msg    string
		want   time.Duration
	}{
		{"seconds", `{"timeout":30}`, 204, "", 30 * time.Second},
		{"zero ends now", `{"timeout":0}`, 204, "", 0},
		{"max", `{"timeout":86400}`, 204, "", 24 * time.Hour},
		{"negative", `{"timeout":-1}`, 400, "Timeout must be greater than 0", 0},
		{"over max", `{"timeout":86401}`, 400, "Timeout cannot be greater than 24 hours", 0},
		{"missing", `{}`, 400, "timeout is required", 0},
		{"empty body", ``, 400, "timeout is required", 0},
		{"malformed", `{"timeout":}`, 400, "malformed JSON body: invalid character '}' looking for beginning of value (at byte 12)", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, m := newTestHandler(t)
			m.add(sandbox.Info{ID: "abc"})
			rec := request(t, h, "POST", "/sandboxes/abc/timeout", tt.body)
			if tt.status != 204 {
				checkError(t, rec, tt.status, tt.msg)
				if m.lastTimeout != nil {
					t.Error("manager called despite a bad request")
				}
				return
			}
			if rec.Code != 204 {
				t.Fatalf("status %d: %s", rec.Code, rec.Body)
			}
			if m.lastTimeout == nil || *m.lastTimeout != tt.want {
				t.Errorf("SetTimeout(%v), want %v", m.lastTimeout, tt.want)
			}
		})
	}
}

func TestRefresh(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		endIn   time.Duration
		state   sandbox.State
		status  int
		msg     string
		wantSet *time.Duration
	}{
		{"default extends to 60s", ``, 10 * time.Second, sandbox.StateRunning, 204, "", durp(60 * time.Second)},
		{"duration", `{"duration":600}`, time.Minute, sandbox.StateRunning, 204, "", durp(10 * time.Minute)},
		{"never shortens", `{"duration":30}`, time.Hour, sandbox.StateRunning, 204, "", nil},
		{"over schema max", `{"duration":3601}`, time.Minute, sandbox.StateRunning, 400, "duration must be between 0 and 3600 seconds", nil},
		{"negative", `{"duration":-1}`, time.Minute, sandbox.StateRunning, 400, "duration must be between 0 and 3600 seconds", nil},
		{"paused", `{}`, time.Minute, sandbox.StatePaused, 409, `sandbox "abc" is paused; connect to resume it`, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, m := newTestHandler(t)
			m.add(sandbox.Info{ID: "abc", State: tt.state, EndAt: time.Now().Add(tt.endIn)})
			rec := request(t, h, "POST", "/sandboxes/abc/refreshes", tt.body)
			if tt.status != 204 {
				checkError(t, rec, tt.status, tt.msg)
			} else if rec.Code != 204 {
				t.Fatalf("status %d: %s", rec.Code, rec.Body)
			}
			switch {
			case tt.wantSet == nil && m.lastTimeout != nil:
				t.Errorf("SetTimeout(%v) called, want no call", *m.lastTimeout)
			case tt.wantSet != nil && (m.lastTimeout == nil || *m.lastTimeout != *tt.wantSet):
				t.Errorf("SetTimeout(%v), want %v", m.lastTimeout, *tt.wantSet)
			}
		})
	}
}

func durp(d time.Duration) *time.Duration { return &d }

func TestPause(t *testing.T) {
	for _, tt := range []struct {
		body string
		drop bool
	}{
		{"", false},
		{"{}", false},
		{`{"memory":null}`, false},
		{`{"memory":true}`, false},
		{`{"memory":false}`, true},
	} {
		h, m := newTestHandler(t)
		m.add(sandbox.Info{ID: "abc"})
		if rec := request(t, h, "POST", "/sandboxes/abc/pause", tt.body); rec.Code != 204 || rec.Body.Len() != 0 {
			t.Fatalf("pause %q: status %d: %s", tt.body, rec.Code, rec.Body)
		}
		if m.lastPause == nil || m.lastPause.DropMemory != tt.drop {
			t.Errorf("pause %q: manager got %+v, want DropMemory %v", tt.body, m.lastPause, tt.drop)
		}
	}

	h, m := newTestHandler(t)
	m.add(sandbox.Info{ID: "abc", State: sandbox.StatePaused})
	// The JS SDK's pause() returns false on code 409.
	checkError(t, request(t, h, "POST", "/sandboxes/abc/pause", `{}`), 409, "pause sandbox: sandbox abc is already paused: conflict")
	checkError(t, request(t, h, "POST", "/sandboxes/nosuch/pause", `{"memory":false}`), 404, `sandbox "nosuch" not found`)
	m.lastPause = nil
	checkError(t, request(t, h, "POST", "/sandboxes/abc/pause", `{"memory":"no"}`), 400, `malformed JSON body: field "memory" must be a boolean, got string`)
	if m.lastPause != nil {
		t.Error("manager called despite a malformed body")
	}
}

func TestMetrics(t *testing.T) {
	h, m := newTestHandler(t)
	m.add(sandbox.Info{ID: "abc"})
	m.add(sandbox.Info{ID: "quiet"})
	for i := range 3 {
		m.metrics["abc"] = append(m.metrics["abc"], sandbox.Metric{
			Time: time.Unix(1700000000+int64(i)*5, 0), CPUCount: 2, CPUUsedPct: 12.5,
			MemUsed: 100 << 20, MemTotal: 512 << 20, MemCache: 1 << 20, DiskUsed: 1 << 30, DiskTotal: 2 << 30,
		})
	}

	rec := request(t, h, "GET", "/sandboxes/abc/metrics", "")
	if rec.Code != 200 {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	var got []map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("got %d samples, want all 3 retained: %s", len(got), rec.Body)
	}
	if !m.lastMetricsWindow[0].IsZero() {
		t.Errorf("default start = %v, want the zero time (all retained samples)", m.lastMetricsWindow[0])
	}
	want := map[string]any{
		"timestamp": "2023-11-14T22:13:20Z", "timestampUnix": 1700000000.0, "cpuCount": 2.0, "cpuUsedPct": 12.5,
		"memUsed": float64(100 << 20), "memTotal": float64(512 << 20), "memCache": float64(1 << 20),
		"diskUsed": float64(1 << 30), "diskTotal": float64(2 << 30),
	}
	for k, v := range want {
		if got[0][k] != v {
			t.Errorf("%s = %#v, want %#v", k, got[0][k], v)
		}
	}

	rec = request(t, h, "GET", "/sandboxes/abc/metrics?start=1700000005&end=1700000009", "")
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || len(got) != 1 {
		t.Errorf("windowed metrics: %v %s", err, rec.Body)
	}
	if w := m.lastMetricsWindow; w[0].Unix() != 1700000005 || w[1].Unix() != 1700000009 {
		t.Errorf("window = %v, want [1700000005, 1700000009]", w)
	}

	if rec := request(t, h, "GET", "/sandboxes/quiet/metrics", ""); rec.Body.String() != "[]\n" {
		t.Errorf("no samples: body %q, want []", rec.Body)
	}

	checkError(t, request(t, h, "GET", "/sandboxes/abc/metrics?start=yesterday", ""), 400, `start must be a unix timestamp in seconds, got "yesterday"`)
	checkError(t, request(t, h, "GET", "/sandboxes/abc/metrics?end=1.5", ""), 400, `end must be a unix timestamp in seconds, got "1.5"`)
	checkError(t, request(t, h, "GET", "/sandboxes/abc/metrics?start=20&end=10", ""), 400, "end (10) is before start (20)")
}

func TestUpdateNetwork(t *testing.T) {
	h, m := newTestHandler(t)
	m.add(sandbox.Info{ID: "abc"})
	ok := []string{
		``,
		`{}`,
		`{"allowOut":["1.1.1.1","10.0.0.0/8","example.com","*.example.org"],"denyOut":["0.0.0.0/0"]}`,
		`{"allow_internet_access":false,"egressProxy":null,"rules":{"api.example.com":[{"transform":{"headers":{"X":"y"}}}]}}`,
		`{"egressProxy":{"address":"proxy:3128","username":"u","password":"p"}}`,
	}
	for _, body := range ok {
		if rec := request(t, h, "PUT", "/sandboxes/abc/network", body); rec.Code != 204 {
			t.Errorf("body %s: status %d: %s", body, rec.Code, rec.Body)
		}
	}
	checkError(t, request(t, h, "PUT", "/sandboxes/abc/network", `{"denyOut":["evil.com"]}`), 400, `network: denyOut entry "evil.com" is not an IP address or CIDR`)
	checkError(t, request(t, h, "PUT", "/sandboxes/abc/network", `{"allowOut":"1.1.1.1"}`), 400, `malformed JSON body: field "allowOut" must be an array, got string`)
	checkError(t, request(t, h, "PUT", "/sandboxes/abc/network", `{"rules":{"bad domain":[]}}`), 400, `network: rules key "bad domain" is not a domain, IP address or CIDR`)
}

func TestRecoverWritesJSON(t *testing.T) {
	h, _ := newTestHandler(t)
	checkError(t, request(t, h, "GET", "/sandboxes/"+idPanic, ""), 500, "internal error: fake manager panicked on purpose")
	checkError(t, request(t, h, "POST", "/v2/sandboxes", `{"templateID":"panicky"}`), 500, "internal error: fake manager panicked on purpose")
}

// TestCreateWhileTemplateBuilds: a template still being built answers 503 in
// E2B's error shape, with the template's own message and a Retry-After in whole
// seconds (rounded up), on both create paths.
func TestCreateWhileTemplateBuilds(t *testing.T) {
	h, _ := newTestHandler(t)
	for _, path := range []string{"/sandboxes", "/v2/sandboxes"} {
		rec := request(t, h, "POST", path, `{"templateID":"`+idBuilding+`"}`)
		checkError(t, rec, 503, "template python3 is still being built: step 1/1: RUN apt-get install (for 0:42)")
		if got := rec.Header().Get("Retry-After"); got != "5" {
			t.Errorf("%s: Retry-After = %q, want 5", path, got)
		}
	}
}

func TestManagerErrorMapping(t *testing.T) {
	tests := []struct {
		err         error
		id, tpl     string
		status      int
		msg         string
		errIsTarget error
	}{
		{fmt.Errorf("x: %w", sandbox.ErrNotFound), "abc", "", 404, `sandbox "abc" not found`, sandbox.ErrNotFound},
		{fmt.Errorf("x: %w", sandbox.ErrNotFound), "", "", 404, "x: sandbox not found", sandbox.ErrNotFound},
		{fmt.Errorf("x: %w", sandbox.ErrTemplateNotFound), "abc", "py", 404, `template "py" not found`, sandbox.ErrTemplateNotFound},
		{fmt.Errorf("x: %w", sandbox.ErrTemplateNotFound), "abc", "", 404, "x: template not found", sandbox.ErrTemplateNotFound},
		{fmt.Errorf("x: %w", sandbox.ErrInvalid), "abc", "", 400, "x: invalid request", sandbox.ErrInvalid},
		{fmt.Errorf("x: %w", sandbox.ErrConflict), "abc", "", 409, "x: conflict", sandbox.ErrConflict},
		{fmt.Errorf("x: %w", sandbox.ErrLimit), "", "base", 429, "x: limit reached", sandbox.ErrLimit},
		{fmt.Errorf("x: %w", sandbox.ErrStorageLimit), "abc", "", 507, "x: limit reached (storage)", sandbox.ErrLimit},
		{fmt.Errorf("x: %w", context.Canceled), "abc", "", 499, "request cancelled", context.Canceled},
		{fmt.Errorf("x: %w", context.DeadlineExceeded), "abc", "", 504, "x: context deadline exceeded", context.DeadlineExceeded},
		{errors.New("boom"), "abc", "", 500, "boom", nil},
		{badRequest("already mapped"), "abc", "", 400, "already mapped", nil},
	}
	for _, tt := range tests {
		ae := managerError(tt.err, tt.id, tt.tpl)
		if ae.status != tt.status || ae.message != tt.msg {
			t.Errorf("managerError(%v) = %d %q, want %d %q", tt.err, ae.status, ae.message, tt.status, tt.msg)
		}
		if tt.errIsTarget != nil && !errors.Is(ae, tt.errIsTarget) {
			t.Errorf("managerError(%v) does not wrap %v", tt.err, tt.errIsTarget)
		}
		if !strings.Contains(ae.Error(), tt.msg) {
			t.Errorf("Error() = %q lacks the message", ae.Error())
		}
	}
}

func TestLogsEndpoints(t *testing.T) {
	h, f := newTestHandler(t)
	f.add(sandbox.Info{ID: "sbx1", TemplateID: "base", State: sandbox.StateRunning})
	t0 := time.UnixMilli(1700000000000)
	f.logs = map[string][]sandbox.LogEntry{"sbx1": {
		{Time: t0, Level: "info", Logger: "envd.process", Origin: "sandbox", Message: "process 7 started: false", Fields: map[string]string{"pid": "7"}},
		{Time: t0.Add(time.Second), Level: "warn", Logger: "envd.process", Origin: "sandbox", Message: "process 7 exited with code 1", Fields: map[string]string{"pid": "7", "exitCode": "1"}},
		{Time: t0.Add(2 * time.Second), Level: "error", Logger: "airlock.oom", Origin: "host", Message: "out of memory: 2", Fields: map[string]string{"killed": "2"}},
	}}

	// v1, as the CLI reads it: each line is a JSON object with level and logger.
	var v1 struct {
		Logs []struct {
			Timestamp time.Time
			Line      string
		}
		LogEntries []struct {
			Level, Message string
			Fields         map[string]string
		}
	}
	rec := request(t, h, "GET", "/sandboxes/sbx1/logs?start=1700000000500", "")
	if rec.Code != http.StatusOK {
		t.Fatalf("v1 logs: %d %s", rec.Code, rec.Body)
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &v1); err != nil {
		t.Fatal(err)
	}
	if len(v1.Logs) != 2 || len(v1.LogEntries) != 2 {
		t.Fatalf("v1 logs from start: %+v", v1)
	}
	var line map[string]string
	if err := json.Unmarshal([]byte(v1.Logs[0].Line), &line); err != nil {
		t.Fatalf("v1 line is not a JSON object: %q", v1.Logs[0].Line)
	}
	if line["level"] != "warn" || line["logger"] != "envd.process" || line["message"] != "process 7 exited with code 1" || line["exitCode"] != "1" || line["origin"] != "sandbox" {
		t.Fatalf("v1 line: %v", line)
	}
	if e := v1.LogEntries[1]; e.Level != "error" || e.Fields["logger"] != "airlock.oom" || e.Fields["origin"] != "host" || e.Fields["killed"] != "2" {
		t.Fatalf("v1 logEntries: %+v", v1.LogEntries)
	}

	v2 := func(query string) []string {
		t.Helper()
		var body struct {
			Logs []struct {
				Timestamp      time.Time
				Message, Level string
				Fields         map[string]string
			}
		}
		rec := request(t, h, "GET", "/v2/sandboxes/sbx1/logs"+query, "")
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || rec.Code != http.StatusOK {
			t.Fatalf("v2 logs%s: %d %s %v", query, rec.Code, rec.Body, err)
		}
		var out []string
		for _, l := range body.Logs {
			out = append(out, l.Level+":"+l.Message)
		}
		return out
	}
	for _, c := range []struct {
		query string
		want  []string
	}{
		{"", []string{"info:process 7 started: false", "warn:process 7 exited with code 1", "error:out of memory: 2"}},
		{"?level=warn", []string{"warn:process 7 exited with code 1", "error:out of memory: 2"}},
		{"?level=ERROR", []string{"error:out of memory: 2"}},
		{"?search=process%207", []string{"info:process 7 started: false", "warn:process 7 exited with code 1"}},
		{"?search=Process", nil}, // case-sensitive, as upstream documents
		{"?direction=backward&limit=1", []string{"error:out of memory: 2"}},
		{"?direction=backward&cursor=1700000001000", []string{"warn:process 7 exited with code 1", "info:process 7 started: false"}},
		{"?cursor=1700000001000&limit=1", []string{"warn:process 7 exited with code 1"}},
		{"?cursor=1700000001001", []string{"error:out of memory: 2"}},
		{"?limit=0", nil},
	} {
		if got := v2(c.query); strings.Join(got, "|") != strings.Join(c.want, "|") {
			t.Errorf("v2 logs%s = %q, want %q", c.query, got, c.want)
		}
	}
	if q := f.lastLogQuery; q.Limit != 0 || q.Owner == "" {
		t.Errorf("the manager was asked %+v: want the caller's owner", q)
	}

	checkError(t, request(t, h, "GET", "/v2/sandboxes/sbx1/logs?limit=x", ""), http.StatusBadRequest, `limit must be an integer in [0, 1000], got "x"`)
	checkError(t, request(t, h, "GET", "/v2/sandboxes/sbx1/logs?limit=1001", ""), http.StatusBadRequest, `limit must be an integer in [0, 1000], got "1001"`)
	checkError(t, request(t, h, "GET", "/v2/sandboxes/sbx1/logs?cursor=-1", ""), http.StatusBadRequest, `cursor must be unix milliseconds, got "-1"`)
	checkError(t, request(t, h, "GET", "/v2/sandboxes/sbx1/logs?direction=up", ""), http.StatusBadRequest, `direction must be forward or backward, got "up"`)
	checkError(t, request(t, h, "GET", "/v2/sandboxes/sbx1/logs?level=fatal", ""), http.StatusBadRequest, `level must be one of debug, info, warn, error, got "fatal"`)
	checkError(t, request(t, h, "GET", "/v2/sandboxes/sbx1/logs?search="+strings.Repeat("a", 257), ""), http.StatusBadRequest, "search must be at most 256 characters, got 257")
	checkError(t, request(t, h, "GET", "/sandboxes/sbx1/logs?start=soon", ""), http.StatusBadRequest, `start must be unix milliseconds, got "soon"`)
	if rec := request(t, h, "GET", "/v2/sandboxes/nope/logs", ""); rec.Code != http.StatusNotFound {
		t.Errorf("unknown sandbox: %d", rec.Code)
	}
}

func TestCreateDiskSize(t *testing.T) {
	h, f := newTestHandler(t)
	checkError(t, request(t, h, "POST", "/sandboxes", `{"templateID":"base","diskSizeMB":0}`), http.StatusBadRequest, "diskSizeMB must be positive, got 0")
	rec := request(t, h, "POST", "/sandboxes", `{"templateID":"base","diskSizeMB":2048}`)
	if rec.Code != http.StatusCreated {
		t.Fatalf("create: %d %s", rec.Code, rec.Body)
	}
	if f.lastCreate.DiskSizeMB != 2048 {
		t.Errorf("manager got diskSizeMB %d", f.lastCreate.DiskSizeMB)
	}
}

func TestNetworkConfigReachesManager(t *testing.T) {
	h, m := newTestHandler(t)
	rec := request(t, h, "POST", "/v2/sandboxes", `{"templateID":"base","network":{"allowOut":["example.com","1.2.3.4"],"denyOut":["0.0.0.0/0"],"allowPublicTraffic":false}}`)
	if rec.Code != 201 {
		t.Fatalf("create: %d %s", rec.Code, rec.Body)
	}
	var created map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &created); err != nil {
		t.Fatal(err)
	}
	id, _ := created["sandboxID"].(string)
	if tok, _ := created["trafficAccessToken"].(string); tok != "traffic-"+id {
		t.Errorf("trafficAccessToken = %v", created["trafficAccessToken"])
	}
	n := m.lastCreate.Network
	if n == nil || len(n.AllowOut) != 2 || len(n.DenyOut) != 1 || n.AllowPublicTraffic == nil || *n.AllowPublicTraffic {
		t.Fatalf("manager got network %+v", n)
	}
	if rec := request(t, h, "PUT", "/sandboxes/"+id+"/network", `{"denyOut":["10.0.0.0/8"],"allow_internet_access":true}`); rec.Code != 204 {
		t.Fatalf("update: %d %s", rec.Code, rec.Body)
	}
	rec = request(t, h, "GET", "/sandboxes/"+id, "")
	var detail struct {
		AllowInternetAccess *bool `json:"allowInternetAccess"`
		Network             struct {
			AllowOut           []string `json:"allowOut"`
			DenyOut            []string `json:"denyOut"`
			AllowPublicTraffic *bool    `json:"allowPublicTraffic"`
		} `json:"network"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &detail); err != nil {
		t.Fatal(err)
	}
	if detail.AllowInternetAccess == nil || !*detail.AllowInternetAccess || len(detail.Network.AllowOut) != 0 ||
		len(detail.Network.DenyOut) != 1 || detail.Network.AllowPublicTraffic == nil {
		t.Errorf("detail after update: %s", rec.Body)
	}
}
