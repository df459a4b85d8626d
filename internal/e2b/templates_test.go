package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/envdapi"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

const (
	baseID = "rki5dems9wqfm4r03t7g" // the fake manager's id of "base"
	userID = "u7x2mytemplate000001"
)

var tplEpoch = time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)

// fakeTemplates is an in-memory Templates. Its special refs fail the way a
// real store can: "boom" with a plain error, "busy" in use by 3 sandboxes,
// "busyplain" in use without a count, and "base" is protected.
type fakeTemplates struct {
	mu      sync.Mutex
	ts      []TemplateInfo
	listErr error
	deleted []string
	// tags maps a template id to its tags and the builds they name; a
	// template without an entry has "default" only, naming its BuildID.
	tags map[string]map[string]string
}

func newFakeTemplates() *fakeTemplates {
	return &fakeTemplates{ts: []TemplateInfo{
		{
			ID: userID, Aliases: []string{"my-app"}, Public: true, Owner: OwnerOf(testKey),
			BuildID: "0b6e4a2c-5a4f-4c1e-9d7a-111111111111", BuildStatus: "",
			CPUCount: 4, MemoryMB: 2048, DiskSizeMB: 4096, EnvdVersion: "0.9.0",
			CreatedAt: tplEpoch, UpdatedAt: tplEpoch.Add(2 * time.Hour), BuildCount: 3,
			Builds: []TemplateBuildInfo{
				{ID: "b3", Status: BuildStatusReady, CreatedAt: tplEpoch.Add(2 * time.Hour), UpdatedAt: tplEpoch.Add(2*time.Hour + time.Minute), FinishedAt: tplEpoch.Add(2*time.Hour + time.Minute), CPUCount: 4, MemoryMB: 2048, DiskSizeMB: 4096},
				{ID: "b2", Status: BuildStatusError, CreatedAt: tplEpoch.Add(time.Hour), UpdatedAt: tplEpoch.Add(time.Hour), CPUCount: 2, MemoryMB: 1024, DiskSizeMB: 4096},
				{ID: "b1", CreatedAt: tplEpoch, UpdatedAt: tplEpoch, CPUCount: 2, MemoryMB: 1024, DiskSizeMB: 4096, EnvdVersion: "0.8.0"},
			},
		},
		{
			ID: baseID, Aliases: []string{"base"}, Public: true, BuildID: "241d4834bd595da2",
			CPUCount: 2, MemoryMB: 512, DiskSizeMB: 2048, CreatedAt: tplEpoch, UpdatedAt: tplEpoch,
		},
		{ID: "busy", Aliases: []string{"busy-alias"}, BuildID: "x", BuildStatus: BuildStatusBuilding, CreatedAt: tplEpoch, UpdatedAt: tplEpoch},
	}}
}

func (f *fakeTemplates) List(context.Context) ([]TemplateInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.listErr != nil {
		return nil, f.listErr
	}
	return slices.Clone(f.ts), nil
}

func (f *fakeTemplates) find(ref string) (int, error) {
	ref, tag, tagged := strings.Cut(ref, ":")
	if tagged {
		i, err := f.find(ref)
		if err != nil {
			return i, err
		}
		if _, ok := f.tagsOf(i)[tag]; !ok {
			return -1, fmt.Errorf("%w: template %s has no tag %q", ErrTemplateNotFound, ref, tag)
		}
		return i, nil
	}
	if ref == "boom" {
		return -1, errors.New("template index unreadable")
	}
	for i, t := range f.ts {
		if t.ID == ref || slices.Contains(t.Aliases, ref) {
			return i, nil
		}
	}
	return -1, fmt.Errorf("template %q: %w", ref, ErrTemplateNotFound)
}

func (f *fakeTemplates) tagsOf(i int) map[string]string {
	if f.tags == nil {
		f.tags = map[string]map[string]string{}
	}
	id := f.ts[i].ID
	if f.tags[id] == nil {
		f.tags[id] = map[string]string{"default": f.ts[i].BuildID}
	}
	return f.tags[id]
}

func (f *fakeTemplates) Tags(_ context.Context, ref string) ([]TemplateTagInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	i, err := f.find(ref)
	if err != nil {
		return nil, err
	}
	var out []TemplateTagInfo
	for tag, build := range f.tagsOf(i) {
		out = append(out, TemplateTagInfo{Tag: tag, BuildID: build, CreatedAt: tplEpoch})
	}
	slices.SortFunc(out, func(a, b TemplateTagInfo) int { return strings.Compare(a.Tag, b.Tag) })
	return out, nil
}

