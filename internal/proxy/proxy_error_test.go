package proxy

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestWriteErrorForBrowsers: API clients get E2B's JSON error, a browser
// a page saying the same, its message escaped.
func TestWriteErrorForBrowsers(t *testing.T) {
	body := map[string]any{"code": 502, "message": "The sandbox <x> was not found", "sandboxId": "x"}
	for _, accept := range []string{"", "application/json", "*/*"} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("Accept", accept)
		w := httptest.NewRecorder()
		WriteError(w, r, http.StatusBadGateway, body)
		var got map[string]any
		if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil || got["message"] != body["message"] || w.Code != 502 {
			t.Errorf("Accept %q: %d %s (%v)", accept, w.Code, w.Body, err)
		}
	}
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("Accept", "text/html,application/xhtml+xml,*/*;q=0.8")
	w := httptest.NewRecorder()
	WriteError(w, r, http.StatusBadGateway, body)
	page := w.Body.String()
	if w.Code != 502 || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/html") ||
		!strings.Contains(page, "The sandbox &lt;x&gt; was not found") || strings.Contains(page, "<x>") {
		t.Errorf("browser: %d %q %s", w.Code, w.Header().Get("Content-Type"), page)
	}
}
