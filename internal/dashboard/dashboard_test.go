package dashboard

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/apikey"
	"github.com/airlock-sandbox/airlock/internal/e2bclient"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/template"
	"github.com/airlock-sandbox/airlock/internal/tplbuild"
)

// noSandboxes is a manager with none: these tests need no root and no
// sandbox (internal/daemon's TestDashboard drives real ones).
type noSandboxes struct{}

func (noSandboxes) List(context.Context, sandbox.ListFilter) ([]sandbox.Info, error) { return nil, nil }
func (noSandboxes) Get(context.Context, string) (sandbox.Info, error) {
	return sandbox.Info{}, sandbox.ErrNotFound
}
func (noSandboxes) Metrics(context.Context, string, time.Time, time.Time) ([]sandbox.Metric, error) {
	return nil, nil
}

// identify knows the keys given, each its own team "owner-<key>" with every
// scope.
func identify(keys ...string) func(string) (apikey.Principal, error) {
	return func(k string) (apikey.Principal, error) {
		if !slices.Contains(keys, k) {
			return apikey.Principal{}, apikey.ErrNotFound
		}
		return apikey.Principal{KeyID: k, KeyName: k, Team: "owner-" + k, Scopes: apikey.All}, nil
	}
}

func newTest(t *testing.T, now func() time.Time) *Dashboard {
	t.Helper()
	d, err := New(Options{
		Identify:  identify("e2b_good_key_0001"),
		API:       http.NotFoundHandler(),
		Sandboxes: noSandboxes{},
		Envd:      func(string) *e2bclient.Client { return nil },
		Now:       now,
	})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func serve(d http.Handler, method, target, body string, hdr map[string]string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	d.ServeHTTP(w, r)
	return w
}

// The app is served for any path under the prefix (it routes on the
// client), never for the API's, and with headers that keep it from being
// framed or sniffed.
func TestStatic(t *testing.T) {
	d := newTest(t, nil)
	for _, p := range []string{"/dashboard/", "/dashboard/sandboxes/abc", "/dashboard/index.html"} {
		w := serve(d, http.MethodGet, p, "", nil)
		if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), "<") || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/html") {
			t.Errorf("GET %s = %d %q", p, w.Code, w.Header().Get("Content-Type"))
		}
		if w.Header().Get("X-Frame-Options") != "DENY" || !strings.Contains(w.Header().Get("Content-Security-Policy"), "frame-ancestors 'none'") {
			t.Errorf("GET %s: framing allowed: %v", p, w.Header())
		}
	}
	if w := serve(d, http.MethodGet, "/dashboard", "", nil); w.Code != http.StatusFound || w.Header().Get("Location") != Prefix {
		t.Errorf("GET /dashboard = %d to %q", w.Code, w.Header().Get("Location"))
	}
	if w := serve(d, http.MethodPost, "/dashboard/", "", nil); w.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST /dashboard/ = %d", w.Code)
	}
	if w := serve(d, http.MethodGet, "/dashboard/api/nothing", "", nil); w.Code != http.StatusNotFound || !strings.Contains(w.Body.String(), `"code":404`) {
		t.Errorf("unknown API route = %d %s", w.Code, w.Body)
	}

	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })
	root := RedirectRoot(api)
	if w := serve(root, http.MethodGet, "/", "", map[string]string{"Accept": "text/html,application/xhtml+xml"}); w.Code != http.StatusFound {
		t.Errorf("a browser at / = %d, want a redirect", w.Code)
	}
	for _, c := range []struct{ method, path, accept string }{
		{http.MethodGet, "/", "application/json"}, {http.MethodGet, "/sandboxes", "text/html"}, {http.MethodPost, "/", "text/html"},
	} {
		if w := serve(root, c.method, c.path, "", map[string]string{"Accept": c.accept}); w.Code != http.StatusTeapot {
			t.Errorf("%s %s (Accept %s) = %d, want the API's answer", c.method, c.path, c.accept, w.Code)
		}
	}
}

// A session ends after a while without requests, and after its maximum
// age whatever it does; sign-out ends it at once.
func TestSessionLifetime(t *testing.T) {
	now := time.Date(2026, 11, 28, 8, 0, 0, 0, time.UTC)
	d := newTest(t, func() time.Time { return now })
	signIn := func() (cookie, csrf string) {
		w := serve(d, http.MethodPost, "/dashboard/api/session", `{"apiKey":"e2b_good_key_0001"}`, nil)
		if w.Code != http.StatusOK {
			t.Fatalf("sign-in = %d %s", w.Code, w.Body)
		}
		c := w.Result().Cookies()[0]
		if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Secure {
			t.Errorf("cookie over plain HTTP: %+v", c)
		}
		return c.Name + "=" + c.Value, strings.Split(strings.Split(w.Body.String(), `"csrfToken":"`)[1], `"`)[0]
	}
	alive := func(cookie string) bool {
		return serve(d, http.MethodGet, "/dashboard/api/session", "", map[string]string{"Cookie": cookie}).Code == http.StatusOK
	}

	c, _ := signIn()
	now = now.Add(sessionIdle - time.Minute)
	if !alive(c) {
		t.Fatal("session ended before its idle time")
	}
	now = now.Add(sessionIdle + time.Minute)
	if alive(c) {
		t.Fatal("session outlived its idle time")
	}

	c, _ = signIn()
	for end := now.Add(sessionMax); now.Before(end); now = now.Add(sessionIdle / 2) {
		if !alive(c) {
			t.Fatalf("busy session ended early, at %v", now)
		}
	}
	now = now.Add(time.Minute)
	if alive(c) {
		t.Fatal("busy session outlived its maximum age")
	}

	c, csrf := signIn()
	if w := serve(d, http.MethodDelete, "/dashboard/api/session", "", map[string]string{"Cookie": c}); w.Code != http.StatusForbidden {
		t.Errorf("sign-out without CSRF = %d", w.Code)
	}
	if w := serve(d, http.MethodDelete, "/dashboard/api/session", "", map[string]string{"Cookie": c, csrfHeader: csrf}); w.Code != http.StatusNoContent {
		t.Errorf("sign-out = %d %s", w.Code, w.Body)
	}
	if alive(c) {
		t.Error("session alive after sign-out")
	}
	if w := serve(d, http.MethodPost, "/dashboard/api/session", `{"apiKey":"e2b_good_key_0001"}`, map[string]string{"Origin": "http://evil.example"}); w.Code != http.StatusForbidden {
		t.Errorf("sign-in posted from another origin = %d", w.Code)
	}
	if w := serve(d, http.MethodPost, "/dashboard/api/session", `not json`, nil); w.Code != http.StatusBadRequest {
		t.Errorf("sign-in with a bad body = %d", w.Code)
	}
}