func (f *fakeTemplates) AssignTags(_ context.Context, target string, tags []string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	i, err := f.find(target)
	if err != nil {
		return "", err
	}
	if f.ts[i].ID == baseID {
		return "", fmt.Errorf("base is a built-in template: %w", ErrTemplateProtected)
	}
	_, tag, tagged := strings.Cut(target, ":")
	if !tagged {
		tag = "default"
	}
	m := f.tagsOf(i)
	build := m[tag]
	for _, t := range tags {
		m[t] = build
	}
	return build, nil
}

func (f *fakeTemplates) RemoveTags(_ context.Context, name string, tags []string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	i, err := f.find(name)
	if err != nil {
		return err
	}
	m := f.tagsOf(i)
	for _, t := range tags {
		if _, ok := m[t]; !ok {
			return fmt.Errorf("%w: template %s has no tag %q", ErrTemplateNotFound, name, t)
		}
	}
	for _, t := range tags {
		delete(m, t)
	}
	return nil
}

func (f *fakeTemplates) Get(_ context.Context, ref string) (TemplateInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ref == "busyplain" { // unlisted, found, and refuses Delete
		return TemplateInfo{ID: ref, Aliases: []string{ref}}, nil
	}
	i, err := f.find(ref)
	if err != nil {
		return TemplateInfo{}, err
	}
	return f.ts[i], nil
}

func (f *fakeTemplates) Access(ctx context.Context, ref string) (TemplateAccess, error) {
	t, err := f.Get(ctx, ref)
	return TemplateAccess{Owner: t.Owner, Public: t.Public}, err
}

func (f *fakeTemplates) Delete(_ context.Context, ref string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ref == "busyplain" {
		return fmt.Errorf("%w: template busyplain has sandboxes", ErrTemplateInUse)
	}
	i, err := f.find(ref)
	if err != nil {
		return err
	}
	switch f.ts[i].ID {
	case "busy":
		return &TemplateInUseError{Template: "busy", Sandboxes: 3}
	case baseID:
		return fmt.Errorf("template \"base\" is built in and cannot be deleted: %w", ErrTemplateProtected)
	}
	f.deleted = append(f.deleted, f.ts[i].ID)
	f.ts = slices.Delete(f.ts, i, i+1)
	return nil
}

func (f *fakeTemplates) SetPublic(_ context.Context, ref, owner string, public bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	i, err := f.find(ref)
	if err != nil {
		return err
	}
	if f.ts[i].Owner == "" || f.ts[i].Owner != owner {
		return fmt.Errorf("template %q is not yours: %w", ref, ErrTemplateProtected)
	}
	f.ts[i].Public = public
	return nil
}

func newTemplateHandler(t *testing.T) (*Handler, *fakeManager, *fakeTemplates) {
	t.Helper()
	tpls := newFakeTemplates()
	h, m := newTestHandler(t, func(o *Options) { o.Templates = tpls })
	return h, m, tpls
}

// templateKeys are the required keys of the upstream Template schema.
var templateKeys = []string{
	"templateID", "buildID", "cpuCount", "memoryMB", "diskSizeMB", "public", "createdAt",
	"updatedAt", "createdBy", "lastSpawnedAt", "spawnCount", "buildCount", "envdVersion",
	"aliases", "names", "buildStatus",
}

func decodeArray(t *testing.T, body []byte) []map[string]any {
	t.Helper()
	var out []map[string]any
	if err := json.Unmarshal(body, &out); err != nil {
		t.Fatalf("body is not a JSON array: %v: %s", err, body)
	}
	return out
}

