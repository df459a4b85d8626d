package sandbox

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/envdapi"
	"github.com/airlock-sandbox/airlock/internal/lifecycle"
	"github.com/airlock-sandbox/airlock/internal/sandboxlog"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// A sandbox's log (GET /v2/sandboxes/{id}/logs, `e2b sandbox logs`) has two
// sources, merged by time when read:
//   - what envd wrote in the sandbox's run directory (internal/sandboxlog:
//     processes started and ended, the start command's output, envd's
//     errors), read from disk, so envd need not be up and a paused
//     sandbox's log reads as well as a running one's;
//   - what the host wrote to the store (store.LogStore: OOM kills, the
//     template's readiness), which the sandbox cannot touch.
// At kill the sandbox's entries (the newest keptAtKill) move to the store
// with its owner, and the whole log is kept for LogRetention after.

// DefaultLogRetention is how long a killed sandbox's log stays readable.
const DefaultLogRetention = 7 * 24 * time.Hour

// keptAtKill bounds what of envd's entries the store keeps for a killed
// sandbox.
const keptAtKill = 1000

// LogEntry is one line of a sandbox's log as the logs endpoints report it.
type LogEntry struct {
	Time    time.Time
	Level   string // "debug", "info", "warn", "error"
	Logger  string // "envd.process", "envd.output", "envd", "airlock.oom", ...
	Message string
	Fields  map[string]string
	// Origin is sandboxlog.OriginSandbox or OriginHost: whether the sandbox
	// could have written the entry.
	Origin string
}

// LogQuery selects a page of a sandbox's log.
type LogQuery struct {
	// Owner, when set, must own the sandbox (else ErrNotFound).
	Owner string
	// Cursor is where the page starts (millisecond precision): entries at
	// or after it going forward, at or before it going backward (zero:
	// the start, or now).
	Cursor   time.Time
	Backward bool
	// MinLevel keeps entries of that level or above ("" keeps all).
	MinLevel string
	// Search keeps entries whose message contains it (case-sensitive).
	Search string
	// Limit bounds the page (<= 0: no bound).
	Limit int
}

// Logs returns a page of a sandbox's log: a live or paused sandbox's, or a
// killed one's within the retention period.
func (m *Manager) Logs(ctx context.Context, id string, q LogQuery) ([]LogEntry, error) {
	ls, _ := m.opts.Store.(store.LogStore)
	var all []LogEntry
	_, info, err := m.view(id)
	switch {
	case err == nil:
		if q.Owner != "" && info.Owner != "" && info.Owner != q.Owner {
			return nil, notFound(id)
		}
		inside, rerr := sandboxlog.Read(filepath.Join(m.sandboxDir(id), envdapi.HostRunDir))
		if rerr != nil {
			// What could be read is served; the rest is the sandbox's
			// doing, and debug: a sandbox must not fill the host's log.
			m.log.Debug("sandbox log", "id", id, "err", rerr)
		}
		for _, e := range inside {
			all = append(all, fromSandboxlog(e))
		}
	case errors.Is(err, ErrNotFound) && ls != nil:
		owner, _, lerr := ls.LogEnd(ctx, id)
		if lerr != nil || (q.Owner != "" && owner != "" && owner != q.Owner) {
			return nil, err
		}
	default:
		return nil, err
	}
	if ls != nil {
		stored, err := ls.Logs(ctx, id)
		if err != nil {
			return nil, err
		}
		for _, e := range stored {
			all = append(all, LogEntry(e))
		}
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].Time.Before(all[j].Time) })
	return PageLogs(all, q), nil
}

func fromSandboxlog(e sandboxlog.Entry) LogEntry {
	return LogEntry{Time: e.Time, Level: e.Level, Logger: e.Logger, Message: e.Message, Fields: e.Fields, Origin: e.Origin}
}

// PageLogs filters entries (oldest first) by q and cuts the page. A page
// cut short by the limit ends on a whole millisecond when it can, so that a
// client asking again from the last entry's millisecond + 1 (the CLI's
// follow) misses nothing.
func PageLogs(entries []LogEntry, q LogQuery) []LogEntry {
	minRank, _ := sandboxlog.Rank(q.MinLevel)
	cursor := q.Cursor.UnixMilli()
	keep := func(e LogEntry) bool {
		if r, _ := sandboxlog.Rank(e.Level); r < minRank {
			return false
		}
		if q.Search != "" && !strings.Contains(e.Message, q.Search) {
			return false
		}
		if q.Cursor.IsZero() {
			return true
		}
		if q.Backward {
			return e.Time.UnixMilli() <= cursor
		}
		return e.Time.UnixMilli() >= cursor
	}
	out := []LogEntry{}
	if q.Backward {
		for i := len(entries) - 1; i >= 0; i-- {
			if keep(entries[i]) {
				out = append(out, entries[i])
			}
		}
	} else {
		for _, e := range entries {
			if keep(e) {
				out = append(out, e)
			}
		}
	}
	if q.Limit > 0 && len(out) > q.Limit {
		cut := q.Limit
		last := out[cut-1].Time.UnixMilli()
		if out[cut].Time.UnixMilli() == last {
			for cut > 0 && out[cut-1].Time.UnixMilli() == last {
				cut--
			}
			if cut == 0 {
				// One millisecond holds more than a page: cut inside it.
				cut = q.Limit
			}
		}
		out = out[:cut]
	}
	return out
}

