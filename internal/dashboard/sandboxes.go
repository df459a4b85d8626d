package dashboard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/apikey"
	"github.com/airlock-sandbox/airlock/internal/e2bwire"
	"github.com/airlock-sandbox/airlock/internal/lifecycle"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// sandboxJSON is a sandbox as the app shows it: no tokens, no env vars.
type sandboxJSON struct {
	SandboxID  string            `json:"sandboxID"`
	TemplateID string            `json:"templateID"`
	Alias      string            `json:"alias"`
	State      string            `json:"state"`
	StartedAt  time.Time         `json:"startedAt"`
	EndAt      time.Time         `json:"endAt"`
	CPUCount   int               `json:"cpuCount"`
	MemoryMB   int               `json:"memoryMB"`
	DiskSizeMB int               `json:"diskSizeMB"`
	Metadata   map[string]string `json:"metadata"`
	Usage      *metricJSON       `json:"usage"`
}

type metricJSON struct {
	At         time.Time `json:"at"`
	CPUCount   int       `json:"cpuCount"`
	CPUUsedPct float64   `json:"cpuUsedPct"`
	MemUsed    int64     `json:"memUsed"`
	MemTotal   int64     `json:"memTotal"`
	DiskUsed   int64     `json:"diskUsed"`
	DiskTotal  int64     `json:"diskTotal"`
}

func toMetricJSON(m sandbox.Metric) metricJSON {
	return metricJSON{At: m.Time, CPUCount: m.CPUCount, CPUUsedPct: m.CPUUsedPct,
		MemUsed: m.MemUsed, MemTotal: m.MemTotal, DiskUsed: m.DiskUsed, DiskTotal: m.DiskTotal}
}

// usageWindow is how old a sandbox's last sample may be to show as its
// current use (the manager samples every 5 s).
const usageWindow = 30 * time.Second

func (d *Dashboard) toJSON(ctx context.Context, in sandbox.Info) sandboxJSON {
	out := sandboxJSON{
		SandboxID: in.ID, TemplateID: in.TemplateID, Alias: in.Alias, State: string(in.State),
		StartedAt: in.StartedAt, EndAt: in.EndAt, CPUCount: in.CPUCount, MemoryMB: in.MemoryMB,
		DiskSizeMB: in.DiskSizeMB, Metadata: in.Metadata,
	}
	if out.Metadata == nil {
		out.Metadata = map[string]string{}
	}
	if in.State == sandbox.StateRunning {
		if ms, err := d.o.Sandboxes.Metrics(ctx, in.ID, d.o.Now().Add(-usageWindow), time.Time{}); err == nil && len(ms) > 0 {
			m := toMetricJSON(ms[len(ms)-1])
			out.Usage = &m
		}
	}
	return out
}

const (
	defaultPage = 100
	maxPage     = 1000
)

