// Package store persists sandbox records so that a restarted server knows which
// sandboxes it owns, the records of snapshots, and a journal of multi-step
// operations for Recover to finish or undo. It holds data only: the files a
// record names are the manager's. The interface is small so that a cluster can
// put it on PostgreSQL; the default implementation is embedded SQLite (pure
// Go).
package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	_ "modernc.org/sqlite"
)

// ErrNotFound is returned for an unknown sandbox or snapshot.
var ErrNotFound = errors.New("store: not found")

// Sandbox is the persisted record of one sandbox.
type Sandbox struct {
	ID          string
	TemplateID  string
	Alias       string
	ClientID    string
	Metadata    map[string]string
	EnvVars     map[string]string
	AccessToken string
	StartedAt   time.Time
	EndAt       time.Time
	State       string
	CPUCount    int
	MemoryMB    int
	DiskSizeMB  int
	// AllowInternet is nil when the client did not say.
	AllowInternet *bool
	// Owner identifies the API key that created the sandbox (a digest, never
	// the key); per-key limits count by it.
	Owner string
	// Network is the sandbox's network configuration (egress rules and
	// public-traffic token), kept so a restarted server re-applies it.
	Network Network
	// Lifecycle is what the sandbox's timeout does, as set at create.
	Lifecycle Lifecycle
	// PausedWithMemory tells, for a paused sandbox, whether a checkpoint of
	// its processes was kept (resume restores it) or only its filesystem
	// (resume boots it afresh); Recover needs it to know what it has.
	PausedWithMemory bool
	// PausedAt is when a paused sandbox was paused; zero otherwise.
	PausedAt time.Time
	// PausedDiskBytes is what a paused sandbox holds on disk, as measured
	// when its pause completed; zero otherwise (and in records older than
	// it, which Recover measures again).
	PausedDiskBytes int64
	// HostKey is the secret the host presents to envd to initialise it again
	// after a restore, stored as AccessToken is.
	HostKey string
	// VolumeMounts are the volumes the sandbox mounts, found again by ID at
	// every boot.
	VolumeMounts []VolumeMount
}

// VolumeMount is a volume mounted in a sandbox at Path.
type VolumeMount struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	Path string `json:"path"`
}

// Lifecycle is the persisted form of a sandbox's lifecycle settings.
type Lifecycle struct {
	// OnTimeout is OnTimeoutKill or OnTimeoutPause; "" reads as kill, and a
	// record is always read back with one of the two.
	OnTimeout  string
	DropMemory bool
	AutoResume bool
}

// The values of Lifecycle.OnTimeout.
const (
	OnTimeoutKill  = "kill"
	OnTimeoutPause = "pause"
)

// Network is the persisted part of a sandbox's network configuration.
type Network struct {
	AllowOut           []string `json:"allowOut,omitempty"`
	DenyOut            []string `json:"denyOut,omitempty"`
	AllowPublicTraffic *bool    `json:"allowPublicTraffic,omitempty"`
	TrafficAccessToken string   `json:"trafficAccessToken,omitempty"`
	MaskRequestHost    string   `json:"maskRequestHost,omitempty"`
	// Rules and EgressProxy are the sandbox's netpolicy.Rule map and
	// netpolicy.EgressProxy, kept as the sandbox package encodes them.
	Rules       json.RawMessage `json:"rules,omitempty"`
	EgressProxy json.RawMessage `json:"egressProxy,omitempty"`
}

