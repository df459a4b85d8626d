// Package store persists sandbox records so that a restarted server knows which
// sandboxes it owns, the records of snapshots, and a journal of multi-step
// operations for Recover to finish or undo. It holds data only: the files a
// record names are the manager's. It runs on embedded SQLite (pure Go), the
// default for one server, or on PostgreSQL, which the replicas of a cluster
// share: one implementation, whose queries a dialect adapts (dialect.go).
package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
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

// DB is the Store, on either of two databases: SQLite, embedded, the
// default for a single server (OpenSQLite), or PostgreSQL, which several
// server processes (replicas) share (OpenPostgres). One implementation
// serves both: every query is written once and adapted by the dialect
// (dialect.go).
type DB struct {
	db *handle
	// lease is how long DueDeliveries holds the deliveries it hands out
	// from other processes (see SetDeliveryLease).
	lease time.Duration
}

// SQLite is the name DB had when it ran on SQLite alone; callers outside
// the package still use it.
type SQLite = DB

// Open opens the store named by dsnOrPath: PostgreSQL for a postgres:// or
// postgresql:// URL, else the SQLite database file at that path.
func Open(ctx context.Context, dsnOrPath string) (*DB, error) {
	if IsPostgres(dsnOrPath) {
		return OpenPostgres(ctx, dsnOrPath)
	}
	return OpenSQLite(dsnOrPath)
}

// IsPostgres tells whether Open takes dsnOrPath for a PostgreSQL URL.
func IsPostgres(dsnOrPath string) bool {
	return strings.HasPrefix(dsnOrPath, "postgres://") || strings.HasPrefix(dsnOrPath, "postgresql://")
}

// Dialect names the database the store is on: "sqlite" or "postgres".
func (s *DB) Dialect() string { return s.db.d.String() }

// The schema is written once for both databases (dialect.ddl adapts the
// few type names that differ), so the two cannot drift apart: a table or
// column added here is added on both.
const schema = `
CREATE TABLE IF NOT EXISTS sandboxes (
	id            TEXT PRIMARY KEY,
	template_id   TEXT NOT NULL,
	alias         TEXT NOT NULL,
	client_id     TEXT NOT NULL,
	metadata      TEXT NOT NULL,
	env_vars      TEXT NOT NULL,
	access_token  TEXT NOT NULL,
	started_at    BIGINT NOT NULL,
	end_at        BIGINT NOT NULL,
	state         TEXT NOT NULL,
	cpu_count     BIGINT NOT NULL,
	memory_mb     BIGINT NOT NULL,
	disk_size_mb  BIGINT NOT NULL,
	allow_internet BOOLEAN,
	owner         TEXT NOT NULL DEFAULT '',
	network       TEXT NOT NULL DEFAULT '{}',
	on_timeout    TEXT NOT NULL DEFAULT 'kill',
	drop_memory   BOOLEAN NOT NULL DEFAULT FALSE,
	auto_resume   BOOLEAN NOT NULL DEFAULT FALSE,
	paused_with_memory BOOLEAN NOT NULL DEFAULT FALSE,
	paused_at     BIGINT NOT NULL DEFAULT 0,
	host_key      TEXT NOT NULL DEFAULT '',
	volume_mounts TEXT NOT NULL DEFAULT '[]',
	paused_disk_bytes BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS events (
	sandbox_id TEXT NOT NULL,
	at         BIGINT NOT NULL,
	kind       TEXT NOT NULL,
	count      BIGINT NOT NULL,
	message    TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_sandbox ON events (sandbox_id, at);
CREATE TABLE IF NOT EXISTS snapshots ` + snapshotsTable + `;` + snapshotIndexes + `
CREATE TABLE IF NOT EXISTS ops (
	id         TEXT PRIMARY KEY,
	kind       TEXT NOT NULL,
	sandbox_id TEXT NOT NULL,
	data       TEXT NOT NULL DEFAULT '',
	started_at BIGINT NOT NULL
);`

// schemas are every part of the schema, in the order they are made.
var schemas = []struct{ name, ddl string }{
	{"sandboxes", schema},
	{"lifecycle events", lifecycleSchema},
	{"sandbox log", logSchema},
	{"webhook", webhookSchema},
	{"volume", volumeSchema},
	{"secret", secretSchema},
	{"api key", keySchema},
	{"metrics", metricsSchema},
	{"rate limit", rateSchema},
}

