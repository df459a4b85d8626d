package e2b

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/e2bwire"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

const (
	listDefaultLimit = 100
	listMaxLimit     = 100
	headerNextToken  = e2bwire.HeaderNextToken
	// headerTotalRunning is sent only when running sandboxes were asked for,
	// so a client keying off its presence never reads a meaningless 0.
	headerTotalRunning = "X-Total-Running"
	// cursorAsc marks ascending cursors; a token minted for one order is
	// refused under the other, since replaying it would skip or repeat rows.
	cursorAsc = "asc"
)

// listQuery is a parsed GET /v2/sandboxes request.
type listQuery struct {
	filter sandbox.ListFilter
	asc    bool
	limit  int
	after  *cursor // nil on the first page
}

// parseListQuery validates every parameter before anything is listed, so a
// typo (order=ascending, state=stopped) is a 400 rather than a silently
// different page.
func parseListQuery(q url.Values) (listQuery, error) {
	lq := listQuery{limit: listDefaultLimit}

	states, err := parseStates(q["state"])
	if err != nil {
		return lq, err
	}
	lq.filter.States = states

	switch order := q.Get("order"); order {
	case "", "desc":
	case "asc":
		lq.asc = true
	default:
		return lq, badRequest("Invalid order parameter %q: must be asc or desc", order)
	}

	if v := q.Get("limit"); v != "" {
		if lq.limit, err = parseLimit(v, listMaxLimit); err != nil {
			return lq, err
		}
	}

	if v := q.Get("metadata"); v != "" {
		md, err := parseMetadataFilter(v)
		if err != nil {
			return lq, err
		}
		lq.filter.Metadata = md
	}

	if v := q.Get("startedAfter"); v != "" {
		t, err := parseRFC3339(v)
		if err != nil {
			return lq, badRequest("Invalid startedAfter %q: must be an RFC 3339 timestamp", v)
		}
		lq.filter.StartedAfter = t
	}

	if v := q.Get("template"); v != "" {
		// Sandboxes remember their template, not the tag they were created
		// through, so a tag filter could only be ignored; refuse it instead.
		if strings.Contains(v, ":") {
			return lq, badRequest("Invalid template %q: tags are not supported in the sandbox list filter", v)
		}
		lq.filter.Template = v
	}

	if v := q.Get("nextToken"); v != "" {
		c, err := decodeCursor(v)
		if err != nil || c.asc != lq.asc {
			return lq, badRequest("Invalid next token")
		}
		lq.after = &c
	}
	return lq, nil
}

// parseLimit reads a page size; empty means maxLimit. Out-of-range values are
// clamped to 1..maxLimit rather than refused, as upstream's pagination helper
// does; only a non-integer is a 400.
func parseLimit(v string, maxLimit int) (int, error) {
	if v == "" {
		return maxLimit, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	var numErr *strconv.NumError
	switch {
	case err == nil:
	case errors.As(err, &numErr) && errors.Is(numErr.Err, strconv.ErrRange):
		// An integer too large for int64 is still an integer: clamp it
		// like any other out-of-range limit.
		n = int64(maxLimit)
		if strings.HasPrefix(v, "-") {
			n = 1
		}
	default:
		return 0, badRequest("Invalid limit %q: must be an integer between 1 and %d", v, maxLimit)
	}
	return int(min(max(n, 1), int64(maxLimit))), nil
}

// parseStates accepts the SDKs' form style (state=running,paused) and, for
// hand-written clients, repeated parameters. Absent means both.
func parseStates(values []string) ([]sandbox.State, error) {
	if len(values) == 0 {
		return []sandbox.State{sandbox.StateRunning, sandbox.StatePaused}, nil
	}
	var states []sandbox.State
	for _, v := range values {
		for _, s := range strings.Split(v, ",") {
			st := sandbox.State(strings.TrimSpace(s))
			if st != sandbox.StateRunning && st != sandbox.StatePaused {
				return nil, badRequest("Invalid state %q: must be running or paused", s)
			}
			if !slices.Contains(states, st) {
				states = append(states, st)
			}
		}
	}
	return states, nil
}

// parseMetadataFilter undoes the JS SDK's encoding (docs/E2B-WIRE.md §2.5): each key and
// value is encodeURIComponent'ed, the pairs are joined as a query string, and
// the whole is escaped once more as a parameter. net/url has removed the
// outer layer; one QueryUnescape removes the query-string layer, and each key
// and value is unescaped once more after splitting.
func parseMetadataFilter(v string) (map[string]string, error) {
	joined, err := url.QueryUnescape(v)
	if err != nil {
		return nil, badRequest("Invalid metadata filter: %v", err)
	}
	md := make(map[string]string)
	for _, pair := range strings.Split(joined, "&") {
		parts := strings.Split(pair, "=")
		if len(parts) != 2 {
			return nil, badRequest("Invalid metadata filter: %q is not a key=value pair", pair)
		}
		key, err := url.QueryUnescape(parts[0])
		if err != nil {
			return nil, badRequest("Invalid metadata filter key %q: %v", parts[0], err)
		}
		value, err := url.QueryUnescape(parts[1])
		if err != nil {
			return nil, badRequest("Invalid metadata filter value %q: %v", parts[1], err)
		}
		md[key] = value
	}
	return md, nil
}

// parseRFC3339 also accepts a timestamp whose "+hh:mm" offset arrived as a
// space because the client did not escape "+" in the query string.
func parseRFC3339(v string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil && strings.Contains(v, " ") {
		t, err = time.Parse(time.RFC3339Nano, strings.ReplaceAll(v, " ", "+"))
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("parse RFC 3339 time: %w", err)
	}
	return t, nil
}

// cursor is the position after which the next page starts: the start time
// and id of the last sandbox returned.
type cursor struct {
	start time.Time
	id    string
	asc   bool
}

// encode renders the cursor as URL-safe base64 of "<RFC3339Nano>__<id>"
// ("__asc" appended for ascending). Ids are [a-z0-9] and the time has no
// "__", so the separator is unambiguous.
func (c cursor) encode() string {
	s := c.start.UTC().Format(time.RFC3339Nano) + "__" + c.id
	if c.asc {
		s += "__" + cursorAsc
	}
	return base64.RawURLEncoding.EncodeToString([]byte(s))
}

func decodeCursor(token string) (cursor, error) {
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(token, "="))
	if err != nil {
		return cursor{}, fmt.Errorf("decode cursor: %w", err)
	}
	parts := strings.Split(string(raw), "__")
	if len(parts) < 2 || len(parts) > 3 {
		return cursor{}, errors.New("decode cursor: want <time>__<id>[__asc]")
	}
	c := cursor{id: parts[1]}
	if len(parts) == 3 {
		if parts[2] != cursorAsc {
			return cursor{}, fmt.Errorf("decode cursor: unknown direction %q", parts[2])
		}
		c.asc = true
	}
	if !validSandboxID(c.id) {
		return cursor{}, fmt.Errorf("decode cursor: invalid sandbox id %q", c.id)
	}
	if c.start, err = time.Parse(time.RFC3339Nano, parts[0]); err != nil {
		return cursor{}, fmt.Errorf("decode cursor: %w", err)
	}
	return c, nil
}