// Store holds sandbox records, snapshot records and the operation journal.
type Store interface {
	// Put inserts or replaces a record.
	Put(ctx context.Context, s Sandbox) error
	Get(ctx context.Context, id string) (Sandbox, error)
	// List returns every record, in no particular order.
	List(ctx context.Context) ([]Sandbox, error)
	// Delete removes a record and its events.
	Delete(ctx context.Context, id string) error
	// AddEvent appends to a sandbox's event log.
	AddEvent(ctx context.Context, e Event) error
	// Events returns a sandbox's events, oldest first.
	Events(ctx context.Context, sandboxID string) ([]Event, error)

	// PutSnapshot inserts or replaces (by ID) a snapshot record. If its Name
	// is held by another snapshot of the same Owner, that record is deleted
	// in the same transaction and its ID returned, so the caller can delete
	// its files: no moment has two snapshots of one owner with one name.
	// Another owner's snapshot of that name is left alone.
	PutSnapshot(ctx context.Context, s Snapshot) (replaced string, err error)
	// GetSnapshot finds owner's snapshot by its ID or name, either bare or
	// with ":default"; an ID match wins over a name match. Owner is matched
	// exactly ("" is the owner of snapshots made without one). ErrNotFound
	// if none.
	GetSnapshot(ctx context.Context, owner, idOrName string) (Snapshot, error)
	// ListSnapshots returns the snapshots f selects, newest first.
	ListSnapshots(ctx context.Context, f SnapshotFilter) ([]Snapshot, error)
	// DeleteSnapshot removes a snapshot record by its ID and reports whether
	// it existed.
	DeleteSnapshot(ctx context.Context, id string) (bool, error)

	// PutOp records (or updates, by ID) an operation in progress.
	PutOp(ctx context.Context, op Op) error
	// DeleteOp removes a finished operation; an unknown ID is no error.
	DeleteOp(ctx context.Context, id string) error
	// ListOps returns the operations left unfinished, oldest first.
	ListOps(ctx context.Context) ([]Op, error)

	Close() error
}

// Event is something that happened to a sandbox that its owner should be able
// to read later (the logs endpoint): an OOM kill, for one.
type Event struct {
	SandboxID string
	Time      time.Time
	Kind      string // "oom", ...
	// Count is kind-specific: for "oom", the processes killed since the
	// previous event.
	Count   int64
	Message string
}

// SQLite is the embedded Store.
type SQLite struct{ db *sql.DB }

const schema = `
CREATE TABLE IF NOT EXISTS sandboxes (
	id            TEXT PRIMARY KEY,
	template_id   TEXT NOT NULL,
	alias         TEXT NOT NULL,
	client_id     TEXT NOT NULL,
	metadata      TEXT NOT NULL,
	env_vars      TEXT NOT NULL,
	access_token  TEXT NOT NULL,
	started_at    INTEGER NOT NULL,
	end_at        INTEGER NOT NULL,
	state         TEXT NOT NULL,
	cpu_count     INTEGER NOT NULL,
	memory_mb     INTEGER NOT NULL,
	disk_size_mb  INTEGER NOT NULL,
	allow_internet INTEGER,
	owner         TEXT NOT NULL DEFAULT '',
	network       TEXT NOT NULL DEFAULT '{}',
	on_timeout    TEXT NOT NULL DEFAULT 'kill',
	drop_memory   INTEGER NOT NULL DEFAULT 0,
	auto_resume   INTEGER NOT NULL DEFAULT 0,
	paused_with_memory INTEGER NOT NULL DEFAULT 0,
	paused_at     INTEGER NOT NULL DEFAULT 0,
	host_key      TEXT NOT NULL DEFAULT '',
	volume_mounts TEXT NOT NULL DEFAULT '[]',
	paused_disk_bytes INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS events (
	sandbox_id TEXT NOT NULL,
	at         INTEGER NOT NULL,
	kind       TEXT NOT NULL,
	count      INTEGER NOT NULL,
	message    TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_sandbox ON events (sandbox_id, at);
CREATE TABLE IF NOT EXISTS snapshots ` + snapshotsTable + `;` + snapshotIndexes + `
CREATE TABLE IF NOT EXISTS ops (
	id         TEXT PRIMARY KEY,
	kind       TEXT NOT NULL,
	sandbox_id TEXT NOT NULL,
	data       TEXT NOT NULL DEFAULT '',
	started_at INTEGER NOT NULL
);`

// migrations bring a database made by an older Airlock up to the schema above
// (new tables come from its CREATE IF NOT EXISTS); each is applied only when
// its column is missing. Only additive changes with defaults: an older row
// reads as a sandbox that was never paused, killed at its timeout.
var migrations = []struct{ column, ddl string }{
	{"owner", `ALTER TABLE sandboxes ADD COLUMN owner TEXT NOT NULL DEFAULT ''`},
	{"network", `ALTER TABLE sandboxes ADD COLUMN network TEXT NOT NULL DEFAULT '{}'`},
	{"on_timeout", `ALTER TABLE sandboxes ADD COLUMN on_timeout TEXT NOT NULL DEFAULT 'kill'`},
	{"drop_memory", `ALTER TABLE sandboxes ADD COLUMN drop_memory INTEGER NOT NULL DEFAULT 0`},
	{"auto_resume", `ALTER TABLE sandboxes ADD COLUMN auto_resume INTEGER NOT NULL DEFAULT 0`},
	{"paused_with_memory", `ALTER TABLE sandboxes ADD COLUMN paused_with_memory INTEGER NOT NULL DEFAULT 0`},
	{"paused_at", `ALTER TABLE sandboxes ADD COLUMN paused_at INTEGER NOT NULL DEFAULT 0`},
	{"host_key", `ALTER TABLE sandboxes ADD COLUMN host_key TEXT NOT NULL DEFAULT ''`},
	{"volume_mounts", `ALTER TABLE sandboxes ADD COLUMN volume_mounts TEXT NOT NULL DEFAULT '[]'`},
	{"paused_disk_bytes", `ALTER TABLE sandboxes ADD COLUMN paused_disk_bytes INTEGER NOT NULL DEFAULT 0`},
}