// migrations bring a database made by an older Airlock up to the schema above
// (new tables come from its CREATE IF NOT EXISTS); each is applied only when
// its column is missing. Only additive changes with defaults: an older row
// reads as a sandbox that was never paused, killed at its timeout. Their
// DDL is valid on both databases (a PostgreSQL store began after all but
// the newest of them, so it finds their columns there already).
var migrations = []migration{
	{"sandboxes", "owner", `ALTER TABLE sandboxes ADD COLUMN owner TEXT NOT NULL DEFAULT ''`},
	{"sandboxes", "network", `ALTER TABLE sandboxes ADD COLUMN network TEXT NOT NULL DEFAULT '{}'`},
	{"sandboxes", "on_timeout", `ALTER TABLE sandboxes ADD COLUMN on_timeout TEXT NOT NULL DEFAULT 'kill'`},
	{"sandboxes", "drop_memory", `ALTER TABLE sandboxes ADD COLUMN drop_memory BOOLEAN NOT NULL DEFAULT FALSE`},
	{"sandboxes", "auto_resume", `ALTER TABLE sandboxes ADD COLUMN auto_resume BOOLEAN NOT NULL DEFAULT FALSE`},
	{"sandboxes", "paused_with_memory", `ALTER TABLE sandboxes ADD COLUMN paused_with_memory BOOLEAN NOT NULL DEFAULT FALSE`},
	{"sandboxes", "paused_at", `ALTER TABLE sandboxes ADD COLUMN paused_at BIGINT NOT NULL DEFAULT 0`},
	{"sandboxes", "host_key", `ALTER TABLE sandboxes ADD COLUMN host_key TEXT NOT NULL DEFAULT ''`},
	{"sandboxes", "volume_mounts", `ALTER TABLE sandboxes ADD COLUMN volume_mounts TEXT NOT NULL DEFAULT '[]'`},
	{"sandboxes", "paused_disk_bytes", `ALTER TABLE sandboxes ADD COLUMN paused_disk_bytes BIGINT NOT NULL DEFAULT 0`},
	{"webhook_deliveries", "lease_until", `ALTER TABLE webhook_deliveries ADD COLUMN lease_until BIGINT NOT NULL DEFAULT 0`},
}

// migration adds column to table, with ddl, where it is missing.
type migration struct{ table, column, ddl string }

