package e2b

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/e2bwire"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/template"
)

func TestCreateLifecycle(t *testing.T) {
	kill := sandbox.Lifecycle{OnTimeout: sandbox.OnTimeoutKill}
	pause := sandbox.Lifecycle{OnTimeout: sandbox.OnTimeoutPause}
	for _, tt := range []struct {
		name, fields string
		want         sandbox.Lifecycle
	}{
		{"none", ``, kill},
		{"autoPause false", `"autoPause":false`, kill},
		{"autoPause null", `"autoPause":null`, kill},
		{"autoPause", `"autoPause":true`, pause},
		{"autoPause keeping memory", `"autoPause":true,"autoPauseMemory":true`, pause},
		{"autoPause without memory", `"autoPause":true,"autoPauseMemory":false`, sandbox.Lifecycle{OnTimeout: sandbox.OnTimeoutPause, DropMemory: true}},
		{"autoResume", `"autoPause":true,"autoResume":{"enabled":true}`, sandbox.Lifecycle{OnTimeout: sandbox.OnTimeoutPause, AutoResume: true}},
		{"autoResume with memory", `"autoPause":true,"autoPauseMemory":true,"autoResume":{"enabled":true}`, sandbox.Lifecycle{OnTimeout: sandbox.OnTimeoutPause, AutoResume: true}},
		{"autoResume off", `"autoPause":true,"autoPauseMemory":false,"autoResume":{"enabled":false}`, sandbox.Lifecycle{OnTimeout: sandbox.OnTimeoutPause, DropMemory: true}},
		{"autoResume off without autoPause", `"autoResume":{"enabled":false}`, kill},
		{"autoResume null", `"autoPause":false,"autoResume":null`, kill},
	} {
		for _, path := range []string{"/sandboxes", "/v2/sandboxes"} {
			t.Run(tt.name+" "+path, func(t *testing.T) {
				h, m := newTestHandler(t)
				body := `{"templateID":"base"`
				if tt.fields != "" {
					body += "," + tt.fields
				}
				rec := request(t, h, "POST", path, body+"}")
				if rec.Code != http.StatusCreated {
					t.Fatalf("status %d: %s", rec.Code, rec.Body)
				}
				if m.lastCreate.Lifecycle != tt.want {
					t.Errorf("manager got lifecycle %+v, want %+v", m.lastCreate.Lifecycle, tt.want)
				}
			})
		}
	}
}

func TestCreateLifecycleValidation(t *testing.T) {
	const (
		resumeNeedsPause   = "autoResume.enabled=true requires autoPause=true: only a sandbox paused at its timeout can be resumed by a request"
		memoryNeedsPause   = "autoPauseMemory only applies when autoPause is true: it chooses what the pause at the timeout keeps, and without autoPause the sandbox is killed at its timeout"
		resumeNeedsMemory  = "autoPauseMemory=false cannot be combined with autoResume.enabled=true: a filesystem-only pause cannot be resumed by traffic and must be resumed explicitly with connect"
		resumeNeedsEnabled = "autoResume.enabled is required (true or false)"
	)
	for _, tt := range []struct{ name, fields, msg string }{
		{"autoResume without autoPause", `"autoResume":{"enabled":true}`, resumeNeedsPause},
		{"autoResume with autoPause false", `"autoPause":false,"autoResume":{"enabled":true}`, resumeNeedsPause},
		{"autoPauseMemory false without autoPause", `"autoPauseMemory":false`, memoryNeedsPause},
		{"autoPauseMemory true without autoPause", `"autoPauseMemory":true`, memoryNeedsPause},
		{"autoPauseMemory with autoPause false", `"autoPause":false,"autoPauseMemory":true`, memoryNeedsPause},
		{"filesystem-only pause with autoResume", `"autoPause":true,"autoPauseMemory":false,"autoResume":{"enabled":true}`, resumeNeedsMemory},
		{"autoResume without enabled", `"autoPause":true,"autoResume":{}`, resumeNeedsEnabled},
		{"autoResume enabled null", `"autoPause":true,"autoResume":{"enabled":null}`, resumeNeedsEnabled},
		{"autoPause not a boolean", `"autoPause":"yes"`, `malformed JSON body: field "autoPause" must be a boolean, got string`},
		{"autoResume not an object", `"autoPause":true,"autoResume":true`, `malformed JSON body: field "autoResume" must be an object, got bool`},
	} {
		for _, path := range []string{"/sandboxes", "/v2/sandboxes"} {
			t.Run(tt.name+" "+path, func(t *testing.T) {
				h, m := newTestHandler(t)
				checkError(t, request(t, h, "POST", path, `{"templateID":"base",`+tt.fields+`}`), 400, tt.msg)
				if m.calls != 0 {
					t.Error("manager called despite a refused lifecycle")
				}
			})
		}
	}
}

