package e2b

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/apikey"
	"github.com/airlock-sandbox/airlock/internal/e2bwire"
	"github.com/airlock-sandbox/airlock/internal/grant"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/teamstats"
)

// keysFixture is a handler over the real key service and store: the
// bootstrap key testKey (team "default", every scope), and in team blue a
// full key, a read-only key and a revoked one; one sandbox of each team.
type keysFixture struct {
	h                        *Handler
	m                        *fakeManager
	st                       *store.SQLite
	keys                     *apikey.Service
	full, readOnly, revoked  string
	readOnlyID, blueTeam     string
	blueSandbox, homeSandbox string
}

func newKeysFixture(t *testing.T) *keysFixture {
	t.Helper()
	ctx := context.Background()
	st, err := store.OpenSQLite(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	keys, err := apikey.New(ctx, st, apikey.Options{Bootstrap: []string{testKey}, TeamOf: OwnerOf})
	if err != nil {
		t.Fatal(err)
	}
	blue, err := keys.EnsureTeam(ctx, "blue")
	if err != nil {
		t.Fatal(err)
	}
	mk := func(name string, scopes []apikey.Scope) apikey.Created {
		c, err := keys.Create(ctx, apikey.CreateRequest{TeamID: blue.ID, Name: name, Scopes: scopes})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	f := &keysFixture{st: st, keys: keys, blueTeam: blue.ID, blueSandbox: "bluesbx", homeSandbox: "homesbx"}
	f.full = mk("blue-full", nil).Key
	ro := mk("blue-reader", []apikey.Scope{apikey.SandboxesRead, apikey.TemplatesRead})
	f.readOnly, f.readOnlyID = ro.Key, ro.Record.ID
	rv := mk("blue-gone", nil)
	f.revoked = rv.Key
	if err := keys.Revoke(ctx, rv.Record.ID); err != nil {
		t.Fatal(err)
	}
	f.h, f.m = newTestHandler(t, func(o *Options) {
		o.Authenticate = nil
		o.Identify = keys.Authenticate
		o.Keys = keys
		o.Audit = st
		o.Templates = newFakeTemplates()
	})
	f.m.add(sandbox.Info{ID: f.blueSandbox, Owner: blue.ID, AccessToken: "blue-token"})
	f.m.add(sandbox.Info{ID: f.homeSandbox, Owner: OwnerOf(testKey), AccessToken: "home-token"})
	return f
}

// Every kind of caller against the routes of one sandbox of team blue, and
// the lists: the exact status for each. "other" is team default's key
// (which holds every scope, keys:admin too): blue's sandbox does not exist
// for it.
func TestKeyMatrix(t *testing.T) {
	f := newKeysFixture(t)
	callers := []struct{ name, key string }{
		{"none", ""}, {"revoked", f.revoked}, {"other team", testKey}, {"read-only", f.readOnly}, {"full", f.full},
	}
	sbx := "/sandboxes/" + f.blueSandbox
	routes := []struct {
		method, path, body string
		want               [5]int // none, revoked, other team, read-only, full
	}{
		{"GET", sbx, "", [5]int{401, 401, 404, 200, 200}},
		{"GET", sbx + "/metrics", "", [5]int{401, 401, 404, 200, 200}},
		{"POST", sbx + "/timeout", `{"timeout":60}`, [5]int{401, 401, 404, 403, 204}},
		{"POST", sbx + "/refreshes", `{"duration":60}`, [5]int{401, 401, 404, 403, 204}},
		{"PUT", sbx + "/network", `{"allowOut":["1.1.1.1"]}`, [5]int{401, 401, 404, 403, 204}},
		{"POST", sbx + "/snapshots", `{}`, [5]int{401, 401, 404, 403, 201}},
		{"POST", sbx + "/fork", `{}`, [5]int{401, 401, 404, 403, 201}},
		{"POST", sbx + "/pause", "", [5]int{401, 401, 404, 403, 204}},
		{"POST", sbx + "/connect", `{"timeout":60}`, [5]int{401, 401, 404, 403, 201}},
		{"GET", "/v2/sandboxes", "", [5]int{401, 401, 200, 200, 200}},
		{"GET", "/snapshots", "", [5]int{401, 401, 200, 200, 200}},
		{"POST", "/sandboxes", `{"templateID":"base"}`, [5]int{401, 401, 201, 403, 201}},
		{"GET", "/templates", "", [5]int{401, 401, 200, 200, 200}},
		{"GET", "/volumes", "", [5]int{401, 401, 501, 403, 501}},
		{"GET", "/secrets", "", [5]int{401, 401, 501, 403, 501}},
		{"GET", "/events/webhooks", "", [5]int{401, 401, 501, 403, 501}},
		{"GET", "/api-keys", "", [5]int{401, 401, 200, 403, 403}},
		{"PATCH", "/api-keys/" + f.readOnlyID, `{"name":"blue-reader"}`, [5]int{401, 401, 200, 403, 403}},
		{"GET", "/teams", "", [5]int{401, 401, 200, 200, 200}},
		{"GET", "/airlock/v1/audit", "", [5]int{401, 401, 200, 403, 403}},
		{"DELETE", sbx, "", [5]int{401, 401, 404, 403, 204}},
	}
	for _, rt := range routes {
		for i, c := range callers {
			rec := request(t, f.h, rt.method, rt.path, rt.body, "X-API-KEY", c.key)
			if rec.Code != rt.want[i] {
				t.Errorf("%s %s as %s = %d %.300s, want %d", rt.method, rt.path, c.name, rec.Code, rec.Body, rt.want[i])
			}
			if rec.Code >= 400 {
				var e struct{ Message string }
				if json.Unmarshal(rec.Body.Bytes(), &e); e.Message == "" {
					t.Errorf("%s %s as %s: no message in %s", rt.method, rt.path, c.name, rec.Body)
				}
			}
			if rec.Code == http.StatusNotFound && strings.Contains(rec.Body.String(), "forbidden") {
				t.Errorf("a 404 that says forbidden: %s", rec.Body)
			}
		}
		// Whatever the other team did, blue's sandbox is still there for
		// blue until blue kills it.
	}
	// The read-only key lists blue's sandbox but never its tokens; the other
	// team's list never holds blue's sandbox.
	rec := request(t, f.h, "GET", "/v2/sandboxes?state=running,paused", "", "X-API-KEY", testKey)
	if strings.Contains(rec.Body.String(), f.blueSandbox) {
		t.Errorf("team default's list holds blue's sandbox: %s", rec.Body)
	}
	f.m.add(sandbox.Info{ID: "blue2", Owner: f.blueTeam, AccessToken: "blue2-token", TrafficAccessToken: "blue2-traffic"})
	rec = request(t, f.h, "GET", "/sandboxes/blue2", "", "X-API-KEY", f.readOnly)
	if rec.Code != 200 || strings.Contains(rec.Body.String(), "blue2-token") || strings.Contains(rec.Body.String(), "blue2-traffic") {
		t.Errorf("read-only detail: %d %s", rec.Code, rec.Body)
	}
	rec = request(t, f.h, "GET", "/sandboxes/blue2", "", "X-API-KEY", f.full)
	if !strings.Contains(rec.Body.String(), "blue2-token") {
		t.Errorf("full key's detail lacks the token: %s", rec.Body)
	}
}

// Keys over the API: made by an admin (shown once, as a hash after), named
// scopes checked, unknown scopes refused, an escalation refused, a revoked
// key refused at its next request; each change and each refusal audited.
func TestKeysAPI(t *testing.T) {
	f := newKeysFixture(t)
	rec := request(t, f.h, "POST", "/api-keys", `{"name":"ci","scopes":["sandboxes:*"],"team":"green"}`)
	if rec.Code != http.StatusCreated {
		t.Fatalf("create: %d %s", rec.Code, rec.Body)
	}
	var made e2bwire.TeamAPIKey
	json.Unmarshal(rec.Body.Bytes(), &made)
	if !strings.HasPrefix(made.Key, "e2b_") || made.Mask.MaskedValueSuffix != made.Key[len(made.Key)-4:] || len(made.Scopes) != 2 {
		t.Fatalf("made %+v", made)
	}
	rec = request(t, f.h, "GET", "/api-keys?team=green", "")
	if rec.Code != 200 || strings.Contains(rec.Body.String(), made.Key) || !strings.Contains(rec.Body.String(), made.ID) {
		t.Errorf("list green: %d %s", rec.Code, rec.Body)
	}
	if rec := request(t, f.h, "POST", "/sandboxes", `{"templateID":"base"}`, "X-API-KEY", made.Key); rec.Code != 201 {
		t.Errorf("the new key creates: %d %s", rec.Code, rec.Body)
	}
	if rec := request(t, f.h, "GET", "/templates", "", "X-API-KEY", made.Key); rec.Code != 403 || !strings.Contains(rec.Body.String(), "templates:read") {
		t.Errorf("the new key reads templates: %d %s", rec.Code, rec.Body)
	}

	for _, bad := range []string{`{"name":"x","scopes":["sandboxes:delete"]}`, `{"scopes":["*"]}`, `{"name":"x","scopes":[]}`, `{"name":"x","team":"Not A Team"}`} {
		if rec := request(t, f.h, "POST", "/api-keys", bad); rec.Code != http.StatusBadRequest {
			t.Errorf("create %s = %d %s, want 400", bad, rec.Code, rec.Body)
		}
	}
	// An admin key that holds less cannot give more.
	rec = request(t, f.h, "POST", "/api-keys", `{"name":"small-admin","scopes":["keys:admin","sandboxes:read"]}`)
	var small e2bwire.TeamAPIKey
	json.Unmarshal(rec.Body.Bytes(), &small)
	if rec := request(t, f.h, "PATCH", "/api-keys/"+made.ID, `{"scopes":["*"]}`, "X-API-KEY", small.Key); rec.Code != 403 || !strings.Contains(rec.Body.String(), "cannot give") {
		t.Errorf("escalation through PATCH: %d %s", rec.Code, rec.Body)
	}

	if rec := request(t, f.h, "DELETE", "/api-keys/"+made.ID, ""); rec.Code != 204 {
		t.Fatalf("revoke: %d %s", rec.Code, rec.Body)
	}
	rec = request(t, f.h, "GET", "/v2/sandboxes", "", "X-API-KEY", made.Key)
	if rec.Code != 401 || !strings.Contains(rec.Body.String(), "revoked") {
		t.Errorf("revoked key: %d %s", rec.Code, rec.Body)
	}
	if rec := request(t, f.h, "DELETE", "/api-keys/"+made.ID, ""); rec.Code != 404 {
		t.Errorf("second revoke: %d %s", rec.Code, rec.Body)
	}
	if rec := request(t, f.h, "GET", "/v2/sandboxes", "", "X-API-KEY", "short"); rec.Code != 401 || !strings.Contains(rec.Body.String(), "Malformed") {
		t.Errorf("malformed key: %d %s", rec.Code, rec.Body)
	}

	// The audit log: the create, the refused escalation, the revocation,
	// the revoked key's attempt, each with who did it; no key value.
	rec = request(t, f.h, "GET", "/airlock/v1/audit?limit=1000", "")
	if rec.Code != 200 {
		t.Fatalf("audit: %d %s", rec.Code, rec.Body)
	}
	var entries []e2bwire.AuditEntry
	json.Unmarshal(rec.Body.Bytes(), &entries)
	want := map[string]bool{
		fmt.Sprintf("POST /api-keys bootstrap 201 key"):               false,
		fmt.Sprintf("PATCH /api-keys/{apiKeyID} small-admin 403 key"): false,
		fmt.Sprintf("DELETE /api-keys/{apiKeyID} bootstrap 204 key"):  false,
		fmt.Sprintf("GET /v2/sandboxes ci 401 "):                      false,
		fmt.Sprintf("POST /sandboxes ci 201 sandbox"):                 false,
	}
	for _, e := range entries {
		k := fmt.Sprintf("%s %s %d %s", e.Action, e.KeyName, e.Status, e.TargetKind)
		if _, ok := want[k]; ok {
			want[k] = true
		}
		if strings.Contains(rec.Body.String(), made.Key) || strings.Contains(rec.Body.String(), small.Key) {
			t.Fatal("the audit log holds a key")
		}
	}
	for k, seen := range want {
		if !seen {
			t.Errorf("no audit entry %q in %s", k, rec.Body)
		}
	}
}

// A team with a rate of its own is held to it, and told so; another team
// keeps the server's.
func TestTeamRate(t *testing.T) {
	h, _ := newTestHandler(t, func(o *Options) {
		o.Authenticate = func(k string) bool { return k == testKey || k == otherKey }
		o.TeamRate = func(team string) float64 {
			if team == OwnerOf(testKey) {
				return 2
			}
			return 0
		}
	})
	codes := []int{}
	for range 3 {
		codes = append(codes, request(t, h, "GET", "/v2/sandboxes", "").Code)
	}
	if codes[0] != 200 || codes[1] != 200 || codes[2] != http.StatusTooManyRequests {
		t.Fatalf("three requests at once at 2 per second: %v", codes)
	}
	rec := request(t, h, "GET", "/v2/sandboxes", "")
	if !strings.Contains(rec.Body.String(), "quota of API requests reached: the team may make 2 requests per second") || rec.Header().Get("Retry-After") == "" {
		t.Errorf("refusal: %s %v", rec.Body, rec.Header())
	}
	for range 5 {
		if rec := request(t, h, "GET", "/v2/sandboxes", "", "X-API-KEY", otherKey); rec.Code != 200 {
			t.Fatalf("the other team, without a rate of its own: %d", rec.Code)
		}
	}
}

// fakeTeamStats answers every query with its bounds, so a test sees what
// the handler asked for.
type fakeTeamStats struct{ team string }

func (f *fakeTeamStats) Query(team string, start, end time.Time) []teamstats.Point {
	f.team = team
	return []teamstats.Point{{At: start, Concurrent: 1}, {At: end, Concurrent: 2, StartRate: 0.5}}
}

func TestTeamMetricsParams(t *testing.T) {
	f := newKeysFixture(t)
	stats := &fakeTeamStats{}
	f.h.opts.TeamMetrics = stats
	get := func(key, target string) *httptest.ResponseRecorder {
		return request(t, f.h, "GET", target, "", "X-API-KEY", key)
	}
	var pts []e2bwire.TeamMetric
	rec := get(f.full, "/teams/blue/metrics?start=1700000000&end=1700000060")
	if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &pts) != nil || len(pts) != 2 ||
		pts[0].TimestampUnix != 1700000000 || pts[1].TimestampUnix != 1700000060 || stats.team != f.blueTeam {
		t.Fatalf("bounds: %d %s (team %q)", rec.Code, rec.Body, stats.team)
	}
	// Out of range is clamped, as for a sandbox's metrics.
	rec = get(f.full, "/teams/blue/metrics?start=-5&end=99999999999999")
	if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &pts) != nil || pts[0].TimestampUnix != 0 || pts[1].TimestampUnix != unixBound {
		t.Fatalf("clamped: %d %s", rec.Code, rec.Body)
	}
	checkError(t, get(f.full, "/teams/blue/metrics?start=yesterday"), 400, `start must be a unix timestamp in seconds, got "yesterday"`)
	checkError(t, get(f.full, "/teams/blue/metrics?start=20&end=10"), 400, "end (10) is before start (20)")
	checkError(t, get(f.full, "/teams/default/metrics"), 404, `team "default" not found`)
	if rec := get(testKey, "/teams/blue/metrics"); rec.Code != 200 { // keys:admin reads any team's
		t.Fatalf("admin: %d %s", rec.Code, rec.Body)
	}
}

