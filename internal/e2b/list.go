package e2b

import (
	"container/heap"
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
	pageQuery
}

// pageQuery is the paging part of a list request (docs/E2B-WIRE.md §2.5),
// shared by GET /v2/sandboxes and GET /snapshots.
type pageQuery struct {
	asc   bool
	limit int
	after *cursor // nil on the first page
}

// parsePage reads limit and nextToken for a list in direction asc. validID
// checks the id inside a token: each list has its own id syntax, and a
// token naming an impossible id was not minted here.
func parsePage(q url.Values, asc bool, validID func(string) bool) (pageQuery, error) {
	pq := pageQuery{asc: asc, limit: listDefaultLimit}
	if v := q.Get("limit"); v != "" {
		var err error
		if pq.limit, err = parseLimit(v, listMaxLimit); err != nil {
			return pq, err
		}
	}
	if v := q.Get("nextToken"); v != "" {
		c, err := decodeCursor(v, validID)
		if err != nil || c.asc != asc {
			return pq, badRequest("Invalid next token")
		}
		pq.after = &c
	}
	return pq, nil
}

// parseListQuery validates every parameter before anything is listed, so a
// typo (order=ascending, state=stopped) is a 400 rather than a silently
// different page.
func parseListQuery(q url.Values) (listQuery, error) {
	var lq listQuery

	states, err := parseStates(q["state"])
	if err != nil {
		return lq, err
	}
	lq.filter.States = states

	asc := false
	switch order := q.Get("order"); order {
	case "", "desc":
	case "asc":
		asc = true
	default:
		return lq, badRequest("Invalid order parameter %q: must be asc or desc", order)
	}

	if lq.pageQuery, err = parsePage(q, asc, validSandboxID); err != nil {
		return lq, err
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

// cursor is the position after which the next page starts: the time and id
// of the last item returned.
type cursor struct {
	start time.Time
	id    string
	asc   bool
}

// encode renders the cursor as URL-safe base64 of "<RFC3339Nano>__<id>"
// ("__asc" appended for ascending). The time has no "__", so the first one
// ends it; sandbox ids are [a-z0-9] and snapshot ids end in ":<tag>", so
// neither ends in "__asc".
func (c cursor) encode() string {
	s := c.start.UTC().Format(time.RFC3339Nano) + "__" + c.id
	if c.asc {
		s += "__" + cursorAsc
	}
	return base64.RawURLEncoding.EncodeToString([]byte(s))
}

func decodeCursor(token string, validID func(string) bool) (cursor, error) {
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(token, "="))
	if err != nil {
		return cursor{}, fmt.Errorf("decode cursor: %w", err)
	}
	start, rest, ok := strings.Cut(string(raw), "__")
	if !ok {
		return cursor{}, errors.New("decode cursor: want <time>__<id>[__asc]")
	}
	c := cursor{id: rest}
	if id, ok := strings.CutSuffix(rest, "__"+cursorAsc); ok {
		c.id, c.asc = id, true
	}
	if !validID(c.id) {
		return cursor{}, fmt.Errorf("decode cursor: invalid id %q", c.id)
	}
	if c.start, err = time.Parse(time.RFC3339Nano, start); err != nil {
		return cursor{}, fmt.Errorf("decode cursor: %w", err)
	}
	return c, nil
}

// pageKey is an item's place in a list: its time, stripped of the monotonic
// reading so it compares exactly like a time parsed back out of a cursor,
// and its id.
type pageKey struct {
	start time.Time
	id    string
}

func keyOf(start time.Time, id string) pageKey { return pageKey{start: start.Round(0), id: id} }

// compareKeys orders by time in the requested direction, then by id.
// Ascending is the exact reverse of descending (ids descend too), so the two
// directions page through the same sequence from opposite ends.
func compareKeys(a, b pageKey, asc bool) int {
	c := a.start.Compare(b.start)
	if c == 0 {
		c = -strings.Compare(a.id, b.id)
	}
	if asc {
		return c
	}
	return -c
}

// sortPage returns items sorted in page order (ascending if asc), a new
// slice.
func sortPage[T any](items []T, key func(T) pageKey, asc bool) []T {
	return pick(items, sortedKeys(items, key, asc))
}

// pick copies the items order names, in its order.
func pick[T any](items []T, order []keyed) []T {
	out := make([]T, len(order))
	for j, o := range order {
		out[j] = items[o.i]
	}
	return out
}

// keyed is an item's page key and its index.
type keyed struct {
	k pageKey
	i int
}

// sortedKeys is items' keys in page order. Each key is taken once and the
// items are not moved: an item can be large (a sandbox's Info), and a sort
// that took keys from copies at each comparison and swapped the items
// themselves copied megabytes per list at a thousand sandboxes.
func sortedKeys[T any](items []T, key func(T) pageKey, asc bool) []keyed {
	order := make([]keyed, len(items))
	for i := range items {
		order[i] = keyed{key(items[i]), i}
	}
	slices.SortFunc(order, func(a, b keyed) int { return compareKeys(a.k, b.k, asc) })
	return order
}

// page returns at most pq.limit of items, in page order from just after pq's
// cursor, setting X-Next-Token only when another page exists (the SDKs'
// hasNext is the header's presence). Only the page is ordered: one pass keeps
// the limit+1 first items after the cursor in a bounded heap, instead of a
// sort of them all (a thousand sandboxes for a page of ten), and only the
// page's items are copied.
func page[T any](w http.ResponseWriter, items []T, key func(T) pageKey, pq pageQuery) []T {
	var after *pageKey
	if c := pq.after; c != nil {
		// The cursor's own item may have gone since; comparing keys rather
		// than looking for its id resumes at the right place either way.
		after = &pageKey{start: c.start, id: c.id}
	}
	first := &firstKeys{asc: pq.asc, n: pq.limit + 1}
	for i := range items {
		k := key(items[i])
		if after != nil && compareKeys(k, *after, pq.asc) <= 0 {
			continue
		}
		first.offer(keyed{k, i})
	}
	order := first.keys
	slices.SortFunc(order, func(a, b keyed) int { return compareKeys(a.k, b.k, pq.asc) })
	if len(order) > pq.limit {
		last := order[pq.limit-1].k
		w.Header().Set(headerNextToken, cursor{start: last.start, id: last.id, asc: pq.asc}.encode())
		order = order[:pq.limit]
	}
	return pick(items, order)
}

// firstKeys keeps the n first keys offered, in page order: a heap whose root
// is the last of them, which a key before it replaces.
type firstKeys struct {
	asc  bool
	n    int
	keys []keyed
}

func (f *firstKeys) Len() int           { return len(f.keys) }
func (f *firstKeys) Less(i, j int) bool { return compareKeys(f.keys[i].k, f.keys[j].k, f.asc) > 0 }
func (f *firstKeys) Swap(i, j int)      { f.keys[i], f.keys[j] = f.keys[j], f.keys[i] }
func (f *firstKeys) Push(x any)         { f.keys = append(f.keys, x.(keyed)) }
func (f *firstKeys) Pop() any {
	last := f.keys[len(f.keys)-1]
	f.keys = f.keys[:len(f.keys)-1]
	return last
}

func (f *firstKeys) offer(k keyed) {
	switch {
	case len(f.keys) < f.n:
		heap.Push(f, k)
	case compareKeys(k.k, f.keys[0].k, f.asc) < 0:
		f.keys[0] = k
		heap.Fix(f, 0)
	}
}

func sandboxKey(info sandbox.Info) pageKey { return keyOf(info.StartedAt, info.ID) }

func (h *Handler) listV2(w http.ResponseWriter, r *http.Request) error {
	lq, err := parseListQuery(r.URL.Query())
	if err != nil {
		return err
	}
	wantRunning := slices.Contains(lq.filter.States, sandbox.StateRunning)

	// Keys of every match, then the Infos of the page's alone.
	lq.filter.Owner = ownerFrom(r.Context())
	keys, err := h.sbx(r.Context()).ListKeys(r.Context(), lq.filter)
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

	// Filtered in place: the manager's keys are this request's own copy.
	listed := func(s sandbox.State) bool {
		// The manager already filtered; this only keeps states the API cannot
		// express (killed) out of the response and honours the request's states.
		return s != sandbox.StateKilled && slices.Contains(lq.filter.States, sandbox.State(wireState(s)))
	}
	kept := keys[:0]
	running := 0
	for _, k := range keys {
		if !listed(k.State) {
			continue
		}
		if wireState(k.State) == string(sandbox.StateRunning) {
			running++
		}
		kept = append(kept, k)
	}
	if wantRunning {
		w.Header().Set(headerTotalRunning, strconv.Itoa(running))
	}

	kept = page(w, kept, func(k sandbox.ListKey) pageKey { return keyOf(k.StartedAt, k.ID) }, lq.pageQuery)
	out := make([]e2bwire.ListedSandbox, 0, len(kept))
	for _, k := range kept {
		info, err := h.sbx(r.Context()).Get(r.Context(), k.ID)
		if err != nil || !listed(info.State) {
			continue // gone, or changed state, since its key was taken
		}
		out = append(out, h.listedJSON(info))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// listV1 serves the deprecated GET /sandboxes (JS 1.x): running sandboxes
// only, newest first, metadata the only filter, no pagination.
func (h *Handler) listV1(w http.ResponseWriter, r *http.Request) error {
	filter := sandbox.ListFilter{Owner: ownerFrom(r.Context()), States: []sandbox.State{sandbox.StateRunning}}
	if v := r.URL.Query().Get("metadata"); v != "" {
		md, err := parseMetadataFilter(v)
		if err != nil {
			return err
		}
		filter.Metadata = md
	}
	infos, err := h.sbx(r.Context()).List(r.Context(), filter)
	if err != nil {
		return managerError(fmt.Errorf("list sandboxes: %w", err), "", "")
	}
	kept := make([]sandbox.Info, 0, len(infos))
	for _, info := range infos {
		if wireState(info.State) != string(sandbox.StateRunning) || info.State == sandbox.StateKilled {
			continue
		}
		kept = append(kept, info)
	}
	kept = sortPage(kept, sandboxKey, false)
	out := make([]e2bwire.ListedSandbox, 0, len(kept))
	for _, info := range kept {
		out = append(out, h.listedJSON(info))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