// A snapshot's ID goes to the manager as the template, as it came.
func TestCreateFromSnapshotPassesTemplateThrough(t *testing.T) {
	h, m := newTestHandler(t)
	m.templates["my-snap:default"] = "rki5dems9wqfm4r03t7g"
	if rec := request(t, h, "POST", "/v2/sandboxes", `{"templateID":"my-snap:default"}`); rec.Code != http.StatusCreated {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	if m.lastCreate.Template != "my-snap:default" {
		t.Errorf("manager got template %q", m.lastCreate.Template)
	}
}

func TestDetailLifecycle(t *testing.T) {
	h, m := newTestHandler(t)
	m.add(sandbox.Info{ID: "plain"})
	m.add(sandbox.Info{ID: "pauses", Lifecycle: sandbox.Lifecycle{OnTimeout: sandbox.OnTimeoutPause, AutoResume: true, DropMemory: false}})
	m.add(sandbox.Info{ID: "kills", Lifecycle: sandbox.Lifecycle{OnTimeout: sandbox.OnTimeoutKill}})
	for id, want := range map[string]string{
		"plain":  `{"autoResume":false,"onTimeout":"kill"}`,
		"pauses": `{"autoResume":true,"onTimeout":"pause"}`,
		"kills":  `{"autoResume":false,"onTimeout":"kill"}`,
	} {
		var detail struct{ Lifecycle json.RawMessage }
		rec := request(t, h, "GET", "/sandboxes/"+id, "")
		if err := json.Unmarshal(rec.Body.Bytes(), &detail); err != nil || rec.Code != 200 {
			t.Fatalf("%s: %d %s %v", id, rec.Code, rec.Body, err)
		}
		if string(detail.Lifecycle) != want {
			t.Errorf("%s: lifecycle %s, want %s", id, detail.Lifecycle, want)
		}
	}

	// What create asked for is what the detail shows.
	rec := request(t, h, "POST", "/v2/sandboxes", `{"templateID":"base","autoPause":true,"autoResume":{"enabled":true}}`)
	id, _ := decodeObject(t, rec)["sandboxID"].(string)
	lc, _ := decodeObject(t, request(t, h, "GET", "/sandboxes/"+id, ""))["lifecycle"].(map[string]any)
	if lc["onTimeout"] != "pause" || lc["autoResume"] != true {
		t.Errorf("lifecycle after create = %v", lc)
	}

	// ListedSandbox has no lifecycle in the schema.
	for _, path := range []string{"/v2/sandboxes", "/sandboxes"} {
		if body := request(t, h, "GET", path, "").Body.String(); strings.Contains(body, "lifecycle") {
			t.Errorf("%s lists a lifecycle: %s", path, body)
		}
	}
}

func TestConnectMemory(t *testing.T) {
	const refused = "memory=false is not supported: Airlock resumes a sandbox the way it was paused (with its memory, or from its filesystem alone when paused with memory=false); omit memory or send true"
	for _, path := range []string{"/sandboxes/abc/connect", "/v2/sandboxes/abc/connect", "/sandboxes/abc/resume"} {
		t.Run(path, func(t *testing.T) {
			for _, body := range []string{`{"timeout":60}`, `{"timeout":60,"memory":true}`, `{"timeout":60,"memory":null}`} {
				h, m := newTestHandler(t)
				m.add(sandbox.Info{ID: "abc", State: sandbox.StatePaused})
				if rec := request(t, h, "POST", path, body); rec.Code != http.StatusCreated {
					t.Errorf("%s: status %d: %s", body, rec.Code, rec.Body)
				}
			}
			h, m := newTestHandler(t)
			m.add(sandbox.Info{ID: "abc", State: sandbox.StatePaused})
			checkError(t, request(t, h, "POST", path, `{"timeout":60,"memory":false}`), 400, refused)
			// Refused before the sandbox is looked up: the request itself is wrong.
			checkError(t, request(t, h, "POST", strings.Replace(path, "abc", "nosuch", 1), `{"memory":false}`), 400, refused)
			if m.calls != 0 {
				t.Errorf("manager called %d times for a refused memory=false", m.calls)
			}
			checkError(t, request(t, h, "POST", path, `{"memory":"no"}`), 400, `malformed JSON body: field "memory" must be a boolean, got string`)
		})
	}
}

// forkResult decodes one fork entry keeping track of which keys it has.
type forkResult struct {
	Sandbox map[string]any `json:"sandbox"`
	Error   *e2bwire.Error `json:"error"`
}

func decodeForks(t *testing.T, rec *httptest.ResponseRecorder) []forkResult {
	t.Helper()
	if rec.Code != http.StatusCreated {
		t.Fatalf("fork: status %d, want 201: %s", rec.Code, rec.Body)
	}
	var raw []map[string]json.RawMessage
	if err := json.Unmarshal(rec.Body.Bytes(), &raw); err != nil {
		t.Fatalf("fork answer is not an array of objects: %v: %s", err, rec.Body)
	}
	out := make([]forkResult, len(raw))
	for i, r := range raw {
		_, hasSandbox := r["sandbox"]
		_, hasError := r["error"]
		if hasSandbox == hasError || len(r) != 1 {
			t.Errorf("fork %d: want exactly one of sandbox and error: %s", i, rec.Body)
		}
		b, _ := json.Marshal(r)
		if err := json.Unmarshal(b, &out[i]); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func TestFork(t *testing.T) {
	for _, tt := range []struct {
		name, body string
		count      int
		timeout    time.Duration
	}{
		{"empty body takes the defaults", ``, 1, 15 * time.Second},
		{"{} takes the defaults", `{}`, 1, 15 * time.Second},
		{"count and timeout", `{"count":3,"timeout":60}`, 3, time.Minute},
		{"the most forks", `{"count":100}`, 100, 15 * time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h, m := newTestHandler(t, func(o *Options) { o.Domain = "sbx.example.com" })
			m.add(sandbox.Info{ID: "abc"})
			forks := decodeForks(t, request(t, h, "POST", "/sandboxes/abc/fork", tt.body))
			want := sandbox.ForkRequest{Count: tt.count, Timeout: tt.timeout, Owner: OwnerOf(testKey)}
			if m.lastFork == nil || *m.lastFork != want {
				t.Errorf("manager got %+v, want %+v", m.lastFork, want)
			}
			if len(forks) != tt.count {
				t.Fatalf("%d results, want %d", len(forks), tt.count)
			}
			seen := map[any]bool{}
			for i, f := range forks {
				// The Sandbox schema, as create answers it.
				wantKeys(t, f.Sandbox, "sandboxID", "templateID", "alias", "clientID", "envdVersion", "envdAccessToken", "domain")
				id := f.Sandbox["sandboxID"]
				if seen[id] || id == "abc" || f.Sandbox["envdAccessToken"] != "token-"+id.(string) || f.Sandbox["domain"] != "sbx.example.com" {
					t.Errorf("fork %d: %v", i, f.Sandbox)
				}
				seen[id] = true
			}
		})
	}

	t.Run("each fork fails on its own", func(t *testing.T) {
		h, m := newTestHandler(t)
		m.add(sandbox.Info{ID: "abc"})
		m.forkErrs = map[int]error{
			1: fmt.Errorf("start fork: %w", sandbox.ErrLimit),
			2: errors.New("restore failed: criu exited 1"),
			3: fmt.Errorf("snapshot gone: %w", sandbox.ErrNotFound),
		}
		forks := decodeForks(t, request(t, h, "POST", "/sandboxes/abc/fork", `{"count":4}`))
		if len(forks) != 4 || forks[0].Sandbox == nil {
			t.Fatalf("forks: %+v", forks)
		}
		for i, want := range []e2bwire.Error{
			{Code: 429, Message: "fork 2 of 4: start fork: limit reached"},
			{Code: 500, Message: "fork 3 of 4: restore failed: criu exited 1"},
			{Code: 404, Message: "fork 4 of 4: snapshot gone: sandbox not found"},
		} {
			if got := forks[i+1].Error; got == nil || *got != want {
				t.Errorf("fork %d: error %+v, want %+v", i+2, got, want)
			}
		}
	})

	t.Run("no sandbox and no error is an error", func(t *testing.T) {
		h, _ := newTestHandler(t)
		got := h.forkResultJSON(httptest.NewRequest("POST", "/sandboxes/abc/fork", nil), "abc", 0, 1, sandbox.ForkResult{})
		if got.Sandbox != nil || got.Error == nil || got.Error.Code != 500 || !strings.Contains(got.Error.Message, "neither a sandbox nor an error") {
			t.Errorf("got %+v", got)
		}
	})
}

// opError is a request to a per-sandbox operation that must be refused.
type opError struct {
	name, id, body string
	status         int
	msg            string
}

// checkOpErrors sends each case to /sandboxes/{id}<suffix>, with "abc"
// running and "sleepy" paused; called tells whether the operation reached
// the manager, which a 400 must not.
func checkOpErrors(t *testing.T, suffix string, called func(*fakeManager) bool, cases []opError) {
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			h, m := newTestHandler(t)
			m.add(sandbox.Info{ID: "abc"})
			m.add(sandbox.Info{ID: "sleepy", State: sandbox.StatePaused})
			checkError(t, request(t, h, "POST", "/sandboxes/"+tt.id+suffix, tt.body), tt.status, tt.msg)
			if tt.status == 400 && called(m) {
				t.Error("manager called despite a bad request")
			}
		})
	}
}

