package e2b

import (
	"encoding/json"
	"net/http"
	"slices"
	"testing"
)

// newAccessHandler serves two API keys and, besides the fake's templates,
// one private template of each key and one the other key made public.
func newAccessHandler(t *testing.T) (*Handler, *fakeManager, *fakeTemplates) {
	t.Helper()
	tpls := newFakeTemplates()
	tpls.ts = append(tpls.ts,
		TemplateInfo{ID: "mine", Aliases: []string{"mine"}, Owner: OwnerOf(testKey), BuildID: "m", CreatedAt: tplEpoch, UpdatedAt: tplEpoch},
		TemplateInfo{ID: "theirs", Aliases: []string{"theirs"}, Owner: OwnerOf(otherKey), BuildID: "t", CreatedAt: tplEpoch, UpdatedAt: tplEpoch},
		TemplateInfo{ID: "shared", Aliases: []string{"shared"}, Owner: OwnerOf(otherKey), Public: true, BuildID: "s", CreatedAt: tplEpoch, UpdatedAt: tplEpoch},
	)
	h, m := newTestHandler(t, func(o *Options) {
		o.Templates = tpls
		o.Authenticate = func(k string) bool { return k == testKey || k == otherKey }
	})
	return h, m, tpls
}

func listedIDs(t *testing.T, h http.Handler, key string) []string {
	t.Helper()
	rec := request(t, h, "GET", "/templates", "", "X-API-KEY", key)
	if rec.Code != http.StatusOK {
		t.Fatalf("list: %d %s", rec.Code, rec.Body)
	}
	var ids []string
	for _, m := range decodeArray(t, rec.Body.Bytes()) {
		ids = append(ids, m["templateID"].(string))
	}
	return ids
}

// A key sees its own templates, public ones and the operator's; another
// key's private template answers as if it did not exist, everywhere.
func TestTemplateVisibility(t *testing.T) {
	h, m, _ := newAccessHandler(t)
	ids := listedIDs(t, h, testKey)
	for _, want := range []string{"mine", "shared", baseID} {
		if !slices.Contains(ids, want) {
			t.Errorf("list lacks %s: %v", want, ids)
		}
	}
	if slices.Contains(ids, "theirs") {
		t.Errorf("another key's private template is listed: %v", ids)
	}
	if ids := listedIDs(t, h, otherKey); slices.Contains(ids, "mine") || !slices.Contains(ids, "theirs") {
		t.Errorf("the other key's list: %v", ids)
	}
	for _, rt := range [][2]string{
		{"GET", "/templates/theirs"}, {"GET", "/templates/aliases/theirs"}, {"DELETE", "/templates/theirs"},
		{"PATCH", "/templates/theirs"}, {"GET", "/templates/theirs/tags"},
	} {
		rec := request(t, h, rt[0], rt[1], `{"public":true}`)
		if rec.Code != http.StatusNotFound {
			t.Errorf("%s %s: %d %s", rt[0], rt[1], rec.Code, rec.Body)
		}
	}
	for _, body := range []string{`{"target":"theirs","tags":["x"]}`, `{"target":"theirs:default","tags":["x"]}`} {
		if rec := request(t, h, "POST", "/templates/tags", body); rec.Code != http.StatusNotFound {
			t.Errorf("tag another key's template %s: %d %s", body, rec.Code, rec.Body)
		}
	}
	if rec := request(t, h, "DELETE", "/templates/tags", `{"name":"theirs","tags":["x"]}`); rec.Code != http.StatusNotFound {
		t.Errorf("untag another key's template: %d %s", rec.Code, rec.Body)
	}
	rec := request(t, h, "POST", "/sandboxes", `{"templateID":"theirs"}`)
	if rec.Code != http.StatusNotFound {
		t.Errorf("create from another key's template: %d %s", rec.Code, rec.Body)
	}
	// The manager may still start the key's own snapshot of that name
	// (snapshot names are per team), and nothing else.
	if !m.lastCreate.SnapshotOnly {
		t.Errorf("create from another key's template: the manager was not told to start a snapshot only")
	}
	for _, ref := range []string{"mine", "shared"} {
		request(t, h, "POST", "/sandboxes", `{"templateID":"`+ref+`"}`)
		if m.lastCreate.Template != ref || m.lastCreate.SnapshotOnly {
			t.Errorf("create from %s: manager got %+v", ref, m.lastCreate)
		}
	}
	for _, ref := range []string{"mine", "shared"} {
		if rec := request(t, h, "GET", "/templates/aliases/"+ref, ""); rec.Code != http.StatusOK {
			t.Errorf("alias %s: %d %s", ref, rec.Code, rec.Body)
		}
	}
}

// Only the owner changes a template: a public one of another key can be
// used, not deleted or made private; the operator's cannot be changed.
func TestTemplateOwnerOnlyChanges(t *testing.T) {
	h, _, tpls := newAccessHandler(t)
	checkError(t, request(t, h, "DELETE", "/templates/shared", ""), http.StatusForbidden, `template "shared" belongs to another API key: template is protected`)
	if rec := request(t, h, "PATCH", "/templates/shared", `{"public":false}`); rec.Code != http.StatusForbidden {
		t.Errorf("PATCH another key's public template: %d %s", rec.Code, rec.Body)
	}
	if rec := request(t, h, "PATCH", "/v2/templates/base", `{"public":false}`); rec.Code != http.StatusForbidden {
		t.Errorf("PATCH the operator's template: %d %s", rec.Code, rec.Body)
	}
	checkError(t, request(t, h, "POST", "/templates/tags", `{"target":"shared","tags":["x"]}`), http.StatusForbidden, `template "shared" belongs to another API key: template is protected`)
	checkError(t, request(t, h, "PATCH", "/templates/mine", `{}`), http.StatusBadRequest, `request body is required: {"public": true|false}`)

	rec := request(t, h, "PATCH", "/v2/templates/mine", `{"public":true}`)
	if rec.Code != http.StatusOK {
		t.Fatalf("PATCH mine: %d %s", rec.Code, rec.Body)
	}
	var out struct{ Names []string }
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || !slices.Equal(out.Names, []string{"mine"}) {
		t.Errorf("PATCH answer %s: %v", rec.Body, err)
	}
	if ids := listedIDs(t, h, otherKey); !slices.Contains(ids, "mine") {
		t.Errorf("a template made public is not listed for the other key: %v", ids)
	}
	if rec := request(t, h, "DELETE", "/templates/mine", "", "X-API-KEY", otherKey); rec.Code != http.StatusForbidden {
		t.Errorf("the other key deletes my public template: %d %s", rec.Code, rec.Body)
	}
	if rec := request(t, h, "DELETE", "/templates/mine", ""); rec.Code != http.StatusNoContent {
		t.Errorf("the owner deletes: %d %s", rec.Code, rec.Body)
	}
	if !slices.Contains(tpls.deleted, "mine") {
		t.Errorf("deleted: %v", tpls.deleted)
	}
}
