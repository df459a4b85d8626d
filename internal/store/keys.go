package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"
)

// Team is the record of a team: who owns sandboxes, templates, volumes,
// secrets, webhooks and events (their owner column holds its ID).
type Team struct {
	ID        string
	Name      string
	CreatedAt time.Time
	// Quotas is the team's limits as JSON (internal/apikey owns its shape);
	// empty means the server's defaults.
	Quotas string
}

// APIKey is the record of a key Airlock made: never the key itself, only
// its SHA-256 (Hash, hex) and the parts shown to tell it apart (Prefix,
// MaskPrefix, MaskSuffix, Length).
type APIKey struct {
	ID, TeamID, Name string
	Hash             string
	Prefix           string
	MaskPrefix       string
	MaskSuffix       string
	Length           int
	// Scopes as internal/apikey writes them (space-separated).
	Scopes    string
	CreatedAt time.Time
	// CreatedBy is the ID of the key that made it ("" for the CLI).
	CreatedBy string
	RevokedAt time.Time // zero: not revoked
	LastUsed  time.Time // zero: never used
}

// AuditEntry is one line of the audit log: who did what to what, when, and
// how it went. It never holds a secret value.
type AuditEntry struct {
	Seq        int64
	At         time.Time
	KeyID      string
	KeyName    string
	TeamID     string
	Action     string // e.g. sandbox.create, key.revoke
	TargetKind string // sandbox, template, volume, key, ...
	TargetID   string
	Status     int    // the HTTP status answered (0: not an HTTP request)
	Detail     string // what else tells the story (no secret values)
}

const keySchema = `
CREATE TABLE IF NOT EXISTS teams (
	id         TEXT PRIMARY KEY,
	name       TEXT NOT NULL UNIQUE,
	created_at BIGINT NOT NULL,
	quotas     TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS api_keys (
	id          TEXT PRIMARY KEY,
	team_id     TEXT NOT NULL REFERENCES teams(id),
	name        TEXT NOT NULL,
	hash        TEXT NOT NULL UNIQUE,
	prefix      TEXT NOT NULL,
	mask_prefix TEXT NOT NULL,
	mask_suffix TEXT NOT NULL,
	length      BIGINT NOT NULL,
	scopes      TEXT NOT NULL,
	created_at  BIGINT NOT NULL,
	created_by  TEXT NOT NULL,
	revoked_at  BIGINT NOT NULL DEFAULT 0,
	last_used   BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS audit_log (
	seq         INTEGER PRIMARY KEY AUTOINCREMENT,
	at          BIGINT NOT NULL,
	key_id      TEXT NOT NULL,
	key_name    TEXT NOT NULL,
	team_id     TEXT NOT NULL,
	action      TEXT NOT NULL,
	target_kind TEXT NOT NULL,
	target_id   TEXT NOT NULL,
	status      BIGINT NOT NULL,
	detail      TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_log_team ON audit_log (team_id, seq);`