func TestForkErrors(t *testing.T) {
	checkOpErrors(t, "/fork", func(m *fakeManager) bool { return m.lastFork != nil }, []opError{
		{"count 0", "abc", `{"count":0}`, 400, "Count must be at least 1, got 0"},
		{"negative count", "abc", `{"count":-3}`, 400, "Count must be at least 1, got -3"},
		{"count over the maximum", "abc", `{"count":101}`, 400, "Count cannot be greater than 100, got 101"},
		{"count not an integer", "abc", `{"count":1.5}`, 400, `malformed JSON body: field "count" must be an integer, got number 1.5`},
		{"negative timeout", "abc", `{"timeout":-1}`, 400, "Timeout must be greater than 0"},
		{"zero timeout", "abc", `{"timeout":0}`, 400, "Timeout must be greater than 0"},
		{"timeout over the maximum", "abc", `{"timeout":86401}`, 400, "Timeout cannot be greater than 24 hours"},
		{"malformed", "abc", `{"count":`, 400, "malformed JSON body: unexpected end of JSON input..."},
		{"unknown sandbox", "nosuch", `{}`, 404, `sandbox "nosuch" not found`},
		{"paused sandbox", "sleepy", `{}`, 409, "fork sandbox: sandbox sleepy is paused; resume it before forking it: conflict"},
	})
}

