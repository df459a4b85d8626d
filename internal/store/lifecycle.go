package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/airlock-sandbox/airlock/internal/lifecycle"
)

// lifecycleSchema holds the sandboxes' lifecycle events (internal/lifecycle).
// Unlike the events table above, they are not deleted with the sandbox's
// record: the events of a killed sandbox stay readable until PruneBefore
// drops them for age. seq orders them for the webhook feed; AUTOINCREMENT
// (an identity column on PostgreSQL) keeps a deleted row's seq from being
// handed out again, so a reader that remembers "everything up to seq N"
// never misses a later event. That also needs every event to be committed
// in seq order: see insertEvent.
const lifecycleSchema = `
CREATE TABLE IF NOT EXISTS lifecycle_events (
	seq        INTEGER PRIMARY KEY AUTOINCREMENT,
	id         TEXT NOT NULL UNIQUE,
	owner      TEXT NOT NULL,
	sandbox_id TEXT NOT NULL,
	type       TEXT NOT NULL,
	at         BIGINT NOT NULL,
	payload    TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS lifecycle_events_owner ON lifecycle_events (owner, seq);
CREATE INDEX IF NOT EXISTS lifecycle_events_sandbox ON lifecycle_events (owner, sandbox_id, seq);
CREATE INDEX IF NOT EXISTS lifecycle_events_at ON lifecycle_events (at);`

// LifecycleEvents is the store of lifecycle events: lifecycle.Recorder,
// Reader and Feed over the server's database. Make one per database
// (NewLifecycleEvents): Notify is signalled by the Records made through the
// same value.
type LifecycleEvents struct {
	db     *handle
	notify chan struct{}
}

var (
	_ lifecycle.Recorder = (*LifecycleEvents)(nil)
	_ lifecycle.Reader   = (*LifecycleEvents)(nil)
	_ lifecycle.Feed     = (*LifecycleEvents)(nil)
)

// NewLifecycleEvents returns the lifecycle event store of s.
func NewLifecycleEvents(s *DB) *LifecycleEvents {
	return &LifecycleEvents{db: s.db, notify: make(chan struct{}, 1)}
}

// Record implements lifecycle.Recorder. The row is committed before it
// returns: with SQLite in WAL mode a committed row survives a kill -9 of the
// server (a power cut may lose the last commits, as it may the sandbox
// records').
func (l *LifecycleEvents) Record(ctx context.Context, e lifecycle.Event) (lifecycle.Event, error) {
	return l.inTx(ctx, e, nil)
}

// RecordWithSandbox records e and writes sb, the sandbox record of the
// transition e tells of, in one transaction: a crash leaves both or
// neither, never a sandbox paused (or resumed, or with a new timeout) whose
// event is lost. sb goes to the sandboxes table of the database l is over,
// so l must be over the manager's store.
func (l *LifecycleEvents) RecordWithSandbox(ctx context.Context, e lifecycle.Event, sb Sandbox) (lifecycle.Event, error) {
	e, err := l.inTx(ctx, e, func(tx *txn) error { return putSandbox(ctx, tx, sb) })
	return e, err
}

// RecordWithSnapshot records e and writes sn (PutSnapshot's semantics,
// replaced included) in one transaction: a checkpointed event names a
// snapshot that exists.
func (l *LifecycleEvents) RecordWithSnapshot(ctx context.Context, e lifecycle.Event, sn Snapshot) (_ lifecycle.Event, replaced string, err error) {
	e, err = l.inTx(ctx, e, func(tx *txn) error {
		replaced, err = putSnapshot(ctx, tx, sn)
		return err
	})
	return e, replaced, err
}

// inTx records e after write (when not nil), in one transaction.
func (l *LifecycleEvents) inTx(ctx context.Context, e lifecycle.Event, write func(*txn) error) (lifecycle.Event, error) {
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return e, fmt.Errorf("store: record %s of %s: %w", e.Type, e.SandboxID, err)
	}
	defer tx.Rollback()
	if write != nil {
		if err := write(tx); err != nil {
			return e, err
		}
	}
	if e, err = insertEvent(ctx, tx, e); err != nil {
		return e, err
	}
	if err := tx.Commit(); err != nil {
		return e, fmt.Errorf("store: record %s of %s: %w", e.Type, e.SandboxID, err)
	}
	l.signal()
	return e, nil
}

// signal wakes the feed's reader (Notify) without blocking.
func (l *LifecycleEvents) signal() {
	select {
	case l.notify <- struct{}{}:
	default:
	}
}