// listEntry pairs a sandbox with its sort key. The start time is stripped of
// its monotonic reading so it compares exactly like a time parsed back out
// of a cursor.
type listEntry struct {
	info  sandbox.Info
	start time.Time
}

// compareEntries orders by start time in the requested direction, then by
// id. Ascending is the exact reverse of descending (ids descend too), so the
// two directions page through the same sequence from opposite ends.
func compareEntries(aStart time.Time, aID string, bStart time.Time, bID string, asc bool) int {
	c := aStart.Compare(bStart)
	if c == 0 {
		c = -strings.Compare(aID, bID)
	}
	if asc {
		return c
	}
	return -c
}

func (h *Handler) listV2(w http.ResponseWriter, r *http.Request) error {
	lq, err := parseListQuery(r.URL.Query())
	if err != nil {
		return err
	}
	wantRunning := slices.Contains(lq.filter.States, sandbox.StateRunning)

	infos, err := h.m.List(r.Context(), lq.filter)
	if errors.Is(err, sandbox.ErrTemplateNotFound) {
		// No such template means no sandboxes from it; upstream answers an
		// empty page rather than an error here.
		if wantRunning {
			w.Header().Set(headerTotalRunning, "0")
		}
		writeJSON(w, http.StatusOK, []e2bwire.ListedSandbox{})
		return nil
	}
	if err != nil {
		return managerError(fmt.Errorf("list sandboxes: %w", err), "", lq.filter.Template)
	}

	entries := make([]listEntry, 0, len(infos))
	running := 0
	for _, info := range infos {
		// The manager already filtered; this only keeps states the API cannot
		// express (killed) out of the response and honours the request's states.
		if info.State == sandbox.StateKilled || !slices.Contains(lq.filter.States, sandbox.State(wireState(info.State))) {
			continue
		}
		if wireState(info.State) == string(sandbox.StateRunning) {
			running++
		}
		entries = append(entries, listEntry{info: info, start: info.StartedAt.Round(0)})
	}
	slices.SortFunc(entries, func(a, b listEntry) int {
		return compareEntries(a.start, a.info.ID, b.start, b.info.ID, lq.asc)
	})
	if wantRunning {
		w.Header().Set(headerTotalRunning, strconv.Itoa(running))
	}

	if c := lq.after; c != nil {
		// The cursor's own sandbox may have been killed since; searching by
		// key rather than by id resumes at the right place either way.
		i, found := slices.BinarySearchFunc(entries, c, func(e listEntry, c *cursor) int {
			return compareEntries(e.start, e.info.ID, c.start, c.id, lq.asc)
		})
		if found {
			i++
		}
		entries = entries[i:]
	}
	if len(entries) > lq.limit {
		last := entries[lq.limit-1]
		w.Header().Set(headerNextToken, cursor{start: last.start, id: last.info.ID, asc: lq.asc}.encode())
		entries = entries[:lq.limit]
	}

	out := make([]e2bwire.ListedSandbox, 0, len(entries))
	for _, e := range entries {
		out = append(out, h.listedJSON(e.info))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// listV1 serves the deprecated GET /sandboxes (JS 1.x): running sandboxes
// only, newest first, metadata the only filter, no pagination.
func (h *Handler) listV1(w http.ResponseWriter, r *http.Request) error {
	filter := sandbox.ListFilter{States: []sandbox.State{sandbox.StateRunning}}
	if v := r.URL.Query().Get("metadata"); v != "" {
		md, err := parseMetadataFilter(v)
		if err != nil {
			return err
		}
		filter.Metadata = md
	}
	infos, err := h.m.List(r.Context(), filter)
	if err != nil {
		return managerError(fmt.Errorf("list sandboxes: %w", err), "", "")
	}
	entries := make([]listEntry, 0, len(infos))
	for _, info := range infos {
		if wireState(info.State) != string(sandbox.StateRunning) || info.State == sandbox.StateKilled {
			continue
		}
		entries = append(entries, listEntry{info: info, start: info.StartedAt.Round(0)})
	}
	slices.SortFunc(entries, func(a, b listEntry) int {
		return compareEntries(a.start, a.info.ID, b.start, b.info.ID, false)
	})
	out := make([]e2bwire.ListedSandbox, 0, len(entries))
	for _, e := range entries {
		out = append(out, h.listedJSON(e.info))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