// A fork starts sandboxes, so it spends the key's create tokens.
func TestForkSpendsCreateTokens(t *testing.T) {
	h, m := newTestHandler(t, func(o *Options) {
		o.Limits = Limits{Creates: RateLimit{Rate: 0.01, Burst: 1}}
	})
	m.add(sandbox.Info{ID: "abc"})
	decodeForks(t, request(t, h, "POST", "/sandboxes/abc/fork", `{}`))
	checkError(t, request(t, h, "POST", "/sandboxes/abc/fork", `{}`), 429, "rate limit exceeded: at most 0.01 sandbox creations per second...")
	checkError(t, request(t, h, "POST", "/v2/sandboxes", `{"templateID":"base"}`), 429, "rate limit exceeded: at most 0.01 sandbox creations per second...")
}

func TestCreateSnapshot(t *testing.T) {
	for _, tt := range []struct {
		name, body, wantName string
		want                 string // the answer
	}{
		{"unnamed, no body", ``, "", `{"snapshotID":"snap0001:default","names":[]}`},
		{"unnamed", `{}`, "", `{"snapshotID":"snap0001:default","names":[]}`},
		{"named", `{"name":"my-snap"}`, "my-snap", `{"snapshotID":"my-snap:default","names":["my-snap:default"]}`},
		{"default tag dropped", `{"name":"my-snap:default"}`, "my-snap", `{"snapshotID":"my-snap:default","names":["my-snap:default"]}`},
		{"cleaned as upstream cleans", `{"name":"  My.Snap_1:DEFAULT "}`, "my.snap_1", `{"snapshotID":"my.snap_1:default","names":["my.snap_1:default"]}`},
		{"longest name", `{"name":"` + strings.Repeat("a", 63) + `"}`, strings.Repeat("a", 63), `{"snapshotID":"` + strings.Repeat("a", 63) + `:default","names":["` + strings.Repeat("a", 63) + `:default"]}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h, m := newTestHandler(t)
			m.add(sandbox.Info{ID: "abc"})
			rec := request(t, h, "POST", "/sandboxes/abc/snapshots", tt.body)
			if rec.Code != http.StatusCreated {
				t.Fatalf("status %d: %s", rec.Code, rec.Body)
			}
			if got := strings.TrimSpace(rec.Body.String()); got != tt.want {
				t.Errorf("answer %s, want %s", got, tt.want)
			}
			want := sandbox.SnapshotRequest{Name: tt.wantName, Owner: OwnerOf(testKey)}
			if m.lastSnapshot == nil || *m.lastSnapshot != want {
				t.Errorf("manager got %+v, want %+v", m.lastSnapshot, want)
			}
		})
	}
}

func TestCreateSnapshotErrors(t *testing.T) {
	const rule = "want 1 to 63 lower-case letters, digits, '.', '_' or '-', starting with a letter or digit"
	checkOpErrors(t, "/snapshots", func(m *fakeManager) bool { return m.lastSnapshot != nil }, []opError{
		{"empty name", "abc", `{"name":""}`, 400, `Invalid snapshot name "": ` + rule},
		{"name too long", "abc", `{"name":"` + strings.Repeat("a", 64) + `"}`, 400, `Invalid snapshot name "` + strings.Repeat("a", 64) + `": ` + rule},
		{"leading dash", "abc", `{"name":"-x"}`, 400, `Invalid snapshot name "-x": ` + rule},
		{"space inside", "abc", `{"name":"my snap"}`, 400, `Invalid snapshot name "my snap": ` + rule},
		{"other tag", "abc", `{"name":"my-snap:v2"}`, 400, `Invalid snapshot name "my-snap:v2": the only tag Airlock snapshots have is "default"`},
		{"empty tag", "abc", `{"name":"my-snap:"}`, 400, `Invalid snapshot name "my-snap:": the only tag Airlock snapshots have is "default"`},
		{"namespace", "abc", `{"name":"team/my-snap"}`, 400, `Invalid snapshot name "team/my-snap": namespaces are not supported`},
		{"name not a string", "abc", `{"name":5}`, 400, `malformed JSON body: field "name" must be a string, got number`},
		{"unknown sandbox", "nosuch", `{"name":"x"}`, 404, `sandbox "nosuch" not found`},
		{"paused sandbox", "sleepy", `{}`, 409, "snapshot sandbox: sandbox sleepy is paused; resume it before snapshotting it: conflict"},
	})
}

// The snapshot name rule is the template name rule: they share names.
func TestSnapshotNameRuleIsTemplates(t *testing.T) {
	for _, name := range []string{
		"a", "base", "my-snap", "my.snap_1", "0abc", strings.Repeat("a", 63), strings.Repeat("a", 64),
		"", "-a", ".a", "_a", "A", "aB", "a b", "a:b", "a/b", "é", "a\n",
	} {
		if got, want := snapshotNameRule.MatchString(name), template.ValidName(name) == nil; got != want {
			t.Errorf("%q: snapshot rule says %v, template.ValidName %v", name, got, want)
		}
	}
}

// addSnapshots stores testKey's snapshots taken one second apart from
// fakeEpoch (the first id oldest), or at the same instant when tie is set.
func addSnapshots(m *fakeManager, tie bool, ids ...string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, id := range ids {
		at := fakeEpoch.Add(time.Duration(i) * time.Second)
		if tie {
			at = fakeEpoch
		}
		m.snapshots = append(m.snapshots, sandbox.Snapshot{ID: id, SandboxID: "abc", Owner: OwnerOf(testKey), CreatedAt: at})
	}
}

func listSnapshotIDs(t *testing.T, rec *httptest.ResponseRecorder) []string {
	t.Helper()
	if rec.Code != http.StatusOK {
		t.Fatalf("list snapshots: %d %s", rec.Code, rec.Body)
	}
	var items []map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &items); err != nil {
		t.Fatalf("body is not a list: %v: %s", err, rec.Body)
	}
	ids := []string{}
	for _, it := range items {
		if names, ok := it["names"].([]any); !ok || names == nil {
			t.Errorf("names is %#v, want an array", it["names"])
		}
		ids = append(ids, it["snapshotID"].(string))
	}
	return ids
}

func TestListSnapshots(t *testing.T) {
	h, m := newTestHandler(t)
	m.add(sandbox.Info{ID: "abc"})
	if rec := request(t, h, "GET", "/snapshots", ""); rec.Body.String() != "[]\n" {
		t.Errorf("no snapshots: %q, want []", rec.Body)
	}
	if _, ok := request(t, h, "GET", "/snapshots", "").Header()["X-Next-Token"]; ok {
		t.Error("X-Next-Token on an empty list")
	}
	addSnapshots(m, false, "old:default", "mid:default", "new:default")
	m.snapshots[1].Names = []string{"mid:default"}

	if got := listSnapshotIDs(t, request(t, h, "GET", "/snapshots", "")); !slices.Equal(got, []string{"new:default", "mid:default", "old:default"}) {
		t.Errorf("list = %v, want newest first", got)
	}
	if want := (sandbox.SnapshotFilter{Owner: OwnerOf(testKey)}); *m.lastSnapFilter != want {
		t.Errorf("filter %+v, want the key's team only", *m.lastSnapFilter)
	}
	rec := request(t, h, "GET", "/snapshots?sandboxID=abc&name=mid", "")
	if got := listSnapshotIDs(t, rec); !slices.Equal(got, []string{"mid:default"}) {
		t.Errorf("filtered list = %v", got)
	}
	if want := (sandbox.SnapshotFilter{SandboxID: "abc", Name: "mid", Owner: OwnerOf(testKey)}); *m.lastSnapFilter != want {
		t.Errorf("filter %+v, want %+v", *m.lastSnapFilter, want)
	}
	if got := strings.TrimSpace(rec.Body.String()); got != `[{"snapshotID":"mid:default","names":["mid:default"]}]` {
		t.Errorf("body %s", got)
	}
	if got := listSnapshotIDs(t, request(t, h, "GET", "/snapshots?name=mid:default", "")); !slices.Equal(got, []string{"mid:default"}) {
		t.Errorf("tag-qualified filter = %v", got)
	}

	m.snapErr = errors.New("snapshot index unreadable")
	checkError(t, request(t, h, "GET", "/snapshots", ""), 500, "list snapshots: snapshot index unreadable")
}

// Two teams may each have a snapshot of one name: each lists and deletes
// its own only, and a key's name never reaches another team's snapshot.
func TestSnapshotNamesPerTeam(t *testing.T) {
	h, m := newTestHandler(t, twoKeys)
	addSnapshots(m, false, "nightly:default")
	m.snapshots[0].Names = []string{"nightly:default"}
	theirs := m.snapshots[0]
	theirs.Owner, theirs.SandboxID = OwnerOf(otherKey), "def"
	m.snapshots = append(m.snapshots, theirs)

	for _, key := range []string{testKey, otherKey} {
		rec := request(t, h, "GET", "/snapshots?name=nightly", "", "X-API-KEY", key)
		if got := listSnapshotIDs(t, rec); !slices.Equal(got, []string{"nightly:default"}) {
			t.Errorf("list by name: %v, want the key's own one", got)
		}
		if m.lastSnapFilter.Owner != OwnerOf(key) {
			t.Errorf("list filter %+v, want the owner of the key asking", *m.lastSnapFilter)
		}
	}
	if rec := request(t, h, "DELETE", "/templates/nightly:default", "", "X-API-KEY", otherKey); rec.Code != http.StatusNoContent {
		t.Fatalf("delete: %d %s", rec.Code, rec.Body)
	}
	if len(m.snapshots) != 1 || m.snapshots[0].Owner != OwnerOf(testKey) {
		t.Fatalf("after the other team's delete: %+v, want testKey's snapshot kept", m.snapshots)
	}
	checkError(t, request(t, h, "DELETE", "/templates/nightly:default", "", "X-API-KEY", otherKey), 404, `snapshot "nightly:default" not found`)
	if got := listSnapshotIDs(t, request(t, h, "GET", "/snapshots", "", "X-API-KEY", otherKey)); len(got) != 0 {
		t.Errorf("the other team lists %v, want none of testKey's", got)
	}
}

func TestListSnapshotsErrors(t *testing.T) {
	h, _ := newTestHandler(t)
	b64 := func(s string) string { return url.QueryEscape(base64.RawURLEncoding.EncodeToString([]byte(s))) }
	ascToken := url.QueryEscape(cursor{start: fakeEpoch, id: "a:default", asc: true}.encode())
	for _, tt := range []struct{ query, msg string }{
		{"sandboxID=Bad_ID", `Invalid sandboxID "Bad_ID": must match ^[a-z0-9]+$`},
		{"name=team%2Fsnap", `Invalid name "team/snap": namespaces are not supported`},
		{"name=a%20b", `Invalid name "a b": want 1 to 128 letters, digits, '.', '_' or '-'`},
		{"name=a:", `Invalid name "a:": the tag after ':' must be 1 to 128 letters, digits, '.', '_' or '-'`},
		{"limit=ten", `Invalid limit "ten": must be an integer between 1 and 100`},
		{"nextToken=!!!", "Invalid next token"},
		{"nextToken=" + b64("nonsense"), "Invalid next token"},
		{"nextToken=" + b64("2025-01-02T03:04:05Z__abc"), "Invalid next token"}, // a sandbox id: snapshot ids have a tag
		{"nextToken=" + b64("2025-01-02T03:04:05Z__a b:default"), "Invalid next token"},
		{"nextToken=" + b64("yesterday__a:default"), "Invalid next token"},
		{"nextToken=" + ascToken, "Invalid next token"}, // snapshots page newest first only
	} {
		t.Run(tt.query, func(t *testing.T) {
			checkError(t, request(t, h, "GET", "/snapshots?"+tt.query, ""), 400, tt.msg)
		})
	}
}

func TestListSnapshotsPages(t *testing.T) {
	h, m := newTestHandler(t)
	// b and c were taken at the same instant: the id breaks the tie, the
	// way GET /v2/sandboxes breaks it (ascending ids within newest first).
	addSnapshots(m, false, "a:default", "b:default", "c:default", "d:default", "e:default")
	m.snapshots[2].CreatedAt = m.snapshots[1].CreatedAt
	all := []string{"e:default", "d:default", "b:default", "c:default", "a:default"}

	var got []string
	token := ""
	for pageNo := 0; ; pageNo++ {
		q := url.Values{"limit": {"2"}}
		if token != "" {
			q.Set("nextToken", token)
		}
		rec := request(t, h, "GET", "/snapshots?"+q.Encode(), "")
		ids := listSnapshotIDs(t, rec)
		got = append(got, ids...)
		token = rec.Header().Get("X-Next-Token")
		if _, more := rec.Header()["X-Next-Token"]; !more {
			if pageNo != 2 || len(ids) != 1 {
				t.Fatalf("last page %d has %d items, want page 2 with 1", pageNo, len(ids))
			}
			break
		}
		if len(ids) != 2 || pageNo > 2 {
			t.Fatalf("page %d: %v with a next token", pageNo, ids)
		}
	}
	if !slices.Equal(got, all) {
		t.Errorf("pages = %v, want %v", got, all)
	}

	t.Run("limit clamps", func(t *testing.T) {
		if ids := listSnapshotIDs(t, request(t, h, "GET", "/snapshots?limit=0", "")); len(ids) != 1 {
			t.Errorf("limit=0: %v, want 1 item", ids)
		}
		rec := request(t, h, "GET", "/snapshots?limit=1000", "")
		if ids := listSnapshotIDs(t, rec); len(ids) != 5 || rec.Header().Get("X-Next-Token") != "" {
			t.Errorf("limit=1000: %v, token %q", ids, rec.Header().Get("X-Next-Token"))
		}
	})

	t.Run("cursor survives its snapshot being deleted", func(t *testing.T) {
		rec := request(t, h, "GET", "/snapshots?limit=2", "")
		token := rec.Header().Get("X-Next-Token")
		if rec := request(t, h, "DELETE", "/templates/d:default", ""); rec.Code != http.StatusNoContent {
			t.Fatalf("delete: %d %s", rec.Code, rec.Body)
		}
		ids := listSnapshotIDs(t, request(t, h, "GET", "/snapshots?limit=2&nextToken="+url.QueryEscape(token), ""))
		if !slices.Equal(ids, []string{"b:default", "c:default"}) {
			t.Errorf("page after the deleted cursor = %v", ids)
		}
	})
}

func TestDeleteSnapshotOrTemplate(t *testing.T) {
	t.Run("snapshot by id", func(t *testing.T) {
		h, m, tpls := newTemplateHandler(t)
		addSnapshots(m, false, "s1:default")
		// The SDK percent-encodes the path parameter.
		if rec := request(t, h, "DELETE", "/templates/s1%3Adefault", ""); rec.Code != http.StatusNoContent || rec.Body.Len() != 0 {
			t.Fatalf("delete: %d %q", rec.Code, rec.Body)
		}
		if m.lastDeleteSnap != "s1:default" || len(m.snapshots) != 0 || len(tpls.deleted) != 0 {
			t.Errorf("manager asked for %q, snapshots left %v, templates deleted %v", m.lastDeleteSnap, m.snapshots, tpls.deleted)
		}
		// Gone: deleteSnapshot reads this 404 as false.
		checkError(t, request(t, h, "DELETE", "/templates/s1:default", ""), 404, `snapshot "s1:default" not found`)
	})

	t.Run("snapshot by name shadows a template of that name", func(t *testing.T) {
		h, m, tpls := newTemplateHandler(t)
		m.snapshots = []sandbox.Snapshot{{ID: "my-app:default", Names: []string{"my-app:default"}, Owner: OwnerOf(testKey), CreatedAt: fakeEpoch}}
		if rec := request(t, h, "DELETE", "/templates/my-app", ""); rec.Code != http.StatusNoContent {
			t.Fatalf("delete: %d %s", rec.Code, rec.Body)
		}
		if len(m.snapshots) != 0 || len(tpls.deleted) != 0 {
			t.Fatalf("snapshots left %v, templates deleted %v: the snapshot must go first", m.snapshots, tpls.deleted)
		}
		// The name now means the template, as it does for create.
		if rec := request(t, h, "DELETE", "/templates/my-app", ""); rec.Code != http.StatusNoContent {
			t.Fatalf("second delete: %d %s", rec.Code, rec.Body)
		}
		if !slices.Equal(tpls.deleted, []string{userID}) {
			t.Errorf("templates deleted %v", tpls.deleted)
		}
	})

	t.Run("template when no snapshot has the name", func(t *testing.T) {
		h, m, tpls := newTemplateHandler(t)
		addSnapshots(m, false, "other:default")
		if rec := request(t, h, "DELETE", "/templates/my-app", ""); rec.Code != http.StatusNoContent {
			t.Fatalf("delete: %d %s", rec.Code, rec.Body)
		}
		if m.lastDeleteSnap != "my-app" || !slices.Equal(tpls.deleted, []string{userID}) || len(m.snapshots) != 1 {
			t.Errorf("snapshot tried %q, templates deleted %v, snapshots %v", m.lastDeleteSnap, tpls.deleted, m.snapshots)
		}
		// Template errors keep their mapping.
		checkError(t, request(t, h, "DELETE", "/templates/base", ""), 403, `template "base" is built in and cannot be deleted: template is protected`)
	})

	t.Run("neither", func(t *testing.T) {
		h, _, tpls := newTemplateHandler(t)
		checkError(t, request(t, h, "DELETE", "/templates/nope", ""), 404, `snapshot or template "nope" not found`)
		checkError(t, request(t, h, "DELETE", "/templates/my-app:default", ""), 404, `snapshot "my-app:default" not found`)
		if len(tpls.deleted) != 0 {
			t.Errorf("a tagged ref deleted template %v", tpls.deleted)
		}
	})

	t.Run("a snapshot miss reported as an unknown template falls through", func(t *testing.T) {
		h, m, tpls := newTemplateHandler(t)
		m.snapErr = fmt.Errorf("snapshot my-app: %w", sandbox.ErrTemplateNotFound)
		if rec := request(t, h, "DELETE", "/templates/my-app", ""); rec.Code != http.StatusNoContent {
			t.Fatalf("delete: %d %s", rec.Code, rec.Body)
		}
		if !slices.Equal(tpls.deleted, []string{userID}) {
			t.Errorf("templates deleted %v", tpls.deleted)
		}
	})

	t.Run("manager failure stops before the template", func(t *testing.T) {
		h, m, tpls := newTemplateHandler(t)
		m.snapErr = errors.New("snapshot index unreadable")
		checkError(t, request(t, h, "DELETE", "/templates/my-app", ""), 500, "delete snapshot my-app: snapshot index unreadable")
		if len(tpls.deleted) != 0 {
			t.Errorf("template deleted %v despite the failure", tpls.deleted)
		}
	})

	t.Run("without a template store", func(t *testing.T) {
		h, m := newTestHandler(t)
		addSnapshots(m, false, "s1:default")
		if rec := request(t, h, "DELETE", "/templates/s1:default", ""); rec.Code != http.StatusNoContent {
			t.Fatalf("snapshot delete without templates: %d %s", rec.Code, rec.Body)
		}
		checkError(t, request(t, h, "DELETE", "/templates/base", ""), 404, "template endpoints are not available: this server has no template store")
	})
}