// listSandboxes is the key's sandboxes, newest first, one page of them.
func (d *Dashboard) listSandboxes(w http.ResponseWriter, r *http.Request) {
	s := sessionFrom(r.Context())
	q := r.URL.Query()
	f := sandbox.ListFilter{Template: strings.TrimSpace(q.Get("template"))}
	switch st := q.Get("state"); st {
	case "":
		f.States = []sandbox.State{sandbox.StateRunning, sandbox.StatePaused}
	case string(sandbox.StateRunning), string(sandbox.StatePaused):
		f.States = []sandbox.State{sandbox.State(st)}
	default:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("Unknown state %q: use running or paused", st))
		return
	}
	if v := strings.TrimSpace(q.Get("metadata")); v != "" {
		md, err := parseMetadata(v)
		if err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		f.Metadata = md
	}
	limit, err := intParam(q, "limit", defaultPage, 1, maxPage)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	offset, err := intParam(q, "offset", 0, 0, 1<<30)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	all, err := d.o.Sandboxes.List(r.Context(), f)
	if err != nil {
		d.log.Error("dashboard: list sandboxes", "err", err)
		writeError(w, http.StatusInternalServerError, "Listing the sandboxes failed: "+err.Error())
		return
	}
	mine := slices.DeleteFunc(all, func(in sandbox.Info) bool { return in.Owner != s.owner })
	slices.SortFunc(mine, func(a, b sandbox.Info) int {
		if c := b.StartedAt.Compare(a.StartedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	page := mine[min(offset, len(mine)):min(offset+limit, len(mine))]
	out := struct {
		Total     int           `json:"total"`
		Sandboxes []sandboxJSON `json:"sandboxes"`
	}{Total: len(mine), Sandboxes: make([]sandboxJSON, 0, len(page))}
	for _, in := range page {
		out.Sandboxes = append(out.Sandboxes, d.toJSON(r.Context(), in))
	}
	writeJSON(w, http.StatusOK, out)
}

// parseMetadata reads "k=v" pairs separated by & or commas.
func parseMetadata(v string) (map[string]string, error) {
	md := map[string]string{}
	for _, pair := range strings.FieldsFunc(v, func(r rune) bool { return r == '&' || r == ',' }) {
		k, val, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, fmt.Errorf("Invalid metadata filter: %q is not a key=value pair", pair)
		}
		md[strings.TrimSpace(k)] = strings.TrimSpace(val)
	}
	return md, nil
}

func intParam(q url.Values, name string, def, lo, hi int) (int, error) {
	v := q.Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("%s must be a whole number from %d to %d, got %q", name, lo, hi, v)
	}
	return n, nil
}

type infoKey struct{}

func infoFrom(ctx context.Context) sandbox.Info {
	in, _ := ctx.Value(infoKey{}).(sandbox.Info)
	return in
}

// owned serves next for a sandbox of the session's key only. Another key's
// sandbox answers exactly as one that never existed; one of the key's that
// ended answers 404 with gone set, so the page can say so.
func (d *Dashboard) owned(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s := sessionFrom(r.Context())
		id := r.PathValue("id")
		in, err := d.o.Sandboxes.Get(r.Context(), id)
		switch {
		case errors.Is(err, sandbox.ErrNotFound) || (err == nil && in.Owner != s.owner):
			d.notFound(w, r, s, id)
			return
		case err != nil:
			d.log.Error("dashboard: get sandbox", "sandbox", id, "err", err)
			writeError(w, http.StatusInternalServerError, "Reading the sandbox failed: "+err.Error())
			return
		}
		next(w, r.WithContext(context.WithValue(r.Context(), infoKey{}, in)))
	}
}

// running is owned for routes that reach into the sandbox (files,
// processes): they need sandboxes:write, as commands and files through the
// SDK do, and a paused sandbox answers 409 saying to resume it.
func (d *Dashboard) running(next http.HandlerFunc) http.HandlerFunc {
	return d.owned(func(w http.ResponseWriter, r *http.Request) {
		if who := sessionFrom(r.Context()).who; !who.Has(apikey.SandboxesWrite) {
			writeError(w, http.StatusForbidden, fmt.Sprintf("This API key (%s) lacks the scope %s", who.KeyName, apikey.SandboxesWrite))
			return
		}
		if in := infoFrom(r.Context()); in.State != sandbox.StateRunning {
			writeError(w, http.StatusConflict, fmt.Sprintf("Sandbox %s is %s: resume it first", in.ID, in.State))
			return
		}
		next(w, r)
	})
}

// notFound answers for a sandbox the key cannot see: gone when the key's
// events tell it existed.
func (d *Dashboard) notFound(w http.ResponseWriter, r *http.Request, s *session, id string) {
	e := apiError{Code: http.StatusNotFound, Message: fmt.Sprintf("Sandbox %s not found", id)}
	if last, ok := d.lastEvent(r.Context(), s.owner, id); ok {
		e.Gone = true
		e.Message = fmt.Sprintf("Sandbox %s is gone: %s at %s", id, strings.TrimPrefix(last.Type, "sandbox.lifecycle."), last.Timestamp.UTC().Format(time.RFC3339))
	}
	writeJSON(w, http.StatusNotFound, e)
}