func TestTemplateListV1Shape(t *testing.T) {
	h, m, _ := newTemplateHandler(t)
	// Two live sandboxes of base; the newer start is lastSpawnedAt.
	m.add(sandbox.Info{ID: "s1", StartedAt: fakeEpoch})
	m.add(sandbox.Info{ID: "s2", StartedAt: fakeEpoch.Add(time.Minute), State: sandbox.StatePaused})

	rec := request(t, h, "GET", "/templates?teamID=whatever", "")
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	list := decodeArray(t, rec.Body.Bytes())
	if len(list) != 3 {
		t.Fatalf("got %d templates, want 3: %s", len(list), rec.Body)
	}
	var ids []string
	for _, tpl := range list {
		wantKeys(t, tpl, templateKeys...)
		ids = append(ids, tpl["templateID"].(string))
	}
	if want := []string{"busy", baseID, userID}; !slices.Equal(ids, want) {
		t.Errorf("order = %v, want %v (by id)", ids, want)
	}

	base := list[1]
	want := map[string]any{
		"templateID": baseID, "buildID": "241d4834bd595da2", "cpuCount": 2.0, "memoryMB": 512.0,
		"diskSizeMB": 2048.0, "public": true, "createdAt": "2025-03-04T05:06:07Z",
		"createdBy": nil, "spawnCount": 2.0, "buildCount": 1.0, "envdVersion": envdapi.Version,
		"buildStatus": "ready", "lastSpawnedAt": fakeEpoch.Add(time.Minute).Format(time.RFC3339Nano),
	}
	for k, v := range want {
		if base[k] != v {
			t.Errorf("base %s = %#v, want %#v", k, base[k], v)
		}
	}
	for _, k := range []string{"aliases", "names"} {
		if got, _ := json.Marshal(base[k]); string(got) != `["base"]` {
			t.Errorf("base %s = %s, want [\"base\"]", k, got)
		}
	}

	user := list[2]
	if user["lastSpawnedAt"] != nil || user["spawnCount"] != 0.0 {
		t.Errorf("unused template: lastSpawnedAt %v spawnCount %v, want null and 0", user["lastSpawnedAt"], user["spawnCount"])
	}
	if user["envdVersion"] != "0.9.0" || user["buildCount"] != 3.0 {
		t.Errorf("user template envdVersion %v buildCount %v", user["envdVersion"], user["buildCount"])
	}
	if list[0]["buildStatus"] != "building" {
		t.Errorf("busy buildStatus = %v, want building", list[0]["buildStatus"])
	}
}

func TestTemplateListEmptyIsArray(t *testing.T) {
	h, _, tpls := newTemplateHandler(t)
	tpls.ts = nil
	for _, path := range []string{"/templates", "/v2/templates"} {
		rec := request(t, h, "GET", path, "")
		if rec.Code != http.StatusOK || strings.TrimSpace(rec.Body.String()) != "[]" {
			t.Errorf("%s: %d %q, want 200 []", path, rec.Code, rec.Body)
		}
	}
}

func TestTemplateListV2Pages(t *testing.T) {
	h, _, tpls := newTemplateHandler(t)
	var got []string
	token := ""
	for page := 0; ; page++ {
		if page > 5 {
			t.Fatal("pagination does not end")
		}
		path := "/v2/templates?limit=2"
		if token != "" {
			path += "&nextToken=" + token
		}
		rec := request(t, h, "GET", path, "")
		if rec.Code != http.StatusOK {
			t.Fatalf("page %d: %d %s", page, rec.Code, rec.Body)
		}
		items := decodeArray(t, rec.Body.Bytes())
		if len(items) > 2 {
			t.Fatalf("page %d has %d items, limit 2", page, len(items))
		}
		for _, it := range items {
			got = append(got, it["templateID"].(string))
		}
		token = rec.Header().Get("X-Next-Token")
		if token == "" {
			break
		}
		if page == 0 {
			// The template that ends a page may go before the next one is
			// asked for; the token must still lead on.
			tpls.mu.Lock()
			tpls.ts = slices.DeleteFunc(tpls.ts, func(t TemplateInfo) bool { return t.ID == baseID })
			tpls.mu.Unlock()
		}
	}
	if want := []string{"busy", baseID, userID}; !slices.Equal(got, want) {
		t.Errorf("pages gave %v, want %v", got, want)
	}

	// The last page carries no token.
	rec := request(t, h, "GET", "/v2/templates", "")
	if rec.Header().Get("X-Next-Token") != "" {
		t.Errorf("single page has X-Next-Token %q", rec.Header().Get("X-Next-Token"))
	}
}