// snapshotsTable is the snapshots table's body, shared by the schema and
// the rebuild of an older table (migrateSnapshotNames).
const snapshotsTable = `(
	id          TEXT PRIMARY KEY,
	name        TEXT,                  -- NULL when unnamed
	sandbox_id  TEXT NOT NULL,
	template_id TEXT NOT NULL,
	owner       TEXT NOT NULL,
	created_at  INTEGER NOT NULL,
	spec        TEXT NOT NULL DEFAULT ''
)`

// snapshotIndexes are the snapshots table's indexes. A name is unique per
// owner, not across owners: one team's names neither block nor reveal
// another's. NULLs are distinct in a UNIQUE index, so unnamed snapshots
// never collide.
const snapshotIndexes = `
CREATE INDEX IF NOT EXISTS snapshots_created ON snapshots (created_at);
CREATE UNIQUE INDEX IF NOT EXISTS snapshots_owner_name ON snapshots (owner, name);`

// OpenSQLite opens (creating if needed) the database file at path.
func OpenSQLite(path string) (*SQLite, error) {
	// WAL keeps readers off the writer's back; busy_timeout covers two
	// processes (a server and a CLI) touching the file at once.
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)&_pragma=synchronous(NORMAL)")
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	db.SetMaxOpenConns(1)
	if _, err := db.Exec(schema + lifecycleSchema); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: schema: %w", err)
	}
	if _, err := db.Exec(logSchema); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: sandbox log schema: %w", err)
	}
	if _, err := db.Exec(webhookSchema); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: webhook schema: %w", err)
	}
	if _, err := db.Exec(volumeSchema); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: volume schema: %w", err)
	}
	if _, err := db.Exec(secretSchema); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: secret schema: %w", err)
	}
	if _, err := db.Exec(keySchema); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: api key schema: %w", err)
	}
	if err := migrate(db); err != nil {
		db.Close()
		return nil, err
	}
	return &SQLite{db: db}, nil
}

func migrate(db *sql.DB) error {
	have := map[string]bool{}
	rows, err := db.Query(`SELECT name FROM pragma_table_info('sandboxes')`)
	if err != nil {
		return fmt.Errorf("store: read schema: %w", err)
	}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return fmt.Errorf("store: read schema: %w", err)
		}
		have[name] = true
	}
	rows.Close()
	for _, m := range migrations {
		if have[m.column] {
			continue
		}
		if _, err := db.Exec(m.ddl); err != nil {
			return fmt.Errorf("store: add column %s: %w", m.column, err)
		}
	}
	return migrateSnapshotNames(context.Background(), db)
}

// migrateSnapshotNames rebuilds a snapshots table made when a snapshot's
// name was unique across all owners (a UNIQUE column, which SQLite cannot
// drop in place) into the current one. The rebuild is one transaction, so a
// crash leaves the old table or the new, never a mix; every row keeps its
// name (unique across owners, so per owner too).
func migrateSnapshotNames(ctx context.Context, db *sql.DB) error {
	if old, err := globalSnapshotNames(ctx, db); err != nil || !old {
		return err
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("store: migrate snapshot names: %w", err)
	}
	defer conn.Close()
	// IMMEDIATE takes the write lock before the check below: a second
	// process opening the same old file (a CLI beside the server) waits
	// here and then finds the work done, where a deferred transaction
	// could fail to upgrade its read lock.
	if _, err := conn.ExecContext(ctx, `BEGIN IMMEDIATE`); err != nil {
		return fmt.Errorf("store: migrate snapshot names: %w", err)
	}
	done := false
	defer func() {
		if !done {
			_, _ = conn.ExecContext(context.WithoutCancel(ctx), `ROLLBACK`)
		}
	}()
	old, err := globalSnapshotNames(ctx, conn)
	if err != nil {
		return err
	}
	if old {
		// Dropping the old table drops its indexes; snapshotIndexes makes
		// them again on the new one.
		if _, err := conn.ExecContext(ctx, `CREATE TABLE snapshots_rebuild `+snapshotsTable+`;
			INSERT INTO snapshots_rebuild (`+snapshotColumns+`) SELECT `+snapshotColumns+` FROM snapshots;
			DROP TABLE snapshots;
			ALTER TABLE snapshots_rebuild RENAME TO snapshots;`+snapshotIndexes); err != nil {
			return fmt.Errorf("store: migrate snapshot names: rebuild: %w", err)
		}
	}
	if _, err := conn.ExecContext(ctx, `COMMIT`); err != nil {
		return fmt.Errorf("store: migrate snapshot names: commit: %w", err)
	}
	done = true
	return nil
}