func (d *Dashboard) lastEvent(ctx context.Context, owner, id string) (lifecycle.Event, bool) {
	if d.o.Events == nil {
		return lifecycle.Event{}, false
	}
	evs, err := d.o.Events.SandboxEvents(ctx, owner, id, lifecycle.Page{Limit: 1})
	if err != nil || len(evs) == 0 {
		return lifecycle.Event{}, false
	}
	return evs[0], true
}

func (d *Dashboard) getSandbox(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, d.toJSON(r.Context(), infoFrom(r.Context())))
}

func (d *Dashboard) sandboxMetrics(w http.ResponseWriter, r *http.Request) {
	in := infoFrom(r.Context())
	q := r.URL.Query()
	var start, end time.Time
	for _, p := range []struct {
		name string
		t    *time.Time
	}{{"start", &start}, {"end", &end}} {
		if v := q.Get(p.name); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				writeError(w, http.StatusBadRequest, fmt.Sprintf("%s must be a unix time in seconds, got %q", p.name, v))
				return
			}
			*p.t = time.Unix(n, 0)
		}
	}
	if !end.IsZero() && end.Before(start) {
		writeError(w, http.StatusBadRequest, "end is before start")
		return
	}
	ms, err := d.o.Sandboxes.Metrics(r.Context(), in.ID, start, end)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "Reading the sandbox's metrics failed: "+err.Error())
		return
	}
	out := struct {
		Metrics []metricJSON `json:"metrics"`
	}{Metrics: make([]metricJSON, 0, len(ms))}
	for _, m := range ms {
		out.Metrics = append(out.Metrics, toMetricJSON(m))
	}
	writeJSON(w, http.StatusOK, out)
}

// sandboxEvents is the sandbox's lifecycle, newest first, as the key's
// events have it (another key's sandbox has none).
func (d *Dashboard) sandboxEvents(w http.ResponseWriter, r *http.Request) {
	if d.o.Events == nil {
		writeJSON(w, http.StatusOK, map[string]any{"events": []any{}})
		return
	}
	s := sessionFrom(r.Context())
	evs, err := d.o.Events.SandboxEvents(r.Context(), s.owner, r.PathValue("id"), lifecycle.Page{Limit: lifecycle.MaxLimit})
	if err != nil {
		writeError(w, http.StatusInternalServerError, "Reading the sandbox's events failed: "+err.Error())
		return
	}
	type eventJSON struct {
		ID        string          `json:"id"`
		Type      string          `json:"type"`
		Timestamp time.Time       `json:"timestamp"`
		EventData json.RawMessage `json:"eventData"`
	}
	out := make([]eventJSON, 0, len(evs))
	for _, e := range evs {
		data := e.EventData
		if len(data) == 0 {
			data = json.RawMessage("null")
		}
		out = append(out, eventJSON{ID: e.ID, Type: e.Type, Timestamp: e.Timestamp, EventData: data})
	}
	writeJSON(w, http.StatusOK, map[string]any{"events": out})
}

// sandboxLogs pages the sandbox's log through the API, which keeps a killed
// sandbox's log and checks its owner itself.
func (d *Dashboard) sandboxLogs(w http.ResponseWriter, r *http.Request) {
	s := sessionFrom(r.Context())
	q := url.Values{}
	for _, k := range []string{"cursor", "limit", "direction", "level", "search"} {
		if v := r.URL.Query().Get(k); v != "" {
			q.Set(k, v)
		}
	}
	if q.Get("direction") == "" {
		q.Set("direction", "forward")
	}
	st, body := d.callAPI(r.Context(), s.key, http.MethodGet, "/v2/sandboxes/"+url.PathEscape(r.PathValue("id"))+"/logs?"+q.Encode(), nil)
	relay(w, st, body, true)
}

// The actions: each is the E2B API's own route, called as the session's key.

func (d *Dashboard) kill(w http.ResponseWriter, r *http.Request) {
	s, in := sessionFrom(r.Context()), infoFrom(r.Context())
	st, body := d.callAPI(r.Context(), s.key, http.MethodDelete, "/sandboxes/"+in.ID, nil)
	relay(w, st, body, false)
}