// PutTeam adds a team; ErrExists when its ID or name is taken.
func (s *DB) PutTeam(ctx context.Context, t Team) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO teams (id, name, created_at, quotas) VALUES (?, ?, ?, ?)`,
		t.ID, t.Name, t.CreatedAt.UnixNano(), t.Quotas)
	if err != nil {
		if isUnique(err) {
			return fmt.Errorf("%w: team %q", ErrExists, t.Name)
		}
		return fmt.Errorf("store: put team %s: %w", t.Name, err)
	}
	return nil
}

// SetTeamQuotas replaces a team's quotas; ErrNotFound when there is none.
func (s *DB) SetTeamQuotas(ctx context.Context, id, quotas string) error {
	return s.updateOne(ctx, "team "+id, `UPDATE teams SET quotas = ? WHERE id = ?`, quotas, id)
}

// updateOne runs an UPDATE of one row; ErrNotFound (naming what) when it
// changed none.
func (s *DB) updateOne(ctx context.Context, what, query string, args ...any) error {
	res, err := s.db.ExecContext(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("store: update %s: %w", what, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w: %s", ErrNotFound, what)
	}
	return nil
}

// Teams returns every team, oldest first.
func (s *DB) Teams(ctx context.Context) ([]Team, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, name, created_at, quotas FROM teams ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("store: list teams: %w", err)
	}
	defer rows.Close()
	var out []Team
	for rows.Next() {
		var t Team
		var at int64
		if err := rows.Scan(&t.ID, &t.Name, &at, &t.Quotas); err != nil {
			return nil, fmt.Errorf("store: list teams: %w", err)
		}
		t.CreatedAt = time.Unix(0, at)
		out = append(out, t)
	}
	return out, rows.Err()
}

const keyColumns = `id, team_id, name, hash, prefix, mask_prefix, mask_suffix, length, scopes, created_at, created_by, revoked_at, last_used`

// PutAPIKey adds a key record; ErrExists when its ID or hash is taken,
// ErrNotFound when its team does not exist.
func (s *DB) PutAPIKey(ctx context.Context, k APIKey) error {
	var team int
	if err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM teams WHERE id = ?`, k.TeamID).Scan(&team); err != nil {
		return fmt.Errorf("store: put api key: %w", err)
	}
	if team == 0 {
		return fmt.Errorf("%w: team %s", ErrNotFound, k.TeamID)
	}
	_, err := s.db.ExecContext(ctx, `INSERT INTO api_keys (`+keyColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		k.ID, k.TeamID, k.Name, k.Hash, k.Prefix, k.MaskPrefix, k.MaskSuffix, k.Length, k.Scopes,
		k.CreatedAt.UnixNano(), k.CreatedBy, unixNanoOrZero(k.RevokedAt), unixNanoOrZero(k.LastUsed))
	if err != nil {
		if isUnique(err) {
			return fmt.Errorf("%w: api key %s", ErrExists, k.ID)
		}
		return fmt.Errorf("store: put api key %s: %w", k.ID, err)
	}
	return nil
}

