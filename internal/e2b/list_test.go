package e2b

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http/httptest"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

func listIDs(t *testing.T, body []byte) []string {
	t.Helper()
	var items []map[string]any
	if err := json.Unmarshal(body, &items); err != nil {
		t.Fatalf("list body is not a JSON array: %v: %s", err, body)
	}
	ids := make([]string, 0, len(items))
	for _, it := range items {
		for _, k := range []string{"sandboxID", "templateID", "alias", "clientID", "startedAt", "endAt", "cpuCount", "memoryMB", "diskSizeMB", "state", "envdVersion", "metadata"} {
			if _, ok := it[k]; !ok {
				t.Errorf("listed sandbox lacks %q: %v", k, it)
			}
		}
		ids = append(ids, it["sandboxID"].(string))
	}
	return ids
}

// The JS SDK's encoding of metadata {"a b": "c&d"}, as captured on the wire.
func TestListMetadataDoubleEncoding(t *testing.T) {
	h, m := newTestHandler(t)
	m.add(sandbox.Info{ID: "match", StartedAt: fakeEpoch, Metadata: map[string]string{"a b": "c&d", "other": "x"}})
	m.add(sandbox.Info{ID: "nomatch", StartedAt: fakeEpoch, Metadata: map[string]string{"a b": "c"}})

	for _, path := range []string{"/v2/sandboxes", "/sandboxes"} {
		rec := request(t, h, "GET", path+"?metadata=a%252520b%3Dc%252526d", "")
		if rec.Code != 200 {
			t.Fatalf("%s: status %d: %s", path, rec.Code, rec.Body)
		}
		if want := map[string]string{"a b": "c&d"}; !equalMaps(m.lastList.Metadata, want) {
			t.Errorf("%s: filter = %q, want %q", path, m.lastList.Metadata, want)
		}
		if ids := listIDs(t, rec.Body.Bytes()); !slices.Equal(ids, []string{"match"}) {
			t.Errorf("%s: ids = %v, want [match]", path, ids)
		}
	}

	// Unicode, "/", "?", "#" and "%", encoded by hand the way the SDK does:
	// encodeURIComponent on each side, URLSearchParams, then the HTTP client.
	m.add(sandbox.Info{ID: "odd", StartedAt: fakeEpoch, Metadata: map[string]string{"π/?#": "100%"}})
	rec := request(t, h, "GET", "/v2/sandboxes?metadata=%2525CF%252580%25252F%25253F%252523%3D100%252525", "")
	if ids := listIDs(t, rec.Body.Bytes()); !slices.Equal(ids, []string{"odd"}) || m.lastList.Metadata["π/?#"] != "100%" {
		t.Errorf("unicode filter: ids %v, filter %q", ids, m.lastList.Metadata)
	}

	// Several pairs, built the way the SDK builds them.
	q := url.Values{}
	q.Set("metadata", url.Values{"user": {url.PathEscape("ann")}, "env": {"prod"}}.Encode())
	rec = request(t, h, "GET", "/v2/sandboxes?"+q.Encode(), "")
	if rec.Code != 200 || !equalMaps(m.lastList.Metadata, map[string]string{"user": "ann", "env": "prod"}) {
		t.Errorf("two pairs: status %d filter %v", rec.Code, m.lastList.Metadata)
	}
}