func TestHelpers(t *testing.T) {
	if got := keyHint("e2b_0123456789abcdef"); got != "e2b_…cdef" {
		t.Errorf("keyHint = %q", got)
	}
	if got := keyHint("short"); got != "…" {
		t.Errorf("keyHint of a short key = %q", got)
	}
	md, err := parseMetadata("a=1, b=two&c=")
	if err != nil || len(md) != 3 || md["a"] != "1" || md["b"] != "two" || md["c"] != "" {
		t.Errorf("parseMetadata = %v, %v", md, err)
	}
	if _, err := parseMetadata("novalue"); err == nil {
		t.Error("parseMetadata accepted a pair without =")
	}
}

type fakeTemplates []template.Template

func (f fakeTemplates) List() ([]template.Template, error) { return f, nil }
func (f fakeTemplates) Builds(id string) ([]template.Template, error) {
	for _, t := range f {
		if t.ID == id && t.Ready {
			return []template.Template{t}, nil
		}
	}
	return nil, nil
}

type fakeRecords []tplbuild.BuildInfo

func (f fakeRecords) Builds(id string) ([]tplbuild.BuildInfo, error) {
	var out []tplbuild.BuildInfo
	for _, r := range f {
		if r.TemplateID == id {
			out = append(out, r)
		}
	}
	return out, nil
}

// OwnedBy: every record here is owner-k1's.
func (f fakeRecords) OwnedBy(owner string) ([]tplbuild.BuildInfo, error) {
	if owner != "owner-k1" {
		return nil, nil
	}
	return f, nil
}

// The templates page lists what the key may use, with size, layers and
// builds, and a template of the key's whose first build is under way; not
// another key's private template.
func TestListTemplates(t *testing.T) {
	at := time.Date(2026, 11, 28, 8, 0, 0, 0, time.UTC)
	d, err := New(Options{
		Identify: identify("k1"),
		API:      http.NotFoundHandler(), Sandboxes: noSandboxes{},
		Envd: func(string) *e2bclient.Client { return nil },
		Templates: fakeTemplates{
			{ID: "base", Builtin: true, Ready: true, SizeBytes: 300 << 20, Layers: make([]template.Layer, 5), BuildID: "b1", BuiltAt: at},
			{ID: "theirs", Ready: true, BuildID: "b2", BuiltAt: at, Access: template.Access{Owner: "owner-k2"}},
			{ID: "shared", Ready: true, BuildID: "b3", BuiltAt: at, Access: template.Access{Owner: "owner-k2", Public: true}},
		},
		Builds: fakeRecords{
			{TemplateID: "fresh", BuildID: "b4", Status: tplbuild.StatusBuilding, CreatedAt: at},
			{TemplateID: "fresh", BuildID: "b0", Status: tplbuild.StatusError, CreatedAt: at.Add(-time.Hour), FinishedAt: at.Add(-time.Hour)},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	w := serve(d, http.MethodPost, "/dashboard/api/session", `{"apiKey":"k1"}`, nil)
	cookie := w.Result().Cookies()[0]
	w = serve(d, http.MethodGet, "/dashboard/api/templates", "", map[string]string{"Cookie": cookie.Name + "=" + cookie.Value})
	var got struct{ Templates []templateJSON }
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil || w.Code != http.StatusOK {
		t.Fatalf("templates = %d %s (%v)", w.Code, w.Body, err)
	}
	byID := map[string]templateJSON{}
	for _, tj := range got.Templates {
		byID[tj.TemplateID] = tj
	}
	if _, ok := byID["theirs"]; ok || len(byID) != 3 {
		t.Fatalf("templates listed: %v; want base, shared, fresh", got.Templates)
	}
	if b := byID["base"]; !b.Ready || b.Layers != 5 || b.SizeBytes != 300<<20 || len(b.Builds) != 1 || b.Builds[0].BuildID != "b1" {
		t.Errorf("base = %+v", b)
	}
	f := byID["fresh"]
	if f.Ready || !f.Mine || len(f.Builds) != 2 || f.Builds[0].BuildID != "b4" || f.Builds[0].Status != tplbuild.StatusBuilding || f.Builds[1].FinishedAt == nil {
		t.Errorf("fresh (first build under way) = %+v", f)
	}
}
