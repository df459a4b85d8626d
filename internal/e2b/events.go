package e2b

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/lifecycle"
)

// The lifecycle events API (E2B's "lifecycle-events-api"): the latest events
// of the API key's sandboxes, or of one of them, newest first unless
// orderAsc. Events outlive their sandbox for the server's retention period
// (serve --events-retention). Every read is scoped to the key's owner: a
// sandbox of another key answers an empty list, as one that never existed
// does, so the API tells no key which ids another key uses.

// defaultEventsLimit is E2B's default page size.
const defaultEventsLimit = 10

func (h *Handler) routeEvents() {
	h.handle("GET /events/sandboxes", h.ownerEvents)
	h.handle("GET /events/sandboxes/{sandboxID}", h.sandboxEvents)
}

func (h *Handler) ownerEvents(w http.ResponseWriter, r *http.Request) error {
	if h.opts.Events == nil {
		return &apiError{status: http.StatusNotImplemented, message: "this server keeps no lifecycle events"}
	}
	p, err := parseEventsPage(r.URL.Query())
	if err != nil {
		return err
	}
	evs, err := h.opts.Events.OwnerEvents(r.Context(), ownerFrom(r.Context()), p)
	if err != nil {
		return fmt.Errorf("lifecycle events: %w", err)
	}
	writeJSON(w, http.StatusOK, evs)
	return nil
}

func (h *Handler) sandboxEvents(w http.ResponseWriter, r *http.Request) error {
	if h.opts.Events == nil {
		return &apiError{status: http.StatusNotImplemented, message: "this server keeps no lifecycle events"}
	}
	id, err := sandboxIDParam(r)
	if err != nil {
		return err
	}
	p, err := parseEventsPage(r.URL.Query())
	if err != nil {
		return err
	}
	evs, err := h.opts.Events.SandboxEvents(r.Context(), ownerFrom(r.Context()), id, p)
	if err != nil {
		return fmt.Errorf("lifecycle events of %s: %w", id, err)
	}
	writeJSON(w, http.StatusOK, evs)
	return nil
}

// parseEventsPage reads offset, limit, orderAsc and types. Unlike the
// sandbox list's limit, which is clamped as upstream's helper does, a value
// outside what E2B documents here is refused: a client that asks for 500
// events and silently gets 100 pages wrongly.
func parseEventsPage(q url.Values) (lifecycle.Page, error) {
	p := lifecycle.Page{Limit: defaultEventsLimit}
	if v := q.Get("offset"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return p, badRequest("Invalid offset %q: must be an integer of at least 0", v)
		}
		p.Offset = n
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > lifecycle.MaxLimit {
			return p, badRequest("Invalid limit %q: must be an integer between 1 and %d", v, lifecycle.MaxLimit)
		}
		p.Limit = n
	}
	if v := q.Get("orderAsc"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return p, badRequest("Invalid orderAsc %q: must be true or false", v)
		}
		p.OrderAsc = b
	}
	// Repeated (E2B's form) or comma-separated.
	for _, v := range q["types"] {
		for _, t := range strings.Split(v, ",") {
			t = strings.TrimSpace(t)
			if !slices.Contains(lifecycle.Types, t) {
				return p, badRequest("Invalid types value %q: must be one of %s", t, strings.Join(lifecycle.Types, ", "))
			}
			if !slices.Contains(p.Types, t) {
				p.Types = append(p.Types, t)
			}
		}
	}
	return p, nil
}
