package dashboard

import (
	"net/http"
	"time"

	"github.com/airlock-sandbox/airlock/internal/lifecycle"
	"github.com/airlock-sandbox/airlock/internal/metrics"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

const (
	// createsWindow is the span of the creates-per-minute chart.
	createsWindow = 60
	// maxCreateEvents bounds the events read for that chart: beyond it the
	// oldest minutes show fewer than were made (100 creates a minute for
	// the whole hour is more than a 2-core host starts).
	maxCreateEvents = 6000
)

type minuteJSON struct {
	Minute time.Time `json:"minute"`
	Count  int       `json:"count"`
}

// overview is the key's running and paused counts, its creates per minute
// over the last hour, and the host's headroom.
func (d *Dashboard) overview(w http.ResponseWriter, r *http.Request) {
	s := sessionFrom(r.Context())
	all, err := d.o.Sandboxes.List(r.Context(), sandbox.ListFilter{States: []sandbox.State{sandbox.StateRunning, sandbox.StatePaused}})
	if err != nil {
		writeError(w, http.StatusInternalServerError, "Listing the sandboxes failed: "+err.Error())
		return
	}
	out := struct {
		Running          int          `json:"running"`
		Paused           int          `json:"paused"`
		CreatesPerMinute []minuteJSON `json:"createsPerMinute"`
		Host             metrics.Host `json:"host"`
	}{Host: metrics.ReadHost(d.o.DataDir)}
	for _, in := range all {
		if in.Owner != s.owner {
			continue
		}
		if in.State == sandbox.StatePaused {
			out.Paused++
		} else {
			out.Running++
		}
	}
	now := d.o.Now().UTC().Truncate(time.Minute)
	first := now.Add(-(createsWindow - 1) * time.Minute)
	counts := make([]int, createsWindow)
	if d.o.Events != nil {
	pages:
		for offset := 0; offset < maxCreateEvents; offset += lifecycle.MaxLimit {
			evs, err := d.o.Events.OwnerEvents(r.Context(), s.owner, lifecycle.Page{
				Offset: offset, Limit: lifecycle.MaxLimit, Types: []string{lifecycle.Created}})
			if err != nil {
				writeError(w, http.StatusInternalServerError, "Reading the events failed: "+err.Error())
				return
			}
			for _, e := range evs { // newest first
				if e.Timestamp.Before(first) {
					break pages
				}
				if i := int(e.Timestamp.UTC().Sub(first) / time.Minute); i >= 0 && i < createsWindow {
					counts[i]++
				}
			}
			if len(evs) < lifecycle.MaxLimit {
				break
			}
		}
	}
	for i, n := range counts {
		out.CreatesPerMinute = append(out.CreatesPerMinute, minuteJSON{Minute: first.Add(time.Duration(i) * time.Minute), Count: n})
	}
	writeJSON(w, http.StatusOK, out)
}