func TestTemplateBadQueries(t *testing.T) {
	h, _, _ := newTemplateHandler(t)
	for _, tc := range []struct{ path, msg string }{
		{"/v2/templates?limit=abc", `Invalid limit "abc": must be an integer between 1 and 100`},
		{"/v2/templates?nextToken=%25%25", "Invalid next token"},
		{"/v2/templates?nextToken=" + encodeTemplateToken("a") + "x", "Invalid next token"}, // not base64 of an id any more
		{"/v2/templates?nextToken=" + "Li4vZXRj", "Invalid next token"},                     // "../etc"
		{"/templates/" + userID + "?limit=x", `Invalid limit "x": must be an integer between 1 and 100`},
		{"/templates/" + userID + "?nextToken=" + encodeTemplateToken("gone"), "Invalid next token"},
	} {
		checkError(t, request(t, h, "GET", tc.path, ""), http.StatusBadRequest, tc.msg)
	}
}

func TestTemplateGetWithBuilds(t *testing.T) {
	h, m, _ := newTemplateHandler(t)
	m.add(sandbox.Info{ID: "s1", StartedAt: fakeEpoch})

	rec := request(t, h, "GET", "/templates/my-app", "") // by alias
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	obj := decodeObject(t, rec)
	wantKeys(t, obj, "templateID", "public", "aliases", "names", "createdAt", "updatedAt", "lastSpawnedAt", "spawnCount", "builds")
	if obj["templateID"] != userID || obj["spawnCount"] != 0.0 || obj["lastSpawnedAt"] != nil {
		t.Errorf("template = %v", obj)
	}
	builds := obj["builds"].([]any)
	if len(builds) != 3 {
		t.Fatalf("builds = %v, want 3", builds)
	}
	first := builds[0].(map[string]any)
	wantKeys(t, first, "buildID", "status", "createdAt", "updatedAt", "cpuCount", "memoryMB", "finishedAt", "diskSizeMB", "envdVersion")
	if first["buildID"] != "b3" || first["status"] != "ready" || first["finishedAt"] != "2025-03-04T07:07:07Z" || first["envdVersion"] != envdapi.Version {
		t.Errorf("newest build = %v", first)
	}
	if second := builds[1].(map[string]any); second["status"] != "error" || second["finishedAt"] != nil {
		t.Errorf("failed build = %v (an unfinished build has no finishedAt)", second)
	}
	if third := builds[2].(map[string]any); third["status"] != "ready" || third["envdVersion"] != "0.8.0" {
		t.Errorf("oldest build = %v", third)
	}

	// Pages of builds.
	rec = request(t, h, "GET", "/templates/"+userID+"?limit=2", "")
	obj = decodeObject(t, rec)
	tok := rec.Header().Get("X-Next-Token")
	if n := len(obj["builds"].([]any)); n != 2 || tok == "" {
		t.Fatalf("limit=2: %d builds, token %q", n, tok)
	}
	rec = request(t, h, "GET", "/templates/"+userID+"?limit=2&nextToken="+tok, "")
	obj = decodeObject(t, rec)
	if b := obj["builds"].([]any); len(b) != 1 || b[0].(map[string]any)["buildID"] != "b1" || rec.Header().Get("X-Next-Token") != "" {
		t.Errorf("second page = %v, token %q", b, rec.Header().Get("X-Next-Token"))
	}

	// A template without a build list shows its current build.
	rec = request(t, h, "GET", "/templates/base", "")
	obj = decodeObject(t, rec)
	if obj["templateID"] != baseID || obj["spawnCount"] != 1.0 || obj["lastSpawnedAt"] != fakeEpoch.Format(time.RFC3339Nano) {
		t.Errorf("base = %v", obj)
	}
	b := obj["builds"].([]any)
	if len(b) != 1 {
		t.Fatalf("base builds = %v", b)
	}
	if got := b[0].(map[string]any); got["buildID"] != "241d4834bd595da2" || got["status"] != "ready" || got["finishedAt"] != "2025-03-04T05:06:07Z" || got["memoryMB"] != 512.0 {
		t.Errorf("base build = %v", got)
	}
}

func TestTemplateAlias(t *testing.T) {
	h, _, _ := newTemplateHandler(t)
	for _, ref := range []string{"base", baseID} {
		rec := request(t, h, "GET", "/templates/aliases/"+ref, "")
		if rec.Code != http.StatusOK {
			t.Fatalf("%s: %d %s", ref, rec.Code, rec.Body)
		}
		if got := strings.TrimSpace(rec.Body.String()); got != `{"templateID":"`+baseID+`","public":true}` {
			t.Errorf("%s: body %s", ref, got)
		}
	}
}