func TestListPagination(t *testing.T) {
	for _, order := range []string{"desc", "asc", ""} {
		t.Run("order="+order, func(t *testing.T) {
			h, m := newTestHandler(t)
			// Seven sandboxes; three share one start time so the id breaks the tie.
			var want []string
			for i := range 7 {
				start := fakeEpoch.Add(time.Duration(i) * time.Minute)
				if i >= 2 && i <= 4 {
					start = fakeEpoch.Add(2 * time.Minute)
				}
				id := fmt.Sprintf("s%d", i)
				m.add(sandbox.Info{ID: id, StartedAt: start, State: []sandbox.State{sandbox.StateRunning, sandbox.StatePaused}[i%2]})
				want = append(want, id)
			}
			// Descending: newest first, ties by id ascending. Ascending is
			// the exact reverse.
			wantDesc := []string{"s6", "s5", "s2", "s3", "s4", "s1", "s0"}
			if order == "asc" {
				want = slices.Clone(wantDesc)
				slices.Reverse(want)
			} else {
				want = wantDesc
			}

			var got []string
			token := ""
			for page := 0; ; page++ {
				q := url.Values{"limit": {"3"}}
				if order != "" {
					q.Set("order", order)
				}
				if token != "" {
					q.Set("nextToken", token)
				}
				rec := request(t, h, "GET", "/v2/sandboxes?"+q.Encode(), "")
				if rec.Code != 200 {
					t.Fatalf("page %d: status %d: %s", page, rec.Code, rec.Body)
				}
				if total := rec.Header().Get("X-Total-Running"); total != "4" {
					t.Errorf("page %d: X-Total-Running = %q, want 4", page, total)
				}
				ids := listIDs(t, rec.Body.Bytes())
				got = append(got, ids...)
				token = rec.Header().Get("X-Next-Token")
				_, present := rec.Header()["X-Next-Token"]
				if page < 2 {
					if len(ids) != 3 || token == "" {
						t.Fatalf("page %d: %d items, token %q; want 3 and a token", page, len(ids), token)
					}
					continue
				}
				if len(ids) != 1 || present {
					t.Fatalf("last page: %d items, X-Next-Token present = %v; want 1 and absent", len(ids), present)
				}
				break
			}
			if !slices.Equal(got, want) {
				t.Errorf("pages = %v, want %v", got, want)
			}
		})
	}

	t.Run("exact multiple of limit has no token on the last page", func(t *testing.T) {
		h, m := newTestHandler(t)
		m.add(sandbox.Info{ID: "a", StartedAt: fakeEpoch})
		m.add(sandbox.Info{ID: "b", StartedAt: fakeEpoch.Add(time.Second)})
		rec := request(t, h, "GET", "/v2/sandboxes?limit=2", "")
		if _, ok := rec.Header()["X-Next-Token"]; ok {
			t.Error("X-Next-Token on a page that holds everything")
		}
	})

	t.Run("cursor survives its sandbox being killed", func(t *testing.T) {
		h, m := newTestHandler(t)
		for i := range 4 {
			m.add(sandbox.Info{ID: fmt.Sprintf("k%d", i), StartedAt: fakeEpoch.Add(time.Duration(i) * time.Second)})
		}
		rec := request(t, h, "GET", "/v2/sandboxes?limit=2", "")
		token := rec.Header().Get("X-Next-Token")
		delete(m.sandboxes, "k2") // the last one returned
		rec = request(t, h, "GET", "/v2/sandboxes?limit=2&nextToken="+url.QueryEscape(token), "")
		if ids := listIDs(t, rec.Body.Bytes()); !slices.Equal(ids, []string{"k1", "k0"}) {
			t.Errorf("second page = %v, want [k1 k0]", ids)
		}
	})
}