// globalSnapshotNames reports whether the snapshots table still has the
// UNIQUE column constraint of the old schema: the current table has no
// index made by a UNIQUE constraint (origin 'u'), only its primary key's
// and snapshots_owner_name (origin 'c').
func globalSnapshotNames(ctx context.Context, q interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}) (bool, error) {
	var n int
	if err := q.QueryRowContext(ctx, `SELECT count(*) FROM pragma_index_list('snapshots') WHERE origin = 'u'`).Scan(&n); err != nil {
		return false, fmt.Errorf("store: read snapshots' indexes: %w", err)
	}
	return n > 0, nil
}

func (s *SQLite) Put(ctx context.Context, sb Sandbox) error { return putSandbox(ctx, s.db, sb) }

// execer is what a write needs of *sql.DB and *sql.Tx alike, so that one
// write can run alone or inside a caller's transaction.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	PrepareContext(ctx context.Context, query string) (*sql.Stmt, error)
}

func putSandbox(ctx context.Context, db execer, sb Sandbox) error {
	md, err := json.Marshal(nonNil(sb.Metadata))
	if err != nil {
		return fmt.Errorf("store: metadata: %w", err)
	}
	env, err := json.Marshal(nonNil(sb.EnvVars))
	if err != nil {
		return fmt.Errorf("store: env vars: %w", err)
	}
	netJSON, err := json.Marshal(sb.Network)
	if err != nil {
		return fmt.Errorf("store: network: %w", err)
	}
	mounts := sb.VolumeMounts
	if mounts == nil {
		mounts = []VolumeMount{}
	}
	mountsJSON, err := json.Marshal(mounts)
	if err != nil {
		return fmt.Errorf("store: volume mounts: %w", err)
	}
	var allow any
	if sb.AllowInternet != nil {
		allow = *sb.AllowInternet
	}
	onTimeout := sb.Lifecycle.OnTimeout
	switch onTimeout {
	case "":
		onTimeout = OnTimeoutKill
	case OnTimeoutKill, OnTimeoutPause:
	default:
		return fmt.Errorf("store: put %s: unknown on-timeout action %q", sb.ID, onTimeout)
	}
	_, err = db.ExecContext(ctx, `INSERT OR REPLACE INTO sandboxes
		(`+columns+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		sb.ID, sb.TemplateID, sb.Alias, sb.ClientID, string(md), string(env), sb.AccessToken,
		sb.StartedAt.UnixNano(), sb.EndAt.UnixNano(), sb.State, sb.CPUCount, sb.MemoryMB, sb.DiskSizeMB, allow, sb.Owner, string(netJSON),
		onTimeout, sb.Lifecycle.DropMemory, sb.Lifecycle.AutoResume, sb.PausedWithMemory, unixNano(sb.PausedAt), sb.HostKey, string(mountsJSON), sb.PausedDiskBytes)
	if err != nil {
		return fmt.Errorf("store: put %s: %w", sb.ID, err)
	}
	return nil
}

const columns = `id, template_id, alias, client_id, metadata, env_vars, access_token, started_at, end_at, state, cpu_count, memory_mb, disk_size_mb, allow_internet, owner, network,
	on_timeout, drop_memory, auto_resume, paused_with_memory, paused_at, host_key, volume_mounts, paused_disk_bytes`