func TestTemplateErrors(t *testing.T) {
	for _, tc := range []struct {
		method, path string
		status       int
		msg          string
	}{
		{"GET", "/templates/aliases/nope", 404, `template "nope" not found`},
		{"GET", "/templates/nope", 404, `template "nope" not found`},
		{"DELETE", "/templates/nope", 404, `snapshot or template "nope" not found`},
		{"GET", "/templates/aliases/boom", 500, "template index unreadable"},
		{"DELETE", "/templates/boom", 500, "template index unreadable"},
		{"GET", "/templates/aliases/base:v1", 404, `template not found: template base has no tag "v1"`},
		{"GET", "/templates/aliases/base:V1", 400, `Invalid template "base:V1": the tag after ':' must be 1 to 128 lower-case letters, digits, '.', '_' or '-'`},
		{"GET", "/templates/aliases/base:a:b", 400, `Invalid template "base:a:b": the tag after ':' must be 1 to 128 letters, digits, '.', '_' or '-'`},
		{"DELETE", "/templates/base:default", 404, `snapshot "base:default" not found`}, // a tagged ref deletes a snapshot only
		{"DELETE", "/templates/base:", 400, `Invalid template "base:": the tag after ':' must be 1 to 128 letters, digits, '.', '_' or '-'`},
		{"DELETE", "/templates/team%2Fbase", 400, `Invalid template "team/base": namespaces are not supported`},
		{"GET", "/templates/aliases/team%2Fbase", 400, `Invalid template "team/base": namespaces are not supported`},
		{"GET", "/templates/b%20ase", 400, `Invalid template "b ase": want 1 to 128 letters, digits, '.', '_' or '-'`},
		{"DELETE", "/templates/" + strings.Repeat("a", 129), 400, `Invalid template "aaaa...`},
		{"DELETE", "/templates/busy-alias", 409, `template "busy" is used by 3 sandboxes (running or paused); kill them first`},
		{"DELETE", "/templates/busyplain", 409, "template in use: template busyplain has sandboxes"},
		{"DELETE", "/templates/base", 403, `template "base" is built in and cannot be deleted: template is protected`},
		{"GET", "/templates/aliases/", 404, "no route for GET /templates/aliases/"},
		{"GET", "/templates/base/nothing", 404, "no route for GET /templates/base/nothing"},
		{"GET", "/templates/aliases/tags", 404, `template "tags" not found`}, // the alias route, not the tags one
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			h, _, _ := newTemplateHandler(t)
			checkError(t, request(t, h, tc.method, tc.path, ""), tc.status, tc.msg)
		})
	}
}

func TestTemplateDelete(t *testing.T) {
	h, _, tpls := newTemplateHandler(t)
	rec := request(t, h, "DELETE", "/templates/my-app", "")
	if rec.Code != http.StatusNoContent || rec.Body.Len() != 0 {
		t.Fatalf("delete: %d %q, want 204 and no body", rec.Code, rec.Body)
	}
	if !slices.Equal(tpls.deleted, []string{userID}) {
		t.Errorf("deleted %v, want [%s]", tpls.deleted, userID)
	}
	// Gone now: deleteSnapshot's second call answers false (404).
	checkError(t, request(t, h, "DELETE", "/templates/"+userID, ""), 404, `snapshot or template "`+userID+`" not found`)
	checkError(t, request(t, h, "GET", "/templates/aliases/my-app", ""), 404, `template "my-app" not found`)
}

func TestTemplateListErrors(t *testing.T) {
	h, m, tpls := newTemplateHandler(t)
	tpls.listErr = errors.New("store offline")
	checkError(t, request(t, h, "GET", "/templates", ""), 500, "store offline")
	tpls.listErr = nil
	m.listErr = errors.New("manager offline")
	checkError(t, request(t, h, "GET", "/v2/templates", ""), 500, "list sandboxes: manager offline")
	checkError(t, request(t, h, "GET", "/templates/base", ""), 500, "list sandboxes: manager offline")
}

func TestTemplatesNil(t *testing.T) {
	h, _ := newTestHandler(t) // no Options.Templates
	const msg = "template endpoints are not available: this server has no template store"
	for _, rt := range [][2]string{
		{"GET", "/templates"}, {"GET", "/v2/templates"}, {"GET", "/templates/base"},
		{"GET", "/templates/aliases/base"}, {"DELETE", "/templates/base"},
	} {
		checkError(t, request(t, h, rt[0], rt[1], ""), 404, msg)
	}
}

