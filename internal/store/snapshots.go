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

// Snapshot is the record of a saved sandbox state that new sandboxes start
// from.
type Snapshot struct {
	// ID is the raw id (no ":default").
	ID string
	// Name is optional and unique among its Owner's snapshots; bare, like
	// ID.
	Name       string
	SandboxID  string
	TemplateID string
	Owner      string
	CreatedAt  time.Time
	// Spec is what the manager needs to start a sandbox from the snapshot,
	// opaque to the store (valid JSON, or empty).
	Spec json.RawMessage
}

// SnapshotFilter selects snapshots; zero fields match all.
type SnapshotFilter struct {
	SandboxID string
	// Name matches a snapshot's ID or name, bare or with ":default"; names
	// are unique per owner only, so without Owner it may match one snapshot
	// of each.
	Name  string
	Owner string
}

// defaultTag is the one tag a snapshot's full name carries ("<name>:default").
const defaultTag = ":default"

const snapshotColumns = `id, name, sandbox_id, template_id, owner, created_at, spec`

func (s *DB) PutSnapshot(ctx context.Context, sn Snapshot) (replaced string, err error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return "", fmt.Errorf("store: put snapshot %s: %w", sn.ID, err)
	}
	defer tx.Rollback()
	if replaced, err = putSnapshot(ctx, tx, sn); err != nil {
		return "", err
	}
	if err := tx.Commit(); err != nil {
		return "", fmt.Errorf("store: put snapshot %s: %w", sn.ID, err)
	}
	return replaced, nil
}

// putSnapshot is PutSnapshot inside the caller's transaction.
func putSnapshot(ctx context.Context, tx *txn, sn Snapshot) (replaced string, err error) {
	// A ':' would make "<x>:default" ambiguous between a bare and a tagged
	// form.
	if sn.ID == "" || strings.Contains(sn.ID, ":") || strings.Contains(sn.Name, ":") {
		return "", fmt.Errorf("store: snapshot id %q or name %q: empty id, or a ':' in either", sn.ID, sn.Name)
	}
	if len(sn.Spec) > 0 && !json.Valid(sn.Spec) {
		return "", fmt.Errorf("store: snapshot %s: spec is not JSON", sn.ID)
	}
	var name any // NULL: UNIQUE does not apply to unnamed snapshots
	if sn.Name != "" {
		name = sn.Name
	}
	if sn.Name != "" {
		// Two puts of one owner's name, by two processes on PostgreSQL,
		// would both find it free (or both find the same holder) and the
		// second insert would fail on the unique index: the name's lock
		// makes the second wait for the first and then replace its
		// snapshot, as it would have on SQLite's single writer.
		if err := tx.lock(ctx, "snapshot name", sn.Owner, sn.Name); err != nil {
			return "", fmt.Errorf("store: put snapshot %s: %w", sn.ID, err)
		}
		// One statement finds and deletes the holder: on PostgreSQL it
		// reads the holder again once a transaction that had it locked is
		// done, so a snapshot renamed meanwhile is not taken for it.
		err := tx.QueryRowContext(ctx, `DELETE FROM snapshots WHERE owner = ? AND name = ? AND id != ? RETURNING id`,
			sn.Owner, sn.Name, sn.ID).Scan(&replaced)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return "", fmt.Errorf("store: put snapshot %s: replace: %w", sn.ID, err)
		}
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO snapshots (`+snapshotColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET `+updateAll(snapshotColumns),
		sn.ID, name, sn.SandboxID, sn.TemplateID, sn.Owner, unixNano(sn.CreatedAt), string(sn.Spec)); err != nil {
		return "", fmt.Errorf("store: put snapshot %s: %w", sn.ID, err)
	}
	return replaced, nil
}

func (s *DB) GetSnapshot(ctx context.Context, owner, idOrName string) (Snapshot, error) {
	key := strings.TrimSuffix(idOrName, defaultTag)
	row := s.db.QueryRowContext(ctx, `SELECT `+snapshotColumns+` FROM snapshots
		WHERE owner = ? AND (id = ? OR name = ?) ORDER BY (id = ?) DESC LIMIT 1`, owner, key, key, key)
	sn, err := scanSnapshot(row)
	if errors.Is(err, sql.ErrNoRows) {
		return Snapshot{}, fmt.Errorf("%w: snapshot %s", ErrNotFound, idOrName)
	}
	return sn, err
}

func (s *DB) ListSnapshots(ctx context.Context, f SnapshotFilter) ([]Snapshot, error) {
	q := `SELECT ` + snapshotColumns + ` FROM snapshots WHERE 1=1`
	var args []any
	if f.SandboxID != "" {
		q += ` AND sandbox_id = ?`
		args = append(args, f.SandboxID)
	}
	if f.Owner != "" {
		q += ` AND owner = ?`
		args = append(args, f.Owner)
	}
	if f.Name != "" {
		key := strings.TrimSuffix(f.Name, defaultTag)
		q += ` AND (id = ? OR name = ?)`
		args = append(args, key, key)
	}
	q += ` ORDER BY created_at DESC, rowid DESC`
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("store: list snapshots: %w", err)
	}
	defer rows.Close()
	var out []Snapshot
	for rows.Next() {
		sn, err := scanSnapshot(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, sn)
	}
	return out, rows.Err()
}

func (s *DB) DeleteSnapshot(ctx context.Context, id string) (bool, error) {
	res, err := s.db.ExecContext(ctx, `DELETE FROM snapshots WHERE id = ?`, id)
	if err != nil {
		return false, fmt.Errorf("store: delete snapshot %s: %w", id, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("store: delete snapshot %s: %w", id, err)
	}
	return n > 0, nil
}

func scanSnapshot(row interface{ Scan(...any) error }) (Snapshot, error) {
	var (
		sn      Snapshot
		name    sql.NullString
		created int64
		spec    string
	)
	if err := row.Scan(&sn.ID, &name, &sn.SandboxID, &sn.TemplateID, &sn.Owner, &created, &spec); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return Snapshot{}, err
		}
		return Snapshot{}, fmt.Errorf("store: scan snapshot: %w", err)
	}
	sn.Name = name.String
	sn.CreatedAt = fromUnixNano(created)
	if spec != "" {
		sn.Spec = json.RawMessage(spec)
	}
	return sn, nil
}