func (d *Dashboard) pause(w http.ResponseWriter, r *http.Request) {
	s, in := sessionFrom(r.Context()), infoFrom(r.Context())
	st, body := d.callAPI(r.Context(), s.key, http.MethodPost, "/sandboxes/"+in.ID+"/pause", nil)
	relay(w, st, body, false)
}

// timeoutBody is the body of resume and timeout: seconds from now.
type timeoutBody struct {
	Timeout *int64 `json:"timeout"`
}

func (d *Dashboard) resume(w http.ResponseWriter, r *http.Request) {
	s, in := sessionFrom(r.Context()), infoFrom(r.Context())
	var b timeoutBody
	if err := readJSON(r, &b); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if in.State == sandbox.StateRunning {
		writeError(w, http.StatusConflict, fmt.Sprintf("Sandbox %s is already running", in.ID))
		return
	}
	req := map[string]any{}
	if b.Timeout != nil {
		req["timeout"] = *b.Timeout
	}
	st, body := d.callAPI(r.Context(), s.key, http.MethodPost, "/sandboxes/"+in.ID+"/connect", req)
	relay(w, st, body, false)
}

func (d *Dashboard) setTimeout(w http.ResponseWriter, r *http.Request) {
	s, in := sessionFrom(r.Context()), infoFrom(r.Context())
	var b timeoutBody
	if err := readJSON(r, &b); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if b.Timeout == nil {
		writeError(w, http.StatusBadRequest, "timeout (seconds from now) is required")
		return
	}
	st, body := d.callAPI(r.Context(), s.key, http.MethodPost, "/sandboxes/"+in.ID+"/timeout", map[string]any{"timeout": *b.Timeout})
	relay(w, st, body, false)
}

func (d *Dashboard) snapshot(w http.ResponseWriter, r *http.Request) {
	s, in := sessionFrom(r.Context()), infoFrom(r.Context())
	var b struct {
		Name string `json:"name"`
	}
	if err := readJSON(r, &b); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	req := map[string]any{}
	if n := strings.TrimSpace(b.Name); n != "" {
		req["name"] = n
	}
	st, body := d.callAPI(r.Context(), s.key, http.MethodPost, "/sandboxes/"+in.ID+"/snapshots", req)
	if st >= 300 {
		relay(w, st, body, true)
		return
	}
	var snap e2bwire.SnapshotInfo
	if err := json.Unmarshal(body, &snap); err != nil {
		writeError(w, http.StatusBadGateway, "The snapshot's answer was unreadable: "+err.Error())
		return
	}
	writeJSON(w, http.StatusOK, snap)
}

// forkTimeout is a fork's lifetime, in seconds, when the page names none.
const forkTimeout = 300

// fork answers each fork's id or error, never its tokens.
func (d *Dashboard) fork(w http.ResponseWriter, r *http.Request) {
	s, in := sessionFrom(r.Context()), infoFrom(r.Context())
	var b struct {
		Count   *int64 `json:"count"`
		Timeout *int64 `json:"timeout"`
	}
	if err := readJSON(r, &b); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	// The API's default lifetime of a fork is E2B's, seconds: too short
	// for a fork made from a page to be looked at.
	req := map[string]any{"timeout": forkTimeout}
	if b.Count != nil {
		req["count"] = *b.Count
	}
	if b.Timeout != nil {
		req["timeout"] = *b.Timeout
	}
	st, body := d.callAPI(r.Context(), s.key, http.MethodPost, "/sandboxes/"+in.ID+"/fork", req)
	if st >= 300 {
		relay(w, st, body, true)
		return
	}
	var results []e2bwire.SandboxForkResult
	if err := json.Unmarshal(body, &results); err != nil {
		writeError(w, http.StatusBadGateway, "The fork's answer was unreadable: "+err.Error())
		return
	}
	type forkJSON struct {
		SandboxID string `json:"sandboxID,omitempty"`
		Error     string `json:"error,omitempty"`
	}
	out := make([]forkJSON, 0, len(results))
	for _, res := range results {
		switch {
		case res.Sandbox != nil:
			out = append(out, forkJSON{SandboxID: res.Sandbox.SandboxID})
		case res.Error != nil:
			out = append(out, forkJSON{Error: res.Error.Message})
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"sandboxes": out})
}