func (s *SQLite) Get(ctx context.Context, id string) (Sandbox, error) {
	row := s.db.QueryRowContext(ctx, `SELECT `+columns+` FROM sandboxes WHERE id = ?`, id)
	sb, err := scan(row)
	if errors.Is(err, sql.ErrNoRows) {
		return Sandbox{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return sb, err
}

func (s *SQLite) List(ctx context.Context) ([]Sandbox, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+columns+` FROM sandboxes`)
	if err != nil {
		return nil, fmt.Errorf("store: list: %w", err)
	}
	defer rows.Close()
	var out []Sandbox
	for rows.Next() {
		sb, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, sb)
	}
	return out, rows.Err()
}

func (s *SQLite) Delete(ctx context.Context, id string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM sandboxes WHERE id = ?`, id); err != nil {
		return fmt.Errorf("store: delete %s: %w", id, err)
	}
	if _, err := s.db.ExecContext(ctx, `DELETE FROM events WHERE sandbox_id = ?`, id); err != nil {
		return fmt.Errorf("store: delete events of %s: %w", id, err)
	}
	return nil
}

func (s *SQLite) AddEvent(ctx context.Context, e Event) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO events (sandbox_id, at, kind, count, message) VALUES (?, ?, ?, ?, ?)`,
		e.SandboxID, e.Time.UnixNano(), e.Kind, e.Count, e.Message)
	if err != nil {
		return fmt.Errorf("store: add event for %s: %w", e.SandboxID, err)
	}
	return nil
}

func (s *SQLite) Events(ctx context.Context, sandboxID string) ([]Event, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT at, kind, count, message FROM events WHERE sandbox_id = ? ORDER BY at, rowid`, sandboxID)
	if err != nil {
		return nil, fmt.Errorf("store: events of %s: %w", sandboxID, err)
	}
	defer rows.Close()
	var out []Event
	for rows.Next() {
		e := Event{SandboxID: sandboxID}
		var at int64
		if err := rows.Scan(&at, &e.Kind, &e.Count, &e.Message); err != nil {
			return nil, fmt.Errorf("store: scan event: %w", err)
		}
		e.Time = time.Unix(0, at)
		out = append(out, e)
	}
	return out, rows.Err()
}

func (s *SQLite) Close() error { return s.db.Close() }

func scan(row interface{ Scan(...any) error }) (Sandbox, error) {
	var (
		sb             Sandbox
		md, env        string
		started, endAt int64
		allow          sql.NullBool
		netJSON        string
		pausedAt       int64
		mountsJSON     string
	)
	if err := row.Scan(&sb.ID, &sb.TemplateID, &sb.Alias, &sb.ClientID, &md, &env, &sb.AccessToken,
		&started, &endAt, &sb.State, &sb.CPUCount, &sb.MemoryMB, &sb.DiskSizeMB, &allow, &sb.Owner, &netJSON,
		&sb.Lifecycle.OnTimeout, &sb.Lifecycle.DropMemory, &sb.Lifecycle.AutoResume, &sb.PausedWithMemory, &pausedAt, &sb.HostKey, &mountsJSON, &sb.PausedDiskBytes); err != nil {
		return Sandbox{}, fmt.Errorf("store: scan: %w", err)
	}
	if err := json.Unmarshal([]byte(md), &sb.Metadata); err != nil {
		return Sandbox{}, fmt.Errorf("store: metadata of %s: %w", sb.ID, err)
	}
	if err := json.Unmarshal([]byte(env), &sb.EnvVars); err != nil {
		return Sandbox{}, fmt.Errorf("store: env vars of %s: %w", sb.ID, err)
	}
	if err := json.Unmarshal([]byte(netJSON), &sb.Network); err != nil {
		return Sandbox{}, fmt.Errorf("store: network of %s: %w", sb.ID, err)
	}
	if err := json.Unmarshal([]byte(mountsJSON), &sb.VolumeMounts); err != nil {
		return Sandbox{}, fmt.Errorf("store: volume mounts of %s: %w", sb.ID, err)
	}
	if len(sb.VolumeMounts) == 0 {
		sb.VolumeMounts = nil
	}
	sb.StartedAt = time.Unix(0, started)
	sb.EndAt = time.Unix(0, endAt)
	sb.PausedAt = fromUnixNano(pausedAt)
	if allow.Valid {
		v := allow.Bool
		sb.AllowInternet = &v
	}
	return sb, nil
}

// unixNano stores a time that may be unset: the zero time as 0 (its own
// UnixNano is out of range), so fromUnixNano gives the zero time back.
func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromUnixNano(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

func nonNil(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}
