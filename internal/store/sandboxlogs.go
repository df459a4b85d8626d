package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// The sandbox log's host side (internal/sandboxlog has the format): entries
// the host writes itself (OOM kills, a template's readiness), and, once a
// sandbox is killed, the entries envd had written in its directory, kept
// with the owner for the retention period so the logs endpoints still
// answer for the killed sandbox.

// LogEntry is one stored entry of a sandbox's log.
type LogEntry struct {
	Time    time.Time
	Level   string
	Logger  string
	Message string
	Fields  map[string]string
	Origin  string
}

// LogStore is the sandbox log's part of a store; DB implements it.
type LogStore interface {
	// AddLogs appends entries to a sandbox's log, keeping at most
	// MaxLogEntries (the newest).
	AddLogs(ctx context.Context, sandboxID string, entries []LogEntry) error
	// Logs returns a sandbox's stored entries, oldest first.
	Logs(ctx context.Context, sandboxID string) ([]LogEntry, error)
	// EndLogs stores entries (what the sandbox itself logged: they replace
	// any of origin "sandbox" stored before) and marks the sandbox's log
	// ended (killed at `at`, owned by owner), in one transaction.
	EndLogs(ctx context.Context, sandboxID, owner string, at time.Time, entries []LogEntry) error
	// LogEnd tells whether a sandbox's log was ended and by whom it is
	// owned; ErrNotFound when it was not.
	LogEnd(ctx context.Context, sandboxID string) (owner string, at time.Time, err error)
	// SweepLogs deletes the logs of sandboxes killed before `before`, and
	// of those that have neither a record nor an end (a create that
	// failed, a pooled sandbox never handed out). It returns how many
	// sandboxes' logs went.
	SweepLogs(ctx context.Context, before time.Time) (int, error)
}

// MaxLogEntries bounds what the store keeps of one sandbox's log.
const MaxLogEntries = 5000

const logSchema = `
CREATE TABLE IF NOT EXISTS sandbox_logs (
	sandbox_id TEXT NOT NULL,
	at         BIGINT NOT NULL,
	level      TEXT NOT NULL,
	logger     TEXT NOT NULL,
	message    TEXT NOT NULL,
	fields     TEXT NOT NULL DEFAULT '{}',
	origin     TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS sandbox_logs_sandbox ON sandbox_logs (sandbox_id, at);
CREATE TABLE IF NOT EXISTS sandbox_log_ends (
	sandbox_id TEXT PRIMARY KEY,
	owner      TEXT NOT NULL,
	ended_at   BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS sandbox_log_ends_at ON sandbox_log_ends (ended_at);`

var _ LogStore = (*DB)(nil)