// With Options.Grants every envd token the API hands out is the asking
// key's grant of the sandbox's token, never the token itself.
func TestGrantTokens(t *testing.T) {
	f := newKeysFixture(t)
	f.h.opts.Grants = true
	detail := func(key string) e2bwire.SandboxDetail {
		t.Helper()
		rec := request(t, f.h, "GET", "/sandboxes/"+f.blueSandbox, "", "X-API-KEY", key)
		var d e2bwire.SandboxDetail
		if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &d) != nil {
			t.Fatalf("detail: %d %s", rec.Code, rec.Body)
		}
		return d
	}
	full, err := f.keys.Authenticate(f.full)
	if err != nil {
		t.Fatal(err)
	}
	if got := detail(f.full).EnvdAccessToken; got != grant.Token("blue-token", full.KeyID) {
		t.Fatalf("the full key was handed %q", got)
	}
	if got := detail(f.readOnly).EnvdAccessToken; got != "" {
		t.Fatalf("the read-only key was handed %q", got)
	}
	// Another key of the team gets a grant of its own.
	other, err := f.keys.Create(context.Background(), apikey.CreateRequest{TeamID: f.blueTeam, Name: "blue-2"})
	if err != nil {
		t.Fatal(err)
	}
	if a, b := detail(f.full).EnvdAccessToken, detail(other.Key).EnvdAccessToken; a == b || b != grant.Token("blue-token", other.Record.ID) {
		t.Fatalf("two keys, grants %q and %q", a, b)
	}
	rec := request(t, f.h, "POST", "/sandboxes/"+f.blueSandbox+"/connect", `{"timeout":60}`, "X-API-KEY", f.full)
	var c e2bwire.Sandbox
	if rec.Code/100 != 2 || json.Unmarshal(rec.Body.Bytes(), &c) != nil || c.EnvdAccessToken != grant.Token("blue-token", full.KeyID) {
		t.Fatalf("connect: %d %s", rec.Code, rec.Body)
	}
}
