package proxy_test

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/apikey"
	"github.com/airlock-sandbox/airlock/internal/envdapi"
	"github.com/airlock-sandbox/airlock/internal/grant"
	"github.com/airlock-sandbox/airlock/internal/grant/granttest"
	"github.com/airlock-sandbox/airlock/internal/proxy"
)

// grantSandboxes are two running sandboxes of team "a" and one of team
// "b", each with its own token, all served by one fake envd that reports
// the token and signature it received.
type grantSandboxes struct{ tr http.RoundTripper }

var grantBoxes = map[string]struct{ token, owner string }{
	"sba1": {"secret-a1", "a"}, "sba2": {"secret-a2", "a"}, "sbb1": {"secret-b1", "b"},
}

func (g grantSandboxes) EnvdTransport(id string) (http.RoundTripper, error) {
	if _, ok := grantBoxes[id]; !ok {
		return nil, errors.New("no such sandbox")
	}
	return g.tr, nil
}
func (g grantSandboxes) InterpTransport(id string) (http.RoundTripper, error) {
	return g.EnvdTransport(id)
}
func (grantSandboxes) MatchToken(accept func(token, owner string) bool) []string {
	var ids []string
	for id, b := range grantBoxes {
		if accept(b.token, b.owner) {
			ids = append(ids, id)
		}
	}
	return ids
}
func (grantSandboxes) Access(id string) (string, string, error) {
	b, ok := grantBoxes[id]
	if !ok {
		return "", "", errors.New("no such sandbox")
	}
	return b.token, b.owner, nil
}
func (grantSandboxes) UserPortTarget(id string) (netip.Addr, string, string, error) {
	if _, ok := grantBoxes[id]; !ok {
		return netip.Addr{}, "", "", errors.New("no such sandbox")
	}
	return netip.Addr{}, "", "", nil
}

// testKeys: team a has a full key and a read-only one, team b a full key;
// "gone" was team a's and is revoked.
var testKeys = granttest.Keys{Live: map[string]apikey.Principal{
	"ka": {KeyID: "ka", KeyName: "a-full", Team: "a", Scopes: apikey.All},
	"kr": {KeyID: "kr", KeyName: "a-reader", Team: "a", Scopes: []apikey.Scope{apikey.SandboxesRead}},
	"kb": {KeyID: "kb", KeyName: "b-full", Team: "b", Scopes: apikey.All},
}, Revoked: map[string]apikey.Principal{"gone": {KeyID: "gone", Team: "a"}}}

// echoEnvd answers with what reached it.
func echoEnvd(t *testing.T) http.RoundTripper {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]string{
			"token": r.Header.Get("X-Access-Token"), "signature": r.URL.Query().Get("signature"),
			"path": r.URL.Path,
		})
	}))
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return rewriteHost{host: u.Host, tr: tr}
}

type rewriteHost struct {
	host string
	tr   http.RoundTripper
}

func (h rewriteHost) RoundTrip(r *http.Request) (*http.Response, error) {
	r.URL.Host = h.host
	return h.tr.RoundTrip(r)
}

type reply struct {
	status int
	body   string
	echo   map[string]string
}

func send(t *testing.T, h http.Handler, r *http.Request) reply {
	t.Helper()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	out := reply{status: w.Code, body: w.Body.String()}
	_ = json.Unmarshal(w.Body.Bytes(), &out.echo)
	return out
}

func envdRequest(id, token, path string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "http://sandbox"+path, nil)
	r.Header.Set("E2b-Sandbox-Id", id)
	r.Header.Set("E2b-Sandbox-Port", "49983")
	if token != "" {
		r.Header.Set("X-Access-Token", token)
	}
	return r
}