// addLogs appends entries to a sandbox's log in tx, then trims it to the
// newest MaxLogEntries. It holds the log's lock until tx ends, so two
// processes writing one sandbox's log on PostgreSQL trim it one after the
// other.
func addLogs(ctx context.Context, tx *txn, sandboxID string, entries []LogEntry) error {
	if len(entries) == 0 {
		return nil
	}
	if err := tx.lock(ctx, "sandbox_logs", sandboxID); err != nil {
		return fmt.Errorf("store: add logs of %s: %w", sandboxID, err)
	}
	// One statement for all rows (BenchmarkEndLogs, 1,000 rows: 16 ms
	// parsed per row, 11 ms prepared; 20 rows: 0.5 ms).
	ins, err := tx.PrepareContext(ctx, `INSERT INTO sandbox_logs (sandbox_id, at, level, logger, message, fields, origin) VALUES (?, ?, ?, ?, ?, ?, ?)`)
	if err != nil {
		return fmt.Errorf("store: add logs of %s: %w", sandboxID, err)
	}
	defer ins.Close()
	for _, e := range entries {
		f, err := json.Marshal(nonNil(e.Fields))
		if err != nil {
			return fmt.Errorf("store: log fields: %w", err)
		}
		if _, err := ins.ExecContext(ctx, sandboxID, e.Time.UnixNano(), logText(e.Level), logText(e.Logger), logText(e.Message), string(f), logText(e.Origin)); err != nil {
			return fmt.Errorf("store: add log of %s: %w", sandboxID, err)
		}
	}
	// Newest kept: a sandbox that OOMs every few seconds for weeks must not
	// grow the database without bound. The oldest entry kept bounds what
	// goes (at, then insertion order).
	var at, rowid int64
	err = tx.QueryRowContext(ctx, `SELECT at, rowid FROM sandbox_logs WHERE sandbox_id = ? ORDER BY at DESC, rowid DESC LIMIT 1 OFFSET ?`,
		sandboxID, MaxLogEntries-1).Scan(&at, &rowid)
	if errors.Is(err, sql.ErrNoRows) {
		return nil // not full
	}
	if err != nil {
		return fmt.Errorf("store: trim log of %s: %w", sandboxID, err)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM sandbox_logs WHERE sandbox_id = ? AND (at < ? OR (at = ? AND rowid < ?))`,
		sandboxID, at, at, rowid); err != nil {
		return fmt.Errorf("store: trim log of %s: %w", sandboxID, err)
	}
	return nil
}

// logText is s as both databases store it: PostgreSQL's text holds no NUL
// byte and no invalid UTF-8, which a sandbox's log may have (each becomes
// U+FFFD, on SQLite too, so the two read back the same).
func logText(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	return strings.ReplaceAll(s, "\x00", "\uFFFD")
}

func (s *DB) AddLogs(ctx context.Context, sandboxID string, entries []LogEntry) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: add logs of %s: %w", sandboxID, err)
	}
	defer tx.Rollback()
	if err := addLogs(ctx, tx, sandboxID, entries); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: add logs of %s: %w", sandboxID, err)
	}
	return nil
}

func (s *DB) Logs(ctx context.Context, sandboxID string) ([]LogEntry, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT at, level, logger, message, fields, origin FROM sandbox_logs WHERE sandbox_id = ? ORDER BY at, rowid`, sandboxID)
	if err != nil {
		return nil, fmt.Errorf("store: logs of %s: %w", sandboxID, err)
	}
	defer rows.Close()
	var out []LogEntry
	for rows.Next() {
		var (
			at     int64
			fields string
			e      LogEntry
		)
		if err := rows.Scan(&at, &e.Level, &e.Logger, &e.Message, &fields, &e.Origin); err != nil {
			return nil, fmt.Errorf("store: logs of %s: %w", sandboxID, err)
		}
		e.Time = time.Unix(0, at)
		if err := json.Unmarshal([]byte(fields), &e.Fields); err != nil {
			return nil, fmt.Errorf("store: log fields of %s: %w", sandboxID, err)
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

func (s *DB) EndLogs(ctx context.Context, sandboxID, owner string, at time.Time, entries []LogEntry) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: end logs of %s: %w", sandboxID, err)
	}
	defer tx.Rollback()
	if err := tx.lock(ctx, "sandbox_logs", sandboxID); err != nil {
		return fmt.Errorf("store: end logs of %s: %w", sandboxID, err)
	}
	// Entries of the sandbox's origin stored by an earlier EndLogs (a kill
	// a crash cut short, whose sandbox Recover re-adopted) are in entries
	// again.
	if _, err := tx.ExecContext(ctx, `DELETE FROM sandbox_logs WHERE sandbox_id = ? AND origin = 'sandbox'`, sandboxID); err != nil {
		return fmt.Errorf("store: end logs of %s: %w", sandboxID, err)
	}
	if err := addLogs(ctx, tx, sandboxID, entries); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO sandbox_log_ends (sandbox_id, owner, ended_at) VALUES (?, ?, ?)
		ON CONFLICT (sandbox_id) DO UPDATE SET owner = excluded.owner, ended_at = excluded.ended_at`,
		sandboxID, owner, at.UnixNano()); err != nil {
		return fmt.Errorf("store: end logs of %s: %w", sandboxID, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: end logs of %s: %w", sandboxID, err)
	}
	return nil
}

func (s *DB) LogEnd(ctx context.Context, sandboxID string) (string, time.Time, error) {
	var (
		owner string
		at    int64
	)
	err := s.db.QueryRowContext(ctx, `SELECT owner, ended_at FROM sandbox_log_ends WHERE sandbox_id = ?`, sandboxID).Scan(&owner, &at)
	if errors.Is(err, sql.ErrNoRows) {
		return "", time.Time{}, fmt.Errorf("%w: log of %s", ErrNotFound, sandboxID)
	}
	if err != nil {
		return "", time.Time{}, fmt.Errorf("store: log end of %s: %w", sandboxID, err)
	}
	return owner, time.Unix(0, at), nil
}

func (s *DB) SweepLogs(ctx context.Context, before time.Time) (int, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("store: sweep logs: %w", err)
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, `DELETE FROM sandbox_log_ends WHERE ended_at < ?`, before.UnixNano())
	if err != nil {
		return 0, fmt.Errorf("store: sweep logs: %w", err)
	}
	n, _ := res.RowsAffected()
	// Entries of a sandbox with neither record nor end are swept only once
	// as old as the retention: a pooled sandbox has no record until it is
	// claimed, and its start phase's entries must wait for it.
	if _, err := tx.ExecContext(ctx, `DELETE FROM sandbox_logs WHERE at < ? AND sandbox_id NOT IN (SELECT id FROM sandboxes)
		AND sandbox_id NOT IN (SELECT sandbox_id FROM sandbox_log_ends)`, before.UnixNano()); err != nil {
		return 0, fmt.Errorf("store: sweep logs: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("store: sweep logs: %w", err)
	}
	return int(n), nil
}