func unixNanoOrZero(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func timeOrZero(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

func scanAPIKey(sc interface{ Scan(...any) error }) (APIKey, error) {
	var k APIKey
	var created, revoked, used int64
	if err := sc.Scan(&k.ID, &k.TeamID, &k.Name, &k.Hash, &k.Prefix, &k.MaskPrefix, &k.MaskSuffix, &k.Length,
		&k.Scopes, &created, &k.CreatedBy, &revoked, &used); err != nil {
		return APIKey{}, err
	}
	k.CreatedAt, k.RevokedAt, k.LastUsed = time.Unix(0, created), timeOrZero(revoked), timeOrZero(used)
	return k, nil
}

// APIKeys returns every key record (revoked ones too), oldest first.
func (s *DB) APIKeys(ctx context.Context) ([]APIKey, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+keyColumns+` FROM api_keys ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("store: list api keys: %w", err)
	}
	defer rows.Close()
	var out []APIKey
	for rows.Next() {
		k, err := scanAPIKey(rows)
		if err != nil {
			return nil, fmt.Errorf("store: list api keys: %w", err)
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

// APIKey returns one key record; ErrNotFound when there is none.
func (s *DB) APIKey(ctx context.Context, id string) (APIKey, error) {
	k, err := scanAPIKey(s.db.QueryRowContext(ctx, `SELECT `+keyColumns+` FROM api_keys WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return APIKey{}, fmt.Errorf("%w: api key %s", ErrNotFound, id)
	}
	if err != nil {
		return APIKey{}, fmt.Errorf("store: api key %s: %w", id, err)
	}
	return k, nil
}

// UpdateAPIKey changes a key's name and scopes; ErrNotFound when there is
// no such key (or it is revoked).
func (s *DB) UpdateAPIKey(ctx context.Context, id, name, scopes string) error {
	return s.updateOne(ctx, "api key "+id, `UPDATE api_keys SET name = ?, scopes = ? WHERE id = ? AND revoked_at = 0`, name, scopes, id)
}

// RevokeAPIKey marks a key revoked at; ErrNotFound when there is no such
// key not yet revoked.
func (s *DB) RevokeAPIKey(ctx context.Context, id string, at time.Time) error {
	return s.updateOne(ctx, "api key "+id, `UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at = 0`, at.UnixNano(), id)
}

// TouchAPIKeys records when keys were last used (id → time), in one
// transaction.
func (s *DB) TouchAPIKeys(ctx context.Context, used map[string]time.Time) error {
	if len(used) == 0 {
		return nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: touch api keys: %w", err)
	}
	defer tx.Rollback()
	// In the order of their IDs: two processes touching the same keys lock
	// their rows in one order, so neither waits on the other in a cycle.
	ids := slices.Sorted(maps.Keys(used))
	q := `UPDATE api_keys SET last_used = ` + s.db.d.greatest("last_used", "?") + ` WHERE id = ?`
	for _, id := range ids {
		if _, err := tx.ExecContext(ctx, q, used[id].UnixNano(), id); err != nil {
			return fmt.Errorf("store: touch api key %s: %w", id, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: touch api keys: %w", err)
	}
	return nil
}

// AppendAudit adds entries to the audit log, in one transaction.
func (s *DB) AppendAudit(ctx context.Context, entries []AuditEntry) error {
	if len(entries) == 0 {
		return nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: append audit: %w", err)
	}
	defer tx.Rollback()
	// Entries are numbered (seq) as they are inserted and read newest
	// first, a page at a time before a seq (Audit): one process's entries
	// must not get numbers below those another has already committed, or a
	// reader paging down would pass them. SQLite's single writer gives that;
	// on PostgreSQL the log's lock, held to the commit, does.
	if err := tx.lock(ctx, "audit_log"); err != nil {
		return fmt.Errorf("store: append audit: %w", err)
	}
	for _, e := range entries {
		if _, err := tx.ExecContext(ctx, `INSERT INTO audit_log (at, key_id, key_name, team_id, action, target_kind, target_id, status, detail)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`, e.At.UnixNano(), e.KeyID, e.KeyName, e.TeamID, e.Action, e.TargetKind, e.TargetID, e.Status, e.Detail); err != nil {
			return fmt.Errorf("store: append audit: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: append audit: %w", err)
	}
	return nil
}

// AuditFilter selects audit entries: of one team ("" every team), newer
// than AfterSeq, at most Limit (newest first).
type AuditFilter struct {
	TeamID    string
	BeforeSeq int64 // 0: from the newest
	Limit     int
}

// Audit returns audit entries, newest first.
func (s *DB) Audit(ctx context.Context, f AuditFilter) ([]AuditEntry, error) {
	q := `SELECT seq, at, key_id, key_name, team_id, action, target_kind, target_id, status, detail FROM audit_log WHERE 1=1`
	var args []any
	if f.TeamID != "" {
		q += ` AND team_id = ?`
		args = append(args, f.TeamID)
	}
	if f.BeforeSeq > 0 {
		q += ` AND seq < ?`
		args = append(args, f.BeforeSeq)
	}
	q += ` ORDER BY seq DESC LIMIT ?`
	args = append(args, max(1, f.Limit))
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("store: audit: %w", err)
	}
	defer rows.Close()
	var out []AuditEntry
	for rows.Next() {
		var e AuditEntry
		var at int64
		if err := rows.Scan(&e.Seq, &at, &e.KeyID, &e.KeyName, &e.TeamID, &e.Action, &e.TargetKind, &e.TargetID, &e.Status, &e.Detail); err != nil {
			return nil, fmt.Errorf("store: audit: %w", err)
		}
		e.At = time.Unix(0, at)
		out = append(out, e)
	}
	return out, rows.Err()
}
