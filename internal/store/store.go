// Package store persists sandbox records so that a restarted server knows which
// sandboxes it owns. The interface is small so that a cluster can put it on
// PostgreSQL; the default implementation is embedded SQLite (pure Go).
package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	_ "modernc.org/sqlite"
)

// ErrNotFound is returned for an unknown sandbox id.
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
	// Network is the sandbox's network configuration (egress rules and
	// public-traffic token), kept so a restarted server re-applies it.
	Network Network
}

// Network is the persisted part of a sandbox's network configuration.
type Network struct {
	AllowOut           []string `json:"allowOut,omitempty"`
	DenyOut            []string `json:"denyOut,omitempty"`
	AllowPublicTraffic *bool    `json:"allowPublicTraffic,omitempty"`
	TrafficAccessToken string   `json:"trafficAccessToken,omitempty"`
}

// Store holds sandbox records.
type Store interface {
	// Put inserts or replaces a record.
	Put(ctx context.Context, s Sandbox) error
	Get(ctx context.Context, id string) (Sandbox, error)
	// List returns every record, in no particular order.
	List(ctx context.Context) ([]Sandbox, error)
	Delete(ctx context.Context, id string) error
	Close() error
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
	network       TEXT NOT NULL DEFAULT '{}'
);`

// migrations bring a database created by an older Airlock up to the schema;
// each is idempotent (a "duplicate column" error means it already ran).
var migrations = []string{
	`ALTER TABLE sandboxes ADD COLUMN network TEXT NOT NULL DEFAULT '{}'`,
}

// OpenSQLite opens (creating if needed) the database file at path.
func OpenSQLite(path string) (*SQLite, error) {
	// WAL keeps readers off the writer's back; busy_timeout covers two
	// processes (a server and a CLI) touching the file at once.
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)&_pragma=synchronous(NORMAL)")
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	db.SetMaxOpenConns(1)
	if _, err := db.Exec(schema); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: schema: %w", err)
	}
	for _, m := range migrations {
		if _, err := db.Exec(m); err != nil && !strings.Contains(err.Error(), "duplicate column") {
			db.Close()
			return nil, fmt.Errorf("store: migrate: %w", err)
		}
	}
	return &SQLite{db: db}, nil
}

func (s *SQLite) Put(ctx context.Context, sb Sandbox) error {
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
	var allow any
	if sb.AllowInternet != nil {
		allow = *sb.AllowInternet
	}
	_, err = s.db.ExecContext(ctx, `INSERT OR REPLACE INTO sandboxes
		(id, template_id, alias, client_id, metadata, env_vars, access_token, started_at, end_at, state, cpu_count, memory_mb, disk_size_mb, allow_internet, network)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		sb.ID, sb.TemplateID, sb.Alias, sb.ClientID, string(md), string(env), sb.AccessToken,
		sb.StartedAt.UnixNano(), sb.EndAt.UnixNano(), sb.State, sb.CPUCount, sb.MemoryMB, sb.DiskSizeMB, allow, string(netJSON))
	if err != nil {
		return fmt.Errorf("store: put %s: %w", sb.ID, err)
	}
	return nil
}

const columns = `id, template_id, alias, client_id, metadata, env_vars, access_token, started_at, end_at, state, cpu_count, memory_mb, disk_size_mb, allow_internet, network`

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
	return nil
}

func (s *SQLite) Close() error { return s.db.Close() }

func scan(row interface{ Scan(...any) error }) (Sandbox, error) {
	var (
		sb             Sandbox
		md, env        string
		started, endAt int64
		allow          sql.NullBool
		netJSON        string
	)
	if err := row.Scan(&sb.ID, &sb.TemplateID, &sb.Alias, &sb.ClientID, &md, &env, &sb.AccessToken,
		&started, &endAt, &sb.State, &sb.CPUCount, &sb.MemoryMB, &sb.DiskSizeMB, &allow, &netJSON); err != nil {
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
	sb.StartedAt = time.Unix(0, started)
	sb.EndAt = time.Unix(0, endAt)
	if allow.Valid {
		v := allow.Bool
		sb.AllowInternet = &v
	}
	return sb, nil
}

func nonNil(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}