// snapshotsTable is the snapshots table's body, shared by the schema and
// the rebuild of an older table (migrateSnapshotNames).
const snapshotsTable = `(
	id          TEXT PRIMARY KEY,
	name        TEXT,                  -- NULL when unnamed
	sandbox_id  TEXT NOT NULL,
	template_id TEXT NOT NULL,
	owner       TEXT NOT NULL,
	created_at  BIGINT NOT NULL,
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
func OpenSQLite(path string) (*DB, error) {
	// WAL keeps readers off the writer's back; busy_timeout covers two
	// processes (a server and a CLI) touching the file at once.
	raw, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)&_pragma=synchronous(NORMAL)")
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	// One connection: SQLite has one writer at a time anyway, and with one
	// connection a transaction of this process never waits on another.
	raw.SetMaxOpenConns(1)
	db := &handle{raw: raw, d: sqliteDialect}
	if err := setUp(context.Background(), db, db.d); err != nil {
		raw.Close()
		return nil, err
	}
	if err := migrateSnapshotNames(context.Background(), raw); err != nil {
		raw.Close()
		return nil, err
	}
	return &DB{db: db}, nil
}

// OpenPostgres opens the PostgreSQL database dsn names (a postgres:// URL
// or a key=value string, as pgx reads them), making the schema when it is
// not there. Several server processes may open one database at once: one
// at a time makes (or migrates) the schema, under an advisory lock.
func OpenPostgres(ctx context.Context, dsn string) (*DB, error) {
	raw, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, fmt.Errorf("store: open postgres: %w", err)
	}
	// A pool: PostgreSQL runs transactions side by side, holding row
	// locks, where SQLite has one writer.
	raw.SetMaxOpenConns(16)
	raw.SetMaxIdleConns(16)
	raw.SetConnMaxIdleTime(5 * time.Minute)
	db := &handle{raw: raw, d: postgresDialect}
	if err := setUpPostgres(ctx, db); err != nil {
		raw.Close()
		return nil, err
	}
	return &DB{db: db, lease: DefaultDeliveryLease}, nil
}

// setUpPostgres runs setUp on one connection holding a session advisory
// lock: two replicas opening an empty database at the same moment would
// otherwise both run CREATE TABLE IF NOT EXISTS, which PostgreSQL does not
// make safe against itself (the second fails on a catalog unique index).
func setUpPostgres(ctx context.Context, db *handle) error {
	conn, err := db.raw.Conn(ctx)
	if err != nil {
		return fmt.Errorf("store: connect to postgres: %w", err)
	}
	defer conn.Close()
	key := lockKey("airlock store schema")
	if _, err := conn.ExecContext(ctx, `SELECT pg_advisory_lock($1)`, key); err != nil {
		return fmt.Errorf("store: lock the schema: %w", err)
	}
	err = setUp(ctx, conn, db.d)
	if _, uerr := conn.ExecContext(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, key); uerr != nil {
		// Closing the connection ends its session, and the lock with it.
		_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		if err == nil {
			err = fmt.Errorf("store: unlock the schema: %w", uerr)
		}
	}
	return err
}

// schemaDB is what making and migrating the schema needs of a database: a
// handle, or one *sql.Conn of it, which does not rebind (so columnsOf spells
// its placeholder per dialect).
type schemaDB interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// setUp makes the schema where it is missing and adds the columns an older
// one lacks.
func setUp(ctx context.Context, db schemaDB, d *dialect) error {
	for _, s := range schemas {
		if _, err := db.ExecContext(ctx, d.ddl(s.ddl)); err != nil {
			return fmt.Errorf("store: %s schema: %w", s.name, err)
		}
	}
	adds := migrations
	if d.postgres {
		for _, t := range rowidTables {
			adds = append(adds, migration{t, "rowid", `ALTER TABLE ` + t + ` ADD COLUMN rowid BIGINT GENERATED ALWAYS AS IDENTITY`})
		}
	}
	// Each column is looked for before it is added: on PostgreSQL even an
	// ALTER TABLE that finds its column there (IF NOT EXISTS) would take the
	// table's exclusive lock, and stall the other replicas' queries, at
	// every open.
	have := map[string]map[string]bool{}
	for _, m := range adds {
		if have[m.table] == nil {
			cols, err := columnsOf(ctx, db, d, m.table)
			if err != nil {
				return err
			}
			have[m.table] = cols
		}
		if have[m.table][m.column] {
			continue
		}
		if _, err := db.ExecContext(ctx, m.ddl); err != nil {
			return fmt.Errorf("store: add column %s.%s: %w", m.table, m.column, err)
		}
	}
	return nil
}

// columnsOf returns the names of table's columns.
func columnsOf(ctx context.Context, db schemaDB, d *dialect, table string) (map[string]bool, error) {
	q := `SELECT name FROM pragma_table_info(?)`
	if d.postgres {
		q = `SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = $1`
	}
	rows, err := db.QueryContext(ctx, q, table)
	if err != nil {
		return nil, fmt.Errorf("store: read the schema of %s: %w", table, err)
	}
	defer rows.Close()
	have := map[string]bool{}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, fmt.Errorf("store: read the schema of %s: %w", table, err)
		}
		have[name] = true
	}
	return have, rows.Err()
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

func (s *DB) Put(ctx context.Context, sb Sandbox) error { return putSandbox(ctx, s.db, sb) }

// SandboxLimits bound one owner's sandbox records (every replica's, on a
// shared database); zero fields limit nothing.
type SandboxLimits struct {
	MaxCount    int
	MaxCPUs     int
	MaxMemoryMB int
}

// ErrSandboxLimit is what a *SandboxLimitError is.
var ErrSandboxLimit = errors.New("store: sandbox limit reached")

// SandboxLimitError tells which of an owner's SandboxLimits an insert would
// pass: Limit is "sandboxes", "vcpus" or "memory", Used what the owner's
// records hold of it, Max the limit and Asked what the new record needs.
type SandboxLimitError struct {
	Limit            string
	Used, Max, Asked int
}

func (e *SandboxLimitError) Error() string {
	return fmt.Sprintf("store: %s limit reached: %d used of %d, %d asked", e.Limit, e.Used, e.Max, e.Asked)
}

func (e *SandboxLimitError) Is(target error) bool { return target == ErrSandboxLimit }

// InsertSandbox writes a new record after checking, in the same transaction
// and under the owner's lock, that the owner's records with it stay within
// lim (a *SandboxLimitError if not): two creates at once, by two replicas
// sharing PostgreSQL, cannot both pass where one fits. ErrExists when a
// record has its ID.
func (s *DB) InsertSandbox(ctx context.Context, sb Sandbox, lim SandboxLimits) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: insert %s: %w", sb.ID, err)
	}
	defer tx.Rollback()
	if err := tx.lock(ctx, "sandboxes", sb.Owner); err != nil {
		return fmt.Errorf("store: insert %s: %w", sb.ID, err)
	}
	var taken, count, cpus, mem int
	if err := tx.QueryRowContext(ctx, `SELECT coalesce(sum(CASE WHEN id = ? THEN 1 ELSE 0 END), 0), count(*),
		CAST(coalesce(sum(cpu_count), 0) AS BIGINT), CAST(coalesce(sum(memory_mb), 0) AS BIGINT) FROM sandboxes WHERE owner = ? OR id = ?`,
		sb.ID, sb.Owner, sb.ID).Scan(&taken, &count, &cpus, &mem); err != nil {
		return fmt.Errorf("store: insert %s: %w", sb.ID, err)
	}
	switch {
	case taken > 0:
		return fmt.Errorf("%w: sandbox %s", ErrExists, sb.ID)
	case lim.MaxCount > 0 && count+1 > lim.MaxCount:
		return &SandboxLimitError{Limit: "sandboxes", Used: count, Max: lim.MaxCount, Asked: 1}
	case lim.MaxCPUs > 0 && cpus+sb.CPUCount > lim.MaxCPUs:
		return &SandboxLimitError{Limit: "vcpus", Used: cpus, Max: lim.MaxCPUs, Asked: sb.CPUCount}
	case lim.MaxMemoryMB > 0 && mem+sb.MemoryMB > lim.MaxMemoryMB:
		return &SandboxLimitError{Limit: "memory", Used: mem, Max: lim.MaxMemoryMB, Asked: sb.MemoryMB}
	}
	if err := putSandbox(ctx, tx, sb); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: insert %s: %w", sb.ID, err)
	}
	return nil
}

// execer is what a write needs of handle and txn alike, so that one write
// can run alone or inside a caller's transaction.
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
	_, err = db.ExecContext(ctx, `INSERT INTO sandboxes
		(`+columns+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET `+updateAll(columns),
		sb.ID, sb.TemplateID, sb.Alias, sb.ClientID, string(md), string(env), sb.AccessToken,
		sb.StartedAt.UnixNano(), sb.EndAt.UnixNano(), sb.State, sb.CPUCount, sb.MemoryMB, sb.DiskSizeMB, allow, sb.Owner, string(netJSON),
		onTimeout, sb.Lifecycle.DropMemory, sb.Lifecycle.AutoResume, sb.PausedWithMemory, unixNano(sb.PausedAt), sb.HostKey, string(mountsJSON), sb.PausedDiskBytes)
	if err != nil {
		return fmt.Errorf("store: put %s: %w", sb.ID, err)
	}
	return nil
}

