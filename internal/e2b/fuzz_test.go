package e2b

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/e2bwire"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// checkResponse is the invariant both fuzz targets assert: whatever arrives,
// the answer is never a 5xx, and any error is the one JSON shape with
// code == status.
func checkResponse(t *testing.T, rec *httptest.ResponseRecorder, input string) {
	t.Helper()
	if rec.Code >= 500 {
		t.Fatalf("input %q: status %d: %s", input, rec.Code, rec.Body)
	}
	if rec.Code < 400 {
		return
	}
	var body e2bwire.Error
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || body.Code != rec.Code || body.Message == "" {
		t.Fatalf("input %q: status %d with malformed error body %q (%v)", input, rec.Code, rec.Body, err)
	}
}

func FuzzCreateBody(f *testing.F) {
	for _, seed := range []string{
		``,
		`{"templateID":"base"}`,
		`{"templateID":"base","timeout":300,"secure":true,"metadata":{"a b":"c&d"},"envVars":{"X":"1"},"allow_internet_access":false}`,
		`{"templateID":"base","network":{"allowOut":["example.com"],"denyOut":["0.0.0.0/0"],"egressProxy":{"address":"p:1"}}}`,
		`{"templateID":"base","timeout":-1,"metadata":{"a":1}}`,
		`{"templateID":"nope","timeout":9223372036854775807}`,
		`[1,{"templateID":null}]`,
		`{"templateID":"base"`,
		`{"templateID":"base","autoPause":true,"autoPauseMemory":false}`,
		`{"templateID":"base","autoPause":true,"autoResume":{"enabled":true}}`,
		`{"templateID":"base","autoPause":false,"autoPauseMemory":true,"autoResume":{"enabled":false}}`,
		`{"templateID":"base","autoPause":true,"autoPauseMemory":false,"autoResume":{"enabled":true}}`,
		`{"templateID":"base","autoResume":{},"autoPauseMemory":null}`,
		`{"templateID":"my-snap:default","autoResume":{"enabled":"yes"}}`,
	} {
		f.Add(seed, true)
		f.Add(seed, false)
	}
	f.Fuzz(func(t *testing.T, body string, v2 bool) {
		// A fresh handler per input keeps created sandboxes from piling up
		// over a long fuzzing run.
		h, m := newTestHandler(t, func(o *Options) { o.MaxBodySize = 4 << 10 })
		m.plain = true
		path := "/sandboxes"
		if v2 {
			path = "/v2/sandboxes"
		}
		checkResponse(t, request(t, h, "POST", path, body), body)
	})
}

func FuzzListQuery(f *testing.F) {
	token := cursor{start: fakeEpoch, id: "abc"}.encode()
	for _, seed := range []string{
		``,
		`state=running,paused&limit=2&order=asc`,
		`metadata=a%252520b%3Dc%252526d`,
		`metadata=%25zz&state=&limit=-1`,
		`startedAfter=2025-01-02T03:04:05Z&template=base`,
		`template=base:v1&limit=99999999999999999999`,
		`nextToken=` + token,
		`nextToken=%%%&order=desc`,
	} {
		f.Add(seed)
	}
	h, m := newTestHandler(f)
	m.plain = true
	for i, st := range []sandbox.State{sandbox.StateRunning, sandbox.StatePaused, sandbox.StateRunning} {
		m.add(sandbox.Info{ID: "s" + strings.Repeat("x", i), StartedAt: fakeEpoch.Add(time.Duration(i) * time.Second), State: st, Metadata: map[string]string{"a b": "c&d"}})
	}
	// GET /snapshots pages the same way (and takes sandboxID and name).
	f.Add(`sandboxID=s&name=snap:default&limit=1&nextToken=` + cursor{start: fakeEpoch, id: "b:default"}.encode())
	addSnapshots(m, true, "a:default", "b:default", "c:default")
	f.Fuzz(func(t *testing.T, rawQuery string) {
		for _, path := range []string{"/v2/sandboxes", "/snapshots"} {
			req := httptest.NewRequest("GET", path, nil)
			req.URL.RawQuery = rawQuery
			req.Header.Set("X-API-KEY", testKey)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			checkResponse(t, rec, rawQuery)
			if rec.Code == http.StatusOK {
				var items []json.RawMessage
				if err := json.Unmarshal(rec.Body.Bytes(), &items); err != nil {
					t.Fatalf("%s?%s: 200 with a body that is not a list: %v", path, rawQuery, err)
				}
			}
		}
	})
}