// hostLog records an entry the host vouches for, off the caller's path.
func (m *Manager) hostLog(id, level, logger, msg string, fields map[string]string) {
	ls, ok := m.opts.Store.(store.LogStore)
	if !ok {
		return
	}
	e := store.LogEntry{Time: time.Now(), Level: level, Logger: logger, Message: msg, Fields: fields, Origin: sandboxlog.OriginHost}
	m.background(func() {
		if err := ls.AddLogs(context.Background(), id, []store.LogEntry{e}); err != nil {
			m.log.Error("record sandbox log entry", "id", id, "err", err)
		}
	})
}

// keepLogs moves what envd logged in a sandbox that is being killed into
// the store, with its owner (the teardown removes the files), ends it with
// the host's word on the kill and its reason (a lifecycle.Kill* value), and
// sweeps the logs past the retention off the kill's path. The caller holds
// e.op.
func (m *Manager) keepLogs(e *entry, reason string) {
	ls, ok := m.opts.Store.(store.LogStore)
	if !ok {
		return
	}
	e.mu.Lock()
	owner := e.info.Owner
	e.mu.Unlock()
	inside, err := sandboxlog.Read(filepath.Join(e.dir, envdapi.HostRunDir))
	if err != nil {
		m.log.Debug("sandbox log at kill", "id", e.id, "err", err)
	}
	inside = inside[max(0, len(inside)-keptAtKill):]
	kept := make([]store.LogEntry, 0, len(inside))
	for _, s := range inside {
		kept = append(kept, store.LogEntry{Time: s.Time, Level: s.Level, Logger: s.Logger, Message: s.Message, Fields: s.Fields, Origin: s.Origin})
	}
	now, id := time.Now(), e.id
	level := "info"
	if reason != lifecycle.KillRequest && reason != lifecycle.KillTimeout && reason != lifecycle.KillShutdown {
		// The sandbox did not end as its owner asked.
		level = "warn"
	}
	kept = append(kept, store.LogEntry{Time: now, Level: level, Logger: "airlock.lifecycle", Message: "sandbox killed: " + reason,
		Fields: map[string]string{"reason": reason}, Origin: sandboxlog.OriginHost})
	// In the kill's path, so that the log reads on without a gap: one
	// transaction of at most keptAtKill rows (measured in
	// TestSandboxLogStory).
	if err := ls.EndLogs(context.Background(), id, owner, now, kept); err != nil {
		m.log.Error("keep the log of a killed sandbox", "id", id, "err", err)
	}
	retention := m.opts.LogRetention
	if retention <= 0 {
		retention = DefaultLogRetention
	}
	// The sweep reads the whole log table: once per kill, killing a
	// thousand sandboxes ran a thousand sweeps over a table that grows with
	// them (a third of the server's CPU while 1,500 were killed), holding
	// the store's write lock that the kills' own writes wait for. Once per
	// logSweepEvery (a quarter of the retention, if shorter) is as good.
	last := m.lastLogSweep.Load()
	if now.Sub(time.Unix(0, last)) < min(retention/4, logSweepEvery) || !m.lastLogSweep.CompareAndSwap(last, now.UnixNano()) {
		return
	}
	m.background(func() {
		if _, err := ls.SweepLogs(context.Background(), now.Add(-retention)); err != nil {
			m.log.Error("sweep sandbox logs", "err", err)
		}
	})
}

// logSweepEvery is how often at most a kill sweeps the logs past their
// retention.
const logSweepEvery = time.Minute

// logStartPhase tells the sandbox's log how its template's start phase
// ended. A failed create leaves no sandbox to read it from, but a failed
// cold resume does.
func (m *Manager) logStartPhase(id string, tpl Template, began time.Time, err error) {
	fields := map[string]string{"template": templateName(tpl), "durationMs": strconv.FormatInt(time.Since(began).Milliseconds(), 10)}
	if tpl.StartCmd != "" {
		fields["startCmd"] = tpl.StartCmd
	}
	if tpl.ReadyCmd != "" {
		fields["readyCmd"] = tpl.ReadyCmd
	}
	if err != nil {
		m.hostLog(id, sandboxlog.Error, "airlock.template", err.Error(), fields)
		return
	}
	msg := "template started: start command running"
	if tpl.ReadyCmd != "" {
		msg = fmt.Sprintf("template ready: ready command `%s` succeeded after %s", tpl.ReadyCmd, time.Since(began).Round(time.Millisecond))
	}
	m.hostLog(id, sandboxlog.Info, "airlock.template", msg, fields)
}