// updateAll is the SET list of an upsert that replaces every column of
// cols (a comma-separated list, the key first: it is left out) with the
// row offered: INSERT OR REPLACE, in the SQL both databases speak.
func updateAll(cols string) string {
	var set []string
	for i, c := range strings.Split(cols, ",") {
		if c = strings.TrimSpace(c); i > 0 {
			set = append(set, c+" = excluded."+c)
		}
	}
	return strings.Join(set, ", ")
}

const columns = `id, template_id, alias, client_id, metadata, env_vars, access_token, started_at, end_at, state, cpu_count, memory_mb, disk_size_mb, allow_internet, owner, network,
	on_timeout, drop_memory, auto_resume, paused_with_memory, paused_at, host_key, volume_mounts, paused_disk_bytes`

func (s *DB) Get(ctx context.Context, id string) (Sandbox, error) {
	row := s.db.QueryRowContext(ctx, `SELECT `+columns+` FROM sandboxes WHERE id = ?`, id)
	sb, err := scan(row)
	if errors.Is(err, sql.ErrNoRows) {
		return Sandbox{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return sb, err
}

func (s *DB) List(ctx context.Context) ([]Sandbox, error) {
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

func (s *DB) Delete(ctx context.Context, id string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM sandboxes WHERE id = ?`, id); err != nil {
		return fmt.Errorf("store: delete %s: %w", id, err)
	}
	if _, err := s.db.ExecContext(ctx, `DELETE FROM events WHERE sandbox_id = ?`, id); err != nil {
		return fmt.Errorf("store: delete events of %s: %w", id, err)
	}
	if _, err := s.db.ExecContext(ctx, `DELETE FROM sandbox_metrics WHERE sandbox_id = ?`, id); err != nil {
		return fmt.Errorf("store: delete metrics of %s: %w", id, err)
	}
	return nil
}

func (s *DB) AddEvent(ctx context.Context, e Event) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO events (sandbox_id, at, kind, count, message) VALUES (?, ?, ?, ?, ?)`,
		e.SandboxID, e.Time.UnixNano(), e.Kind, e.Count, e.Message)
	if err != nil {
		return fmt.Errorf("store: add event for %s: %w", e.SandboxID, err)
	}
	return nil
}

func (s *DB) Events(ctx context.Context, sandboxID string) ([]Event, error) {
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

func (s *DB) Close() error { return s.db.Close() }

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
