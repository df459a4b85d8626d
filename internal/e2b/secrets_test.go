package e2b

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/secret"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// TestSecretsAPI drives /secrets over the real secret service (SQLite in a
// temporary dir), and checks that no answer ever carries a value.
func TestSecretsAPI(t *testing.T) {
	dir := t.TempDir()
	st, err := store.OpenSQLite(filepath.Join(dir, "airlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	svc, err := secret.New(context.Background(), secret.Options{Store: st, KeyFile: filepath.Join(dir, "secrets.key"), MaxPerOwner: 6, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	var logBuf bytes.Buffer // what the handler logs, at debug level
	h, _ := newTestHandler(t, func(o *Options) {
		o.Authenticate = func(k string) bool { return k == testKey || k == otherKey }
		o.Secrets = svc
		o.Logger = slog.New(slog.NewTextHandler(&logBuf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	// Every value sent, and every answer, to check at the end.
	var values []string
	var answers []*httptest.ResponseRecorder
	do := func(method, target, body string, hdr ...string) *httptest.ResponseRecorder {
		t.Helper()
		rec := request(t, h, method, target, body, hdr...)
		answers = append(answers, rec)
		return rec
	}
	value := func(v string) string { values = append(values, v); return v }
	decode := func(rec *httptest.ResponseRecorder, status int) map[string]any {
		t.Helper()
		if rec.Code != status {
			t.Fatalf("status %d, want %d: %s", rec.Code, status, rec.Body)
		}
		return decodeObject(t, rec)
	}

	v1 := value("sk-live-0123456789")
	rec := do("POST", "/secrets", fmt.Sprintf(`{"name":"OpenAI-Key","value":%q,"metadata":{"team":"ml"}}`, v1))
	created := decode(rec, http.StatusCreated)
	var keys []string
	for k := range created {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if strings.Join(keys, ",") != "createdAt,currentVersion,metadata,name,secretID,updatedAt" {
		t.Fatalf("fields %v: %s", keys, rec.Body)
	}
	id, _ := created["secretID"].(string)
	if !strings.HasPrefix(id, "sec_") || created["name"] != "openai-key" || created["currentVersion"] != 1.0 ||
		created["createdAt"] != created["updatedAt"] || created["metadata"].(map[string]any)["team"] != "ml" {
		t.Fatalf("created %s", rec.Body)
	}

	// Without metadata, metadata is {} (never null).
	if rec := do("POST", "/secrets", fmt.Sprintf(`{"name":"plain","value":%q}`, value("plain-value"))); rec.Code != http.StatusCreated || !strings.Contains(rec.Body.String(), `"metadata":{}`) {
		t.Fatalf("create without metadata: %d %s", rec.Code, rec.Body)
	}

	// Bad input: 400 saying what was wrong, never echoing the value.
	checkError(t, do("POST", "/secrets", `{"name":"openai-KEY","value":"x"}`), http.StatusConflict, "secret with name 'openai-key' already exists")
	checkError(t, do("POST", "/secrets", `{"name":"a b","value":"x"}`), http.StatusBadRequest, `invalid secret name "a b": use letters, digits, '_' and '-' only`)
	checkError(t, do("POST", "/secrets", `{"name":"sec_mine","value":"x"}`), http.StatusBadRequest, `invalid secret name "sec_mine": the sec_ prefix is reserved for secret IDs`)
	checkError(t, do("POST", "/secrets", `{"name":"`+strings.Repeat("n", 129)+`","value":"x"}`), http.StatusBadRequest, "invalid secret name: longer than 128 characters")
	checkError(t, do("POST", "/secrets", `{"value":"x"}`), http.StatusBadRequest, "name is required...")
	checkError(t, do("POST", "/secrets", `{"name":"novalue"}`), http.StatusBadRequest, "value is required...")
	checkError(t, do("POST", "/secrets", `{"name":"novalue","value":null}`), http.StatusBadRequest, "value is required...")
	checkError(t, do("POST", "/secrets", ``), http.StatusBadRequest, "a JSON body is required...")
	checkError(t, do("POST", "/secrets", `{"name":"n","value":12345}`), http.StatusBadRequest, `malformed JSON body: field "value" must be a string, got number`)
	leaky := value("abc-leaky-def")
	checkError(t, do("POST", "/secrets", `{"name":"n","value":"abc-leaky`+"\x01"+`-def"}`), http.StatusBadRequest, "malformed JSON body: syntax error at byte 31")
	checkError(t, do("POST", "/secrets", `{"name":"n","value":"`+leaky), http.StatusBadRequest, "malformed JSON body: syntax error at byte...")
	big := value(strings.Repeat("B", secret.DefaultMaxValueBytes+1))
	checkError(t, do("POST", "/secrets", fmt.Sprintf(`{"name":"big","value":%q}`, big)), http.StatusBadRequest, "value is 65537 bytes: a secret's value may be at most 65536 bytes")
	md := map[string]string{}
	for i := range 33 {
		md[fmt.Sprint("k", i)] = "v"
	}
	mdJSON, _ := json.Marshal(md)
	checkError(t, do("POST", "/secrets", `{"name":"md","value":"x","metadata":`+string(mdJSON)+`}`), http.StatusBadRequest, "metadata has 33 entries: at most 32 are allowed")
	checkError(t, do("POST", "/secrets", `{"name":"md","value":"x","metadata":{"k":"`+strings.Repeat("v", 1025)+`"}}`), http.StatusBadRequest, `metadata value of "k" is 1025 bytes...`)

	// Get by ID and by name in any case; another key finds nothing.
	for _, ref := range []string{id, "openai-key", "OpenAI-Key"} {
		if got := decode(do("GET", "/secrets/"+ref, ""), http.StatusOK); got["secretID"] != id || got["currentVersion"] != 1.0 {
			t.Fatalf("get %s: %v", ref, got)
		}
	}
	for _, ref := range []string{id, "openai-key"} {
		checkError(t, do("GET", "/secrets/"+ref, "", "X-API-KEY", otherKey), http.StatusNotFound, fmt.Sprintf("secret %q not found", ref))
		checkError(t, do("POST", "/secrets/"+ref, `{"value":"x"}`, "X-API-KEY", otherKey), http.StatusNotFound, fmt.Sprintf("secret %q not found", ref))
		checkError(t, do("DELETE", "/secrets/"+ref, "", "X-API-KEY", otherKey), http.StatusNotFound, fmt.Sprintf("secret %q not found", ref))
	}
	checkError(t, do("GET", "/secrets/nope", ""), http.StatusNotFound, `secret "nope" not found`)
	checkError(t, do("GET", "/secrets", "", "X-API-KEY", ""), http.StatusUnauthorized, "...")
	if rec := do("GET", "/secrets", "", "X-API-KEY", otherKey); rec.Code != http.StatusOK || rec.Body.String() != "[]\n" {
		t.Fatalf("other key's list: %d %s", rec.Code, rec.Body)
	}

	// Update: the version goes up; metadata kept unless sent, then replaced.
	got := decode(do("POST", "/secrets/OPENAI-KEY", fmt.Sprintf(`{"value":%q}`, value("sk-live-v2"))), http.StatusOK)
	if got["currentVersion"] != 2.0 || got["metadata"].(map[string]any)["team"] != "ml" || got["createdAt"] != created["createdAt"] || got["updatedAt"] == created["updatedAt"] {
		t.Fatalf("update: %v", got)
	}
	got = decode(do("POST", "/secrets/"+id, fmt.Sprintf(`{"value":%q,"metadata":{"env":"prod"}}`, value("sk-live-v3"))), http.StatusOK)
	if got["currentVersion"] != 3.0 || fmt.Sprint(got["metadata"]) != "map[env:prod]" {
		t.Fatalf("update with metadata: %v", got)
	}
	got = decode(do("POST", "/secrets/"+id, fmt.Sprintf(`{"value":%q,"metadata":null}`, value("sk-live-v4"))), http.StatusOK)
	if got["currentVersion"] != 4.0 || fmt.Sprint(got["metadata"]) != "map[env:prod]" {
		t.Fatalf("update with null metadata: %v", got)
	}
	checkError(t, do("POST", "/secrets/"+id, `{}`), http.StatusBadRequest, "value is required...")
	checkError(t, do("POST", "/secrets/"+id, ``), http.StatusBadRequest, "value is required...")
	checkError(t, do("POST", "/secrets/"+id, `{"value":"`+big+`"}`), http.StatusBadRequest, "value is 65537 bytes...")
	checkError(t, do("POST", "/secrets/nope", `{"value":"x"}`), http.StatusNotFound, `secret "nope" not found`)
	if v, err := svc.Value(context.Background(), OwnerOf(testKey), "openai-key"); err != nil || v != "sk-live-v4" {
		t.Fatalf("value after the updates = %q, %v", v, err)
	}

	// List: name order, pages of limit with X-Next-Token, the per-key count.
	for _, n := range []string{"c", "a", "b", "d"} {
		if rec := do("POST", "/secrets", fmt.Sprintf(`{"name":%q,"value":%q}`, n, value("value-of-"+n))); rec.Code != http.StatusCreated {
			t.Fatalf("create %s: %d %s", n, rec.Code, rec.Body)
		}
	}
	checkError(t, do("POST", "/secrets", `{"name":"seventh","value":"x"}`), http.StatusTooManyRequests, "an API key may have at most 6 secrets")
	var names []string
	token, pages := "", 0
	for {
		target := "/secrets?limit=4"
		if token != "" {
			target += "&nextToken=" + token
		}
		rec := do("GET", target, "")
		if rec.Code != http.StatusOK {
			t.Fatalf("list: %d %s", rec.Code, rec.Body)
		}
		var page []map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &page); err != nil {
			t.Fatal(err)
		}
		for _, s := range page {
			names = append(names, s["name"].(string))
		}
		pages++
		if token = rec.Header().Get("X-Next-Token"); token == "" {
			break
		}
	}
	if pages != 2 || strings.Join(names, ",") != "a,b,c,d,openai-key,plain" {
		t.Fatalf("listed %v in %d pages", names, pages)
	}
	if rec := do("GET", "/secrets", ""); rec.Code != http.StatusOK || rec.Header().Get("X-Next-Token") != "" || strings.Count(rec.Body.String(), "secretID") != 6 {
		t.Fatalf("default page: %d %v %s", rec.Code, rec.Header(), rec.Body)
	}
	checkError(t, do("GET", "/secrets?nextToken=!!", ""), http.StatusBadRequest, "Invalid next token")
	checkError(t, do("GET", "/secrets?nextToken="+encodeTemplateToken("Upper"), ""), http.StatusBadRequest, "Invalid next token")
	checkError(t, do("GET", "/secrets?limit=many", ""), http.StatusBadRequest, "...")

	// Delete: 204 with no body, then 404.
	if rec := do("DELETE", "/secrets/OpenAI-Key", ""); rec.Code != http.StatusNoContent || rec.Body.Len() != 0 {
		t.Fatalf("delete: %d %s", rec.Code, rec.Body)
	}
	checkError(t, do("DELETE", "/secrets/"+id, ""), http.StatusNotFound, fmt.Sprintf("secret %q not found", id))
	checkError(t, do("GET", "/secrets/openai-key", ""), http.StatusNotFound, `secret "openai-key" not found`)

	for _, v := range values {
		for _, part := range []string{v, v[:min(len(v), 8)]} {
			for _, rec := range answers {
				if strings.Contains(rec.Body.String(), part) || strings.Contains(fmt.Sprint(rec.Header()), part) {
					t.Fatalf("an answer holds (part of) a value %q: %v %s", part, rec.Header(), rec.Body)
				}
			}
			if strings.Contains(logBuf.String(), part) {
				t.Fatalf("the log holds (part of) a value %q: %s", part, logBuf.String())
			}
		}
	}
	if !strings.Contains(logBuf.String(), "e2b api request rejected") {
		t.Fatalf("nothing was logged at debug level: %s", logBuf.String())
	}
}

func TestSecretsAPIWithoutService(t *testing.T) {
	h, _ := newTestHandler(t)
	for _, m := range []string{"GET /secrets", "POST /secrets", "GET /secrets/x", "POST /secrets/x", "DELETE /secrets/x"} {
		method, path, _ := strings.Cut(m, " ")
		checkError(t, request(t, h, method, path, `{"name":"x","value":"y"}`), http.StatusNotImplemented, "secrets are not available on this server")
	}
}