func TestProxyGrants(t *testing.T) {
	p := proxy.New(grantSandboxes{tr: echoEnvd(t)}, nil)
	p.SetGrants(grant.Checker{Keys: testKeys})
	gone := send(t, p, envdRequest("nosuch", grant.Token("x", "ka"), "/files?path=a"))
	if gone.status != http.StatusBadGateway || !strings.Contains(gone.body, "The sandbox was not found") {
		t.Fatalf("an unknown sandbox: %d %s", gone.status, gone.body)
	}
	goneA1 := strings.ReplaceAll(gone.body, "nosuch", "sba1") // the same answer, for this id
	for _, c := range []struct {
		name, id, token, path string
		status                int
		want                  string // in the body
	}{
		{"the key's grant reaches envd with the sandbox's token", "sba1", grant.Token("secret-a1", "ka"), "/files?path=a", 200, `"token":"secret-a1"`},
		{"no token goes on for envd to refuse", "sba1", "", "/files?path=a", 200, `"token":""`},
		{"the sandbox's own token is not taken", "sba1", "secret-a1", "/files?path=a", 401, "unauthorized access"},
		{"junk", "sba1", "e2b-random-thing", "/files?path=a", 401, "unauthorized access"},
		{"another sandbox's grant of the same team", "sba1", grant.Token("secret-a2", "ka"), "/files?path=a", 401, "unauthorized access"},
		{"a forged grant naming a live key", "sba1", "ak1.ka.AAAA", "/files?path=a", 401, "unauthorized access"},
		{"a revoked key's grant", "sba1", grant.Token("secret-a1", "gone"), "/files?path=a", 401, "was revoked"},
		{"a read-only key's grant", "sba1", grant.Token("secret-a1", "kr"), "/files?path=a", 403, "lacks the scope sandboxes:write"},
		{"another team's grant is a sandbox that does not exist", "sba1", grant.Token("secret-b1", "kb"), "/files?path=a", 502, goneA1},
		{"even when forged for this sandbox", "sba1", grant.Token("secret-a1", "kb"), "/files?path=a", 502, goneA1},
		{"a unary RPC is refused as Connect", "sba1", "junk", "/filesystem.Filesystem/Stat", 401, `"code":"unauthenticated"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := send(t, p, envdRequest(c.id, c.token, c.path))
			if got.status != c.status || !strings.Contains(got.body, strings.TrimSpace(c.want)) {
				t.Fatalf("%d %s; want %d with %s", got.status, got.body, c.status, c.want)
			}
			if c.status != 200 && strings.Contains(got.body, "secret-") {
				t.Fatalf("a refusal shows a sandbox token: %s", got.body)
			}
		})
	}

	t.Run("a streaming RPC ends with a Connect error", func(t *testing.T) {
		r := envdRequest("sba1", grant.Token("secret-a1", "gone"), "/process.Process/Start")
		r.Method = http.MethodPost
		r.Header.Set("Content-Type", "application/connect+proto")
		w := httptest.NewRecorder()
		p.ServeHTTP(w, r)
		b := w.Body.Bytes()
		if w.Code != 200 || len(b) < 5 || b[0] != 2 || int(binary.BigEndian.Uint32(b[1:5])) != len(b)-5 {
			t.Fatalf("not one end-of-stream message: %d %q", w.Code, b)
		}
		var end struct {
			Error struct{ Code, Message string }
		}
		if err := json.Unmarshal(b[5:], &end); err != nil || end.Error.Code != "unauthenticated" || !strings.Contains(end.Error.Message, "revoked") {
			t.Fatalf("end-of-stream %s: %v", b[5:], err)
		}
	})

	t.Run("the interpreter port takes grants too", func(t *testing.T) {
		r := envdRequest("sba1", grant.Token("secret-a1", "ka"), "/contexts")
		r.Header.Set("E2b-Sandbox-Port", "49999")
		if got := send(t, p, r); got.status != 200 || got.echo["token"] != "secret-a1" {
			t.Fatalf("%d %s", got.status, got.body)
		}
		r = envdRequest("sba1", grant.Token("secret-b1", "kb"), "/contexts")
		r.Header.Set("E2b-Sandbox-Port", "49999")
		if got := send(t, p, r); got.status != 502 {
			t.Fatalf("another team's grant on the interpreter: %d %s", got.status, got.body)
		}
	})

	signed := func(id, token, op string) *http.Request {
		path := "/files?" + url.Values{"path": {"/home/user/f"}, "username": {"user"}, "signature_expiration": {"4102444800"},
			"signature": {envdapi.QuerySignature("/home/user/f", op, "user", token, "4102444800")}}.Encode()
		r := httptest.NewRequest(http.MethodGet, "http://127.0.0.1:3001"+path, nil)
		if id != "" {
			r.Header.Set("E2b-Sandbox-Id", id)
			r.Header.Set("E2b-Sandbox-Port", "49983")
		}
		return r
	}
	rawSig := envdapi.QuerySignature("/home/user/f", "read", "user", "secret-a1", "4102444800")
	for _, id := range []string{"sba1", ""} { // routed by header, and by the signature alone
		where := "routed by header"
		if id == "" {
			where = "header-less"
		}
		t.Run("signed URL, "+where, func(t *testing.T) {
			if got := send(t, p, signed(id, grant.Token("secret-a1", "ka"), "read")); got.status != 200 || got.echo["signature"] != rawSig {
				t.Fatalf("a grant's signature: %d %s", got.status, got.body)
			}
			bad := map[string]string{
				"the sandbox's own token": "secret-a1", "a revoked key's grant": grant.Token("secret-a1", "gone"),
				"another team's grant": grant.Token("secret-a1", "kb"),
			}
			if id != "" { // header-less, it is sba2's URL
				bad["another sandbox's grant"] = grant.Token("secret-a2", "ka")
			}
			for name, tok := range bad {
				if got := send(t, p, signed(id, tok, "read")); got.status != 401 || !strings.Contains(got.body, "invalid signature") {
					t.Fatalf("%s: %d %s", name, got.status, got.body)
				}
			}
			if got := send(t, p, signed(id, grant.Token("secret-a1", "kr"), "read")); got.status != 403 {
				t.Fatalf("a read-only key's signature: %d %s", got.status, got.body)
			}
		})
	}

	t.Run("without SetGrants tokens pass as they came", func(t *testing.T) {
		plain := proxy.New(grantSandboxes{tr: echoEnvd(t)}, nil)
		if got := send(t, plain, envdRequest("sba1", "secret-a1", "/files?path=a")); got.status != 200 || got.echo["token"] != "secret-a1" {
			t.Fatalf("%d %s", got.status, got.body)
		}
	})
}