// insertEvent adds e in tx, which it holds the events' lock in until tx
// ends. The feed (After) hands out events by seq, and a reader moves past
// every seq it was given: an event committed after one with a higher seq
// would never be read. SQLite's single writer commits in seq order; on
// PostgreSQL, where transactions of several processes commit side by side,
// the lock (taken last, so held only for the insert and the commit) makes
// seq order the commit order.
func insertEvent(ctx context.Context, tx *txn, e lifecycle.Event) (lifecycle.Event, error) {
	if e.Type == "" || e.SandboxID == "" {
		return e, fmt.Errorf("store: lifecycle event: type and sandbox id are required")
	}
	if len(e.EventData) > 0 && !json.Valid(e.EventData) {
		return e, fmt.Errorf("store: lifecycle event %s of %s: eventData is not JSON", e.Type, e.SandboxID)
	}
	if e.Version == "" {
		e.Version = lifecycle.Version
	}
	if e.Timestamp.IsZero() {
		e.Timestamp = time.Now()
	}
	e.Timestamp = e.Timestamp.UTC()
	// A random UUID, the form E2B's event ids have.
	e.ID = uuid.NewString()
	payload, err := json.Marshal(e)
	if err != nil {
		return e, fmt.Errorf("store: lifecycle event %s of %s: %w", e.Type, e.SandboxID, err)
	}
	if err := tx.lock(ctx, "lifecycle_events"); err != nil {
		return e, fmt.Errorf("store: record %s of %s: %w", e.Type, e.SandboxID, err)
	}
	err = tx.QueryRowContext(ctx, `INSERT INTO lifecycle_events (id, owner, sandbox_id, type, at, payload)
		VALUES (?, ?, ?, ?, ?, ?) RETURNING seq`,
		e.ID, e.SandboxTeamID, e.SandboxID, e.Type, e.Timestamp.UnixNano(), string(payload)).Scan(&e.Seq)
	if err != nil {
		return e, fmt.Errorf("store: record %s of %s: %w", e.Type, e.SandboxID, err)
	}
	return e, nil
}

// OwnerEvents implements lifecycle.Reader.
func (l *LifecycleEvents) OwnerEvents(ctx context.Context, owner string, p lifecycle.Page) ([]lifecycle.Event, error) {
	return l.page(ctx, `owner = ?`, []any{owner}, p)
}

// SandboxEvents implements lifecycle.Reader: another owner's sandbox has no
// events for this one.
func (l *LifecycleEvents) SandboxEvents(ctx context.Context, owner, sandboxID string, p lifecycle.Page) ([]lifecycle.Event, error) {
	return l.page(ctx, `owner = ? AND sandbox_id = ?`, []any{owner, sandboxID}, p)
}

func (l *LifecycleEvents) page(ctx context.Context, where string, args []any, p lifecycle.Page) ([]lifecycle.Event, error) {
	if p.Limit < 1 || p.Limit > lifecycle.MaxLimit || p.Offset < 0 {
		return nil, fmt.Errorf("store: lifecycle page: limit must be 1..%d and offset not negative, got %d and %d", lifecycle.MaxLimit, p.Limit, p.Offset)
	}
	if len(p.Types) > 0 {
		where += ` AND type IN (?` + strings.Repeat(`, ?`, len(p.Types)-1) + `)`
		for _, t := range p.Types {
			args = append(args, t)
		}
	}
	order := "DESC"
	if p.OrderAsc {
		order = "ASC"
	}
	args = append(args, p.Limit, p.Offset)
	return l.query(ctx, `SELECT seq, payload FROM lifecycle_events WHERE `+where+` ORDER BY seq `+order+` LIMIT ? OFFSET ?`, args...)
}

// After implements lifecycle.Feed.
func (l *LifecycleEvents) After(ctx context.Context, after int64, limit int) ([]lifecycle.Event, error) {
	if limit < 1 {
		return nil, fmt.Errorf("store: lifecycle feed: limit must be positive, got %d", limit)
	}
	return l.query(ctx, `SELECT seq, payload FROM lifecycle_events WHERE seq > ? ORDER BY seq LIMIT ?`, after, limit)
}

// Notify implements lifecycle.Feed.
func (l *LifecycleEvents) Notify() <-chan struct{} { return l.notify }

// PruneBefore deletes the events recorded before t, of live and killed
// sandboxes alike, and returns how many it deleted.
func (l *LifecycleEvents) PruneBefore(ctx context.Context, t time.Time) (int64, error) {
	res, err := l.db.ExecContext(ctx, `DELETE FROM lifecycle_events WHERE at < ?`, t.UnixNano())
	if err != nil {
		return 0, fmt.Errorf("store: prune lifecycle events: %w", err)
	}
	n, _ := res.RowsAffected()
	return n, nil
}

func (l *LifecycleEvents) query(ctx context.Context, q string, args ...any) ([]lifecycle.Event, error) {
	rows, err := l.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("store: lifecycle events: %w", err)
	}
	defer rows.Close()
	out := []lifecycle.Event{}
	for rows.Next() {
		var (
			seq     int64
			payload string
		)
		if err := rows.Scan(&seq, &payload); err != nil {
			return nil, fmt.Errorf("store: scan lifecycle event: %w", err)
		}
		var e lifecycle.Event
		if err := json.Unmarshal([]byte(payload), &e); err != nil {
			return nil, fmt.Errorf("store: lifecycle event %d: %w", seq, err)
		}
		e.Seq = seq
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: lifecycle events: %w", err)
	}
	return out, nil
}