func TestListFilters(t *testing.T) {
	h, m := newTestHandler(t)
	m.templates["other"] = "othertemplate"
	m.add(sandbox.Info{ID: "r1", StartedAt: fakeEpoch, State: sandbox.StateRunning})
	m.add(sandbox.Info{ID: "p1", StartedAt: fakeEpoch.Add(time.Second), State: sandbox.StatePaused})
	m.add(sandbox.Info{ID: "c1", StartedAt: fakeEpoch.Add(2 * time.Second), State: sandbox.StateCreating})
	m.add(sandbox.Info{ID: "o1", StartedAt: fakeEpoch.Add(3 * time.Second), TemplateID: "othertemplate", Alias: "other"})

	tests := []struct {
		query      string
		ids        []string
		total      string // "" = header absent
		wantFilter sandbox.ListFilter
	}{
		{"", []string{"o1", "p1", "r1"}, "2", sandbox.ListFilter{States: []sandbox.State{"running", "paused"}}},
		{"state=running", []string{"o1", "r1"}, "2", sandbox.ListFilter{States: []sandbox.State{"running"}}},
		{"state=paused", []string{"p1"}, "", sandbox.ListFilter{States: []sandbox.State{"paused"}}},
		{"state=running,paused", []string{"o1", "p1", "r1"}, "2", sandbox.ListFilter{States: []sandbox.State{"running", "paused"}}},
		{"state=paused&state=running", []string{"o1", "p1", "r1"}, "2", sandbox.ListFilter{States: []sandbox.State{"paused", "running"}}},
		{"state=running,running", []string{"o1", "r1"}, "2", sandbox.ListFilter{States: []sandbox.State{"running"}}},
		{"template=other", []string{"o1"}, "1", sandbox.ListFilter{States: []sandbox.State{"running", "paused"}, Template: "other"}},
		{"template=nosuch", []string{}, "0", sandbox.ListFilter{States: []sandbox.State{"running", "paused"}, Template: "nosuch"}},
		{"template=nosuch&state=paused", []string{}, "", sandbox.ListFilter{States: []sandbox.State{"paused"}, Template: "nosuch"}},
		{
			"startedAfter=" + url.QueryEscape(fakeEpoch.Add(time.Second).Format(time.RFC3339Nano)), []string{"o1", "p1"}, "1",
			sandbox.ListFilter{States: []sandbox.State{"running", "paused"}, StartedAfter: fakeEpoch.Add(time.Second)},
		},
		{
			// An unescaped "+" in the offset arrives as a space.
			"startedAfter=2025-01-02T04:04:06.6+01:00", []string{"o1", "p1"}, "1",
			sandbox.ListFilter{States: []sandbox.State{"running", "paused"}, StartedAfter: fakeEpoch.Add(time.Second)},
		},
		{"metadata=", []string{"o1", "p1", "r1"}, "2", sandbox.ListFilter{States: []sandbox.State{"running", "paused"}}},
		{"limit=0", []string{"o1"}, "2", sandbox.ListFilter{States: []sandbox.State{"running", "paused"}}},
		{"limit=-4", []string{"o1"}, "2", sandbox.ListFilter{States: []sandbox.State{"running", "paused"}}},
		{"limit=1000", []string{"o1", "p1", "r1"}, "2", sandbox.ListFilter{States: []sandbox.State{"running", "paused"}}},
		{"limit=99999999999999999999999", []string{"o1", "p1", "r1"}, "2", sandbox.ListFilter{States: []sandbox.State{"running", "paused"}}},
		{"source=js&order=desc", []string{"o1", "p1", "r1"}, "2", sandbox.ListFilter{States: []sandbox.State{"running", "paused"}}},
	}
	for _, tt := range tests {
		t.Run(tt.query, func(t *testing.T) {
			rec := request(t, h, "GET", "/v2/sandboxes?"+tt.query, "")
			if rec.Code != 200 {
				t.Fatalf("status %d: %s", rec.Code, rec.Body)
			}
			if ids := listIDs(t, rec.Body.Bytes()); !slices.Equal(ids, tt.ids) {
				t.Errorf("ids = %v, want %v", ids, tt.ids)
			}
			total, present := rec.Header().Get("X-Total-Running"), len(rec.Header().Values("X-Total-Running")) > 0
			if (tt.total == "") == present || total != tt.total {
				t.Errorf("X-Total-Running = %q (present %v), want %q", total, present, tt.total)
			}
			f := m.lastList
			if !slices.Equal(f.States, tt.wantFilter.States) || f.Template != tt.wantFilter.Template ||
				!f.StartedAfter.Equal(tt.wantFilter.StartedAfter) || !equalMaps(f.Metadata, tt.wantFilter.Metadata) {
				t.Errorf("filter = %+v, want %+v", f, tt.wantFilter)
			}
		})
	}
}