func TestTemplateUnsupported(t *testing.T) {
	h, _, _ := newTemplateHandler(t)
	const build = "This template build API is not supported by Airlock; use an e2b SDK with Template.build (POST /v3/templates), or `airlock template build` on the server"
	// Without Options.Builds the SDK's build flow answers 501 too.
	const noBuilds = "Building templates through the E2B API is not enabled on this server; build them with `airlock template build`"
	for _, tc := range []struct{ method, path, msg string }{
		{"POST", "/v3/templates", noBuilds},
		{"POST", "/v2/templates", build},
		{"POST", "/templates", build},
		{"POST", "/templates/base", build},
		{"GET", "/templates/base/files/abc123", noBuilds},
		{"POST", "/templates/base/builds/b1", build},
		{"POST", "/v2/templates/base/builds/b1", noBuilds},
		{"GET", "/templates/base/builds/b1/status", noBuilds},
		{"GET", "/templates/base/builds/b1/logs", noBuilds},
	} {
		checkError(t, request(t, h, tc.method, tc.path, `{"name":"x"}`), http.StatusNotImplemented, tc.msg)
	}
}

func TestTemplateAuth(t *testing.T) {
	h, _, _ := newTemplateHandler(t)
	for _, rt := range [][2]string{
		{"GET", "/templates"}, {"GET", "/v2/templates"}, {"GET", "/templates/base"},
		{"GET", "/templates/aliases/base"}, {"DELETE", "/templates/base"}, {"POST", "/v3/templates"},
	} {
		checkError(t, request(t, h, rt[0], rt[1], "", "X-API-KEY", ""), 401, "Missing API key: send it in the X-API-KEY header")
		checkError(t, request(t, h, rt[0], rt[1], "", "X-API-KEY", "e2b_wrong"), 401, "Invalid API key")
	}
	// The E2B CLI sends its token as a bearer token.
	rec := request(t, h, "GET", "/templates", "", "X-API-KEY", "", "Authorization", "Bearer "+testKey)
	if rec.Code != http.StatusOK {
		t.Errorf("bearer: %d %s", rec.Code, rec.Body)
	}
}

// FuzzTemplatePath: whatever id or alias arrives, the answer is never a 5xx
// (the fake's "boom" aside)
// and errors keep the one JSON shape.
func FuzzTemplatePath(f *testing.F) {
	for _, seed := range []string{"base", "my-app", "base:v1", "a/b", "", "..", "%00", strings.Repeat("x", 200), "busy", "tags"} {
		f.Add(seed, uint8(0))
	}
	f.Fuzz(func(t *testing.T, ref string, route uint8) {
		if ref == "boom" {
			return
		}
		h, _, _ := newTemplateHandler(t)
		esc := url.PathEscape(ref)
		method, path := "GET", "/templates/"+esc
		switch route % 4 {
		case 1:
			path = "/templates/aliases/" + esc
		case 2:
			method = "DELETE"
		case 3:
			path = "/v2/templates?limit=1&nextToken=" + url.QueryEscape(ref)
		}
		rec := request(t, h, method, path, "")
		checkResponse(t, rec, ref)
	})
}

