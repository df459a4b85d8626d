package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// Op is an entry of the operation journal: the manager records one before a
// change of several steps (files, runtime, records) and deletes it after, so
// that Recover, finding it left over after a crash, finishes or undoes the
// change.
type Op struct {
	ID string
	// Kind is one of the Op* constants.
	Kind      string
	SandboxID string
	// Data is what the kind needs to finish or undo the step, opaque to
	// the store (valid JSON, or empty).
	Data      json.RawMessage
	StartedAt time.Time
}

// The kinds of Op.
const (
	OpPause    = "pause"
	OpResume   = "resume"
	OpSnapshot = "snapshot"
	OpFork     = "fork"
)

const opColumns = `id, kind, sandbox_id, data, started_at`

func (s *DB) PutOp(ctx context.Context, op Op) error {
	if op.ID == "" {
		return fmt.Errorf("store: put op: empty id")
	}
	if len(op.Data) > 0 && !json.Valid(op.Data) {
		return fmt.Errorf("store: put op %s: data is not JSON", op.ID)
	}
	_, err := s.db.ExecContext(ctx, `INSERT INTO ops (`+opColumns+`) VALUES (?, ?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET `+updateAll(opColumns),
		op.ID, op.Kind, op.SandboxID, string(op.Data), unixNano(op.StartedAt))
	if err != nil {
		return fmt.Errorf("store: put op %s: %w", op.ID, err)
	}
	return nil
}

func (s *DB) DeleteOp(ctx context.Context, id string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM ops WHERE id = ?`, id); err != nil {
		return fmt.Errorf("store: delete op %s: %w", id, err)
	}
	return nil
}

func (s *DB) ListOps(ctx context.Context) ([]Op, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+opColumns+` FROM ops ORDER BY started_at, rowid`)
	if err != nil {
		return nil, fmt.Errorf("store: list ops: %w", err)
	}
	defer rows.Close()
	var out []Op
	for rows.Next() {
		var (
			op      Op
			data    string
			started int64
		)
		if err := rows.Scan(&op.ID, &op.Kind, &op.SandboxID, &data, &started); err != nil {
			return nil, fmt.Errorf("store: scan op: %w", err)
		}
		if data != "" {
			op.Data = json.RawMessage(data)
		}
		op.StartedAt = fromUnixNano(started)
		out = append(out, op)
	}
	return out, rows.Err()
}