func TestListValidation(t *testing.T) {
	h, m := newTestHandler(t)
	m.add(sandbox.Info{ID: "a", StartedAt: fakeEpoch})
	m.add(sandbox.Info{ID: "b", StartedAt: fakeEpoch.Add(time.Second)})
	ascToken := request(t, h, "GET", "/v2/sandboxes?order=asc&limit=1", "").Header().Get("X-Next-Token")
	if ascToken == "" {
		t.Fatal("no token to test with")
	}
	b64 := func(s string) string { return url.QueryEscape(base64.URLEncoding.EncodeToString([]byte(s))) }

	tests := []struct {
		query string
		msg   string
	}{
		{"state=stopped", `Invalid state "stopped": must be running or paused`},
		{"state=running,", `Invalid state "": must be running or paused`},
		{"state=", `Invalid state "": must be running or paused`},
		{"state=RUNNING", `Invalid state "RUNNING": must be running or paused`},
		{"order=ascending", `Invalid order parameter "ascending": must be asc or desc`},
		{"order=ASC", `Invalid order parameter "ASC": must be asc or desc`},
		{"limit=ten", `Invalid limit "ten": must be an integer between 1 and 100`},
		{"limit=1.5", `Invalid limit "1.5": must be an integer between 1 and 100`},
		{"startedAfter=yesterday", `Invalid startedAfter "yesterday": must be an RFC 3339 timestamp`},
		{"startedAfter=2025-01-02", `Invalid startedAfter "2025-01-02": must be an RFC 3339 timestamp`},
		{"template=base:v1", `Invalid template "base:v1": tags are not supported in the sandbox list filter`},
		{"nextToken=!!!", "Invalid next token"},
		{"nextToken=" + b64("nonsense"), "Invalid next token"},
		{"nextToken=" + b64("2025-01-02T03:04:05Z__abc__sideways"), "Invalid next token"},
		{"nextToken=" + b64("yesterday__abc"), "Invalid next token"},
		{"nextToken=" + b64("2025-01-02T03:04:05Z__ABC"), "Invalid next token"},
		{"nextToken=" + url.QueryEscape(ascToken), "Invalid next token"}, // minted for asc, replayed under desc
		{"metadata=a", `Invalid metadata filter: "a" is not a key=value pair`},
		{"metadata=a%3Db%26", `Invalid metadata filter: "" is not a key=value pair`},
		{"metadata=a%3Db%3Dc", `Invalid metadata filter: "a=b=c" is not a key=value pair`},
		{"metadata=%25zz", `Invalid metadata filter: invalid URL escape "%zz"`},
		{"metadata=a%2525zz%3Db", `Invalid metadata filter key "a%zz": invalid URL escape "%zz"`},
		{"metadata=a%3D%2525zz", `Invalid metadata filter value "%zz": invalid URL escape "%zz"`},
	}
	for _, tt := range tests {
		t.Run(tt.query, func(t *testing.T) {
			checkError(t, request(t, h, "GET", "/v2/sandboxes?"+tt.query, ""), 400, tt.msg)
		})
	}

	// Upstream-format tokens (padded base64) are accepted as well.
	if rec := request(t, h, "GET", "/v2/sandboxes?nextToken="+b64(fakeEpoch.Add(time.Second).Format(time.RFC3339Nano)+"__b"), ""); rec.Code != 200 {
		t.Errorf("padded token: status %d: %s", rec.Code, rec.Body)
	} else if ids := listIDs(t, rec.Body.Bytes()); !slices.Equal(ids, []string{"a"}) {
		t.Errorf("padded token page = %v, want [a]", ids)
	}

	m.listErr = errors.New("store is down")
	checkError(t, request(t, h, "GET", "/v2/sandboxes", ""), 500, "list sandboxes: store is down")
	checkError(t, request(t, h, "GET", "/sandboxes", ""), 500, "list sandboxes: store is down")
}

