package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Volume is the record of one volume: storage that outlives sandboxes
// (internal/volume owns its directory; this is data only).
type Volume struct {
	ID    string
	Owner string // digest of the API key that created it; names are unique per owner
	Name  string
	// Token opens the volume's content API. It is stored as sandboxes'
	// AccessToken is, because GET /volumes/{id} must show it again.
	Token     string
	SizeBytes int64 // the quota its directory was made with
	CreatedAt time.Time
	State     string
}

// The states of a volume record. A record is written before its directory
// is made and removed after its directory is gone, so the state says which
// half of a create or destroy a crash interrupted (volume.Service.Recover).
const (
	VolumeCreating = "creating"
	VolumeReady    = "ready"
	VolumeDeleting = "deleting"
)

// ErrExists is returned when a volume name is taken for its owner.
var ErrExists = errors.New("store: already exists")

// ErrVolumeLimit is returned (wrapped, with which limit) when an insert would
// take an owner past its number of volumes or its total quota.
var ErrVolumeLimit = errors.New("store: volume limit reached")

// ErrVolumeSpace is returned (wrapped, with the figures) when an insert
// would take an owner's volumes past their total size.
var ErrVolumeSpace = errors.New("store: volume space used up")

// VolumeLimits bound one owner's volumes; zero fields limit nothing.
type VolumeLimits struct {
	MaxCount int
	MaxBytes int64
}

const volumeSchema = `
CREATE TABLE IF NOT EXISTS volumes (
	id         TEXT PRIMARY KEY,
	owner      TEXT NOT NULL,
	name       TEXT NOT NULL,
	token      TEXT NOT NULL,
	size_bytes BIGINT NOT NULL,
	created_at BIGINT NOT NULL,
	state      TEXT NOT NULL,
	UNIQUE (owner, name)
);`

const volumeColumns = `id, owner, name, token, size_bytes, created_at, state`

// InsertVolume adds a new record after checking, in the same transaction,
// that its name is free for its owner (ErrExists) and that the owner stays
// within lim (ErrVolumeLimit): two creates at once cannot both pass.
// Records being deleted still count: their space is not free yet.
func (s *DB) InsertVolume(ctx context.Context, v Volume, lim VolumeLimits) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: insert volume: %w", err)
	}
	defer tx.Rollback()
	// The owner's lock: two creates by two processes on PostgreSQL would
	// otherwise both pass the checks below.
	if err := tx.lock(ctx, "volumes", v.Owner); err != nil {
		return fmt.Errorf("store: insert volume: %w", err)
	}
	var taken int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM volumes WHERE owner = ? AND name = ?`, v.Owner, v.Name).Scan(&taken); err != nil {
		return fmt.Errorf("store: insert volume: %w", err)
	}
	if taken > 0 {
		return fmt.Errorf("%w: volume %q", ErrExists, v.Name)
	}
	var count int
	var total int64
	if err := tx.QueryRowContext(ctx, `SELECT count(*), CAST(coalesce(sum(size_bytes), 0) AS BIGINT) FROM volumes WHERE owner = ?`, v.Owner).Scan(&count, &total); err != nil {
		return fmt.Errorf("store: insert volume: %w", err)
	}
	if lim.MaxCount > 0 && count+1 > lim.MaxCount {
		return fmt.Errorf("%w: an API key may have at most %d volumes", ErrVolumeLimit, lim.MaxCount)
	}
	if lim.MaxBytes > 0 && total+v.SizeBytes > lim.MaxBytes {
		return fmt.Errorf("%w: quota of volume space reached: the team's volumes may total at most %d MiB (%d MiB in use, %d MiB asked)",
			ErrVolumeSpace, lim.MaxBytes>>20, total>>20, v.SizeBytes>>20)
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO volumes (`+volumeColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?)`,
		v.ID, v.Owner, v.Name, v.Token, v.SizeBytes, v.CreatedAt.UnixNano(), v.State)
	if err != nil {
		if isUnique(err) {
			return fmt.Errorf("%w: volume %s", ErrExists, v.ID)
		}
		return fmt.Errorf("store: insert volume %s: %w", v.ID, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: insert volume %s: %w", v.ID, err)
	}
	return nil
}

// SetVolumeState changes a record's state; ErrNotFound if there is none.
func (s *DB) SetVolumeState(ctx context.Context, id, state string) error {
	return s.updateOne(ctx, "volume "+id, `UPDATE volumes SET state = ? WHERE id = ?`, state, id)
}

// GetVolume returns a record by ID, whoever owns it (the content API checks
// the volume's token instead); ErrNotFound if there is none.
func (s *DB) GetVolume(ctx context.Context, id string) (Volume, error) {
	v, err := scanVolume(s.db.QueryRowContext(ctx, `SELECT `+volumeColumns+` FROM volumes WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Volume{}, fmt.Errorf("%w: volume %s", ErrNotFound, id)
	}
	return v, err
}

// ListVolumes returns an owner's records (every owner's when owner is ""),
// oldest first.
func (s *DB) ListVolumes(ctx context.Context, owner string) ([]Volume, error) {
	q := `SELECT ` + volumeColumns + ` FROM volumes`
	var args []any
	if owner != "" {
		q += ` WHERE owner = ?`
		args = append(args, owner)
	}
	rows, err := s.db.QueryContext(ctx, q+` ORDER BY created_at, id`, args...)
	if err != nil {
		return nil, fmt.Errorf("store: list volumes: %w", err)
	}
	defer rows.Close()
	var out []Volume
	for rows.Next() {
		v, err := scanVolume(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// DeleteVolume removes a record; an unknown ID is no error.
func (s *DB) DeleteVolume(ctx context.Context, id string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM volumes WHERE id = ?`, id); err != nil {
		return fmt.Errorf("store: delete volume %s: %w", id, err)
	}
	return nil
}

func scanVolume(row interface{ Scan(...any) error }) (Volume, error) {
	var v Volume
	var created int64
	if err := row.Scan(&v.ID, &v.Owner, &v.Name, &v.Token, &v.SizeBytes, &created, &v.State); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return Volume{}, err
		}
		return Volume{}, fmt.Errorf("store: scan volume: %w", err)
	}
	v.CreatedAt = time.Unix(0, created)
	return v, nil
}