// TestTemplateTagErrors: every malformed or impossible tag request is a 4xx
// whose message says what was wrong, and changes nothing.
func TestTemplateTagErrors(t *testing.T) {
	for _, tc := range []struct {
		method, path, body string
		status             int
		msg                string
	}{
		{"POST", "/templates/tags", `{"target":`, 400, "malformed JSON body..."},
		{"POST", "/templates/tags", `{"tags":["v1"]}`, 400, "target is required..."},
		{"POST", "/templates/tags", `{"target":"my-app","tags":[]}`, 400, "At least one tag is required..."},
		{"POST", "/templates/tags", `{"target":"my-app"}`, 400, "At least one tag is required..."},
		{"POST", "/templates/tags", `{"target":"my-app:a:b","tags":["v1"]}`, 400, `Invalid target template "my-app:a:b"...`},
		{"POST", "/templates/tags", `{"target":"my-app:","tags":["v1"]}`, 400, `Invalid target template "my-app:"...`},
		{"POST", "/templates/tags", `{"target":"team/my-app","tags":["v1"]}`, 400, `Invalid target template "team/my-app": namespaces are not supported`},
		{"POST", "/templates/tags", `{"target":"my-app","tags":["Bad Tag"]}`, 400, `Invalid tag "Bad Tag"...`},
		{"POST", "/templates/tags", `{"target":"my-app","tags":[""]}`, 400, `Invalid tag ""...`},
		{"POST", "/templates/tags", `{"target":"nope","tags":["v1"]}`, 404, `template "nope": template not found`},
		{"POST", "/templates/tags", `{"target":"my-app:v9","tags":["v1"]}`, 404, `template not found: template my-app has no tag "v9"`},
		{"POST", "/templates/tags", `{"target":"base","tags":["v1"]}`, 403, `template "base" is the server operator's...`},
		{"DELETE", "/templates/tags", `{"tags":["v1"]}`, 400, "name is required..."},
		{"DELETE", "/templates/tags", `{"name":"my-app:v1","tags":["v1"]}`, 400, `Invalid template name "my-app:v1": name the template without a tag...`},
		{"DELETE", "/templates/tags", `{"name":"my-app","tags":["default"]}`, 400, `The tag "default" cannot be removed...`},
		{"DELETE", "/templates/tags", `{"name":"my-app","tags":[]}`, 400, "At least one tag is required..."},
		{"DELETE", "/templates/tags", `{"name":"my-app","tags":["x/y"]}`, 400, `Invalid tag "x/y"...`},
		{"DELETE", "/templates/tags", `{"name":"my-app","tags":["v9"]}`, 404, `template not found: template my-app has no tag "v9"`},
		{"DELETE", "/templates/tags", `{"name":"nope","tags":["v1"]}`, 404, `template "nope": template not found`},
		{"GET", "/templates/nope/tags", "", 404, `template "nope": template not found`},
		{"GET", "/templates/my-app:a:b/tags", "", 400, `Invalid template "my-app:a:b"...`},
	} {
		t.Run(tc.method+" "+tc.body, func(t *testing.T) {
			h, _, tpls := newTemplateHandler(t)
			checkError(t, request(t, h, tc.method, tc.path, tc.body), tc.status, tc.msg)
			tags, err := tpls.Tags(context.Background(), "my-app")
			if err != nil || len(tags) != 1 || tags[0].Tag != "default" {
				t.Errorf("my-app's tags after a refused request: %+v, %v; want default only", tags, err)
			}
		})
	}
}

// TestTemplateTags: assign, list, resolve and remove tags through the
// routes, in the upstream shapes.
func TestTemplateTags(t *testing.T) {
	h, _, _ := newTemplateHandler(t)
	rec := request(t, h, "POST", "/templates/tags", `{"target":"my-app","tags":["v1","stable","v1"]}`)
	if rec.Code != http.StatusCreated {
		t.Fatalf("assign: %d %s", rec.Code, rec.Body)
	}
	var assigned struct {
		Tags    []string `json:"tags"`
		BuildID string   `json:"buildID"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &assigned); err != nil || !slices.Equal(assigned.Tags, []string{"v1", "stable"}) || assigned.BuildID != "0b6e4a2c-5a4f-4c1e-9d7a-111111111111" {
		t.Fatalf("assign answered %s (%v); want tags [v1 stable] of the default build", rec.Body, err)
	}
	rec = request(t, h, "GET", "/templates/my-app/tags", "")
	got := decodeArray(t, rec.Body.Bytes())
	if rec.Code != http.StatusOK || len(got) != 3 {
		t.Fatalf("list: %d %s", rec.Code, rec.Body)
	}
	for _, tag := range got {
		for _, k := range []string{"tag", "buildID", "createdAt"} {
			if _, ok := tag[k]; !ok {
				t.Errorf("tag %v lacks %q", tag, k)
			}
		}
	}
	if rec := request(t, h, "GET", "/templates/aliases/my-app:stable", ""); rec.Code != http.StatusOK {
		t.Errorf("alias my-app:stable: %d %s", rec.Code, rec.Body)
	}
	if rec := request(t, h, "DELETE", "/templates/tags", `{"name":"my-app","tags":["stable"]}`); rec.Code != http.StatusNoContent || rec.Body.Len() != 0 {
		t.Fatalf("remove: %d %s", rec.Code, rec.Body)
	}
	checkError(t, request(t, h, "GET", "/templates/aliases/my-app:stable", ""), 404, `template not found: template my-app has no tag "stable"`)
	if got := decodeArray(t, request(t, h, "GET", "/templates/my-app:v1/tags", "").Body.Bytes()); len(got) != 2 {
		t.Errorf("tags after removing one: %v", got)
	}
}
