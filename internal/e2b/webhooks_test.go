package e2b

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/store"
)

func newWebhookHandler(t *testing.T, allowPrivate bool) *Handler {
	t.Helper()
	st, err := store.OpenSQLite(filepath.Join(t.TempDir(), "airlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	h, _ := newTestHandler(t, func(o *Options) {
		o.Authenticate = func(k string) bool { return k == testKey || k == otherKey }
		o.Webhooks = st
		o.WebhookAllowPrivate = allowPrivate
	})
	return h
}

func TestWebhookCRUD(t *testing.T) {
	h := newWebhookHandler(t, true)
	rec := request(t, h, "POST", "/events/webhooks",
		`{"name":" hook ","url":"http://127.0.0.1:9/x","events":["sandbox.lifecycle.killed","sandbox.lifecycle.created"],"signatureSecret":"top-secret"}`)
	if rec.Code != http.StatusCreated {
		t.Fatalf("create: %d %s", rec.Code, rec.Body)
	}
	if strings.Contains(rec.Body.String(), "top-secret") {
		t.Errorf("the secret is shown: %s", rec.Body)
	}
	var w webhookJSON
	if err := json.Unmarshal(rec.Body.Bytes(), &w); err != nil {
		t.Fatal(err)
	}
	if !validWebhookID(w.ID) || w.Name != "hook" || !w.Enabled || w.TeamID != OwnerOf(testKey) || w.CreatedAt.IsZero() ||
		strings.Join(w.Events, ",") != "sandbox.lifecycle.created,sandbox.lifecycle.killed" {
		t.Errorf("created = %+v", w)
	}
	path := "/events/webhooks/" + w.ID

	for _, key := range []string{otherKey} {
		for _, m := range []string{"GET", "PATCH", "DELETE"} {
			checkError(t, request(t, h, m, path, `{"enabled":false}`, "X-API-KEY", key), http.StatusNotFound, `webhook "`+w.ID+`" not found`)
		}
		checkError(t, request(t, h, "GET", path+"/deliveries", "", "X-API-KEY", key), http.StatusNotFound, "...")
		if rec := request(t, h, "GET", "/events/webhooks", "", "X-API-KEY", key); rec.Body.String() != "[]\n" {
			t.Errorf("another key lists %s", rec.Body)
		}
	}

	rec = request(t, h, "PATCH", path, `{"enabled":false,"events":["sandbox.lifecycle.paused"],"signatureSecret":"new-secret"}`)
	if rec.Code != http.StatusOK || strings.Contains(rec.Body.String(), "secret\"") {
		t.Fatalf("patch: %d %s", rec.Code, rec.Body)
	}
	rec = request(t, h, "GET", path, "")
	var got webhookJSON
	_ = json.Unmarshal(rec.Body.Bytes(), &got)
	if got.Enabled || got.Name != "hook" || got.URL != "http://127.0.0.1:9/x" || strings.Join(got.Events, ",") != "sandbox.lifecycle.paused" {
		t.Errorf("after patch: %+v", got)
	}
	rec = request(t, h, "GET", "/events/webhooks", "")
	var list []webhookJSON
	if err := json.Unmarshal(rec.Body.Bytes(), &list); err != nil || len(list) != 1 || list[0].ID != w.ID {
		t.Errorf("list: %s", rec.Body)
	}
	if rec := request(t, h, "GET", path+"/deliveries?limit=5", ""); rec.Code != http.StatusOK || rec.Body.String() != "[]\n" {
		t.Errorf("deliveries: %d %s", rec.Code, rec.Body)
	}
	if rec := request(t, h, "DELETE", path, ""); rec.Code != http.StatusOK {
		t.Errorf("delete: %d %s", rec.Code, rec.Body)
	}
	checkError(t, request(t, h, "GET", path, ""), http.StatusNotFound, "...")
	checkError(t, request(t, h, "DELETE", path, ""), http.StatusNotFound, "...")
}

func TestWebhookValidation(t *testing.T) {
	h := newWebhookHandler(t, false)
	const ok = `"url":"https://8.8.8.8/hook","events":["sandbox.lifecycle.created"],"signatureSecret":"s"`
	for _, c := range []struct{ body, msg string }{
		{`{"events":["sandbox.lifecycle.created"],"signatureSecret":"s"}`, "url is required"},
		{`{"url":"https://8.8.8.8/","signatureSecret":"s"}`, "events is required..."},
		{`{"url":"https://8.8.8.8/","events":["sandbox.lifecycle.created"]}`, "signatureSecret is required..."},
		{`{"url":"https://8.8.8.8/","events":[],"signatureSecret":"s"}`, "events must name at least one..."},
		{`{"url":"https://8.8.8.8/","events":["sandbox.created"],"signatureSecret":"s"}`, `events: unknown event type "sandbox.created"...`},
		{`{"url":"https://8.8.8.8/","events":["sandbox.lifecycle.created"],"signatureSecret":""}`, "signatureSecret must not be empty"},
		{`{"url":"ftp://8.8.8.8/","events":["sandbox.lifecycle.created"],"signatureSecret":"s"}`, `webhook url: url "ftp://8.8.8.8/" must start with http:// or https://`},
		{`{"url":"http://127.0.0.1:3000/","events":["sandbox.lifecycle.created"],"signatureSecret":"s"}`, `webhook url: the host "127.0.0.1" of url...`},
		{`{"url":"http://169.254.169.254/","events":["sandbox.lifecycle.created"],"signatureSecret":"s"}`, `webhook url: the host "169.254.169.254"...`},
		{`{"name":"` + strings.Repeat("n", 129) + `",` + ok + `}`, "name is longer than 128 characters"},
		{`{"name":"a\u0007b",` + ok + `}`, "name must not contain control characters"},
		{`{"enabled":"yes",` + ok + `}`, `malformed JSON body: field "enabled" must be a boolean...`},
		{`{"events":"sandbox.lifecycle.created","url":"https://8.8.8.8/","signatureSecret":"s"}`, `malformed JSON body: field "events" must be an array...`},
		{`not json`, "malformed JSON body..."},
	} {
		checkError(t, request(t, h, "POST", "/events/webhooks", c.body), http.StatusBadRequest, c.msg)
	}
	rec := request(t, h, "POST", "/events/webhooks", `{`+ok+`}`)
	if rec.Code != http.StatusCreated {
		t.Fatalf("a public URL: %d %s", rec.Code, rec.Body)
	}
	var w webhookJSON
	_ = json.Unmarshal(rec.Body.Bytes(), &w)
	checkError(t, request(t, h, "PATCH", "/events/webhooks/"+w.ID, `{"url":"http://10.0.0.1/"}`), http.StatusBadRequest, "webhook url: the host...")
	checkError(t, request(t, h, "PATCH", "/events/webhooks/"+w.ID, `{"events":[]}`), http.StatusBadRequest, "events must name...")
	checkError(t, request(t, h, "GET", "/events/webhooks/not-a-uuid", ""), http.StatusBadRequest, `Invalid webhook ID "not-a-uuid": must be a UUID`)
	checkError(t, request(t, h, "GET", "/events/webhooks/"+w.ID+"/deliveries?limit=0", ""), http.StatusBadRequest, "limit must be...")
	checkError(t, request(t, h, "GET", "/events/webhooks/"+w.ID+"/deliveries?offset=-1", ""), http.StatusBadRequest, "offset must be...")
}

func TestWebhooksUnavailable(t *testing.T) {
	h, _ := newTestHandler(t)
	checkError(t, request(t, h, "GET", "/events/webhooks", ""), http.StatusNotImplemented, "webhooks are not available on this server")
}