func TestListV1(t *testing.T) {
	h, m := newTestHandler(t)
	m.add(sandbox.Info{ID: "old", StartedAt: fakeEpoch, Metadata: map[string]string{"k": "v"}})
	m.add(sandbox.Info{ID: "new", StartedAt: fakeEpoch.Add(time.Hour)})
	m.add(sandbox.Info{ID: "paused", StartedAt: fakeEpoch.Add(2 * time.Hour), State: sandbox.StatePaused})

	rec := request(t, h, "GET", "/sandboxes", "")
	if rec.Code != 200 {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	if ids := listIDs(t, rec.Body.Bytes()); !slices.Equal(ids, []string{"new", "old"}) {
		t.Errorf("ids = %v, want running only, newest first", ids)
	}
	if !slices.Equal(m.lastList.States, []sandbox.State{sandbox.StateRunning}) {
		t.Errorf("v1 asked for states %v, want running", m.lastList.States)
	}
	if _, ok := rec.Header()["X-Next-Token"]; ok {
		t.Error("v1 list is not paginated")
	}

	rec = request(t, h, "GET", "/sandboxes?metadata=k%3Dv", "")
	if ids := listIDs(t, rec.Body.Bytes()); !slices.Equal(ids, []string{"old"}) {
		t.Errorf("metadata filter: ids = %v", ids)
	}
	checkError(t, request(t, h, "GET", "/sandboxes?metadata=k", ""), 400, `Invalid metadata filter: "k" is not a key=value pair`)

	// Empty is an empty array, never null.
	delete(m.sandboxes, "old")
	delete(m.sandboxes, "new")
	if rec := request(t, h, "GET", "/sandboxes", ""); rec.Body.String() != "[]\n" {
		t.Errorf("empty list body = %q", rec.Body)
	}
}

func TestCursorRoundTrip(t *testing.T) {
	for _, c := range []cursor{
		{start: fakeEpoch, id: "abc"},
		{start: time.Date(2025, 1, 1, 0, 0, 0, 1, time.FixedZone("x", 3600)), id: "z9", asc: true},
	} {
		got, err := decodeCursor(c.encode(), validSandboxID)
		if err != nil {
			t.Fatal(err)
		}
		if !got.start.Equal(c.start) || got.id != c.id || got.asc != c.asc {
			t.Errorf("round trip %+v -> %+v", c, got)
		}
	}
}

// TestPageKeepsTheFirstOnly: page, which keeps only the page's keys in a
// bounded heap, gives the same pages and next tokens as sorting every item
// and searching for the cursor does, in both orders, with start times shared
// by several items, cursors of items that are gone, and every limit.
func TestPageKeepsTheFirstOnly(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	base := time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)
	for round := 0; round < 300; round++ {
		n := rng.IntN(40)
		items := make([]pageKey, n)
		for i := range items {
			items[i] = keyOf(base.Add(time.Duration(rng.IntN(8))*time.Second), fmt.Sprintf("s%03d", rng.IntN(1000)))
		}
		pq := pageQuery{asc: rng.IntN(2) == 0, limit: 1 + rng.IntN(12)}
		if rng.IntN(3) > 0 {
			at := keyOf(base.Add(time.Duration(rng.IntN(8))*time.Second), fmt.Sprintf("s%03d", rng.IntN(1000)))
			if n > 0 && rng.IntN(2) == 0 {
				at = items[rng.IntN(n)]
			}
			pq.after = &cursor{start: at.start, id: at.id, asc: pq.asc}
		}
		// What a sort of every item gives.
		want := sortPage(items, func(k pageKey) pageKey { return k }, pq.asc)
		if pq.after != nil {
			want = slices.DeleteFunc(want, func(k pageKey) bool {
				return compareKeys(k, pageKey{start: pq.after.start, id: pq.after.id}, pq.asc) <= 0
			})
		}
		wantNext := ""
		if len(want) > pq.limit {
			last := want[pq.limit-1]
			wantNext = cursor{start: last.start, id: last.id, asc: pq.asc}.encode()
			want = want[:pq.limit]
		}
		rec := httptest.NewRecorder()
		got := page(rec, items, func(k pageKey) pageKey { return k }, pq)
		if !slices.Equal(got, want) || rec.Header().Get(headerNextToken) != wantNext {
			t.Fatalf("round %d (%d items, %+v): page %v next %q, want %v next %q", round, n, pq, got, rec.Header().Get(headerNextToken), want, wantNext)
		}
	}
}
