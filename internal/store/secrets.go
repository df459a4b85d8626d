package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Secret is the record of one secret (internal/secret owns its meaning; this
// is data only). The value is kept only as Sealed, ciphertext the secret
// package made: the store never sees it in the clear.
type Secret struct {
	ID    string
	Owner string // digest of the API key that created it; names are unique per owner
	Name  string // canonical (lower-case)
	// Version is 1 at create and one more at every update. Only the current
	// version's value is kept.
	Version  int64
	Metadata map[string]string
	// Sealed is the encrypted value; KeyID names the key it was sealed with,
	// so a value sealed under another key is told apart from a damaged one.
	// Both are empty in what ListSecrets returns.
	Sealed    []byte
	KeyID     string
	CreatedAt time.Time
	UpdatedAt time.Time
}

// ErrSecretLimit is returned (wrapped) when an insert would take an owner
// past its number of secrets.
var ErrSecretLimit = errors.New("store: secret limit reached")

const secretSchema = `
CREATE TABLE IF NOT EXISTS secrets (
	id         TEXT PRIMARY KEY,
	owner      TEXT NOT NULL,
	name       TEXT NOT NULL,
	version    BIGINT NOT NULL,
	metadata   TEXT NOT NULL,
	sealed     BLOB NOT NULL,
	key_id     TEXT NOT NULL,
	created_at BIGINT NOT NULL,
	updated_at BIGINT NOT NULL,
	UNIQUE (owner, name)
);`

const (
	secretColumns     = `id, owner, name, version, metadata, sealed, key_id, created_at, updated_at`
	secretInfoColumns = `id, owner, name, version, metadata, NULL, '', created_at, updated_at`
)

// InsertSecret adds a new record after checking, in the same transaction,
// that its name is free for its owner (ErrExists) and that the owner keeps
// at most maxCount secrets (ErrSecretLimit; maxCount <= 0 limits nothing).
func (s *DB) InsertSecret(ctx context.Context, sec Secret, maxCount int) error {
	md, err := json.Marshal(nonNil(sec.Metadata))
	if err != nil {
		return fmt.Errorf("store: secret metadata: %w", err)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: insert secret: %w", err)
	}
	defer tx.Rollback()
	// The owner's lock: two inserts by two processes on PostgreSQL would
	// otherwise both pass the count below.
	if err := tx.lock(ctx, "secrets", sec.Owner); err != nil {
		return fmt.Errorf("store: insert secret: %w", err)
	}
	var taken, count int
	if err := tx.QueryRowContext(ctx, `SELECT count(*), coalesce(sum(CASE WHEN name = ? THEN 1 ELSE 0 END), 0) FROM secrets WHERE owner = ?`,
		sec.Name, sec.Owner).Scan(&count, &taken); err != nil {
		return fmt.Errorf("store: insert secret: %w", err)
	}
	if taken > 0 {
		return fmt.Errorf("%w: secret %q", ErrExists, sec.Name)
	}
	if maxCount > 0 && count+1 > maxCount {
		return fmt.Errorf("%w: an API key may have at most %d secrets", ErrSecretLimit, maxCount)
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO secrets (`+secretColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		sec.ID, sec.Owner, sec.Name, sec.Version, string(md), sec.Sealed, sec.KeyID, sec.CreatedAt.UnixNano(), sec.UpdatedAt.UnixNano())
	if err != nil {
		if isUnique(err) {
			return fmt.Errorf("%w: secret %s", ErrExists, sec.ID)
		}
		return fmt.Errorf("store: insert secret %s: %w", sec.ID, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: insert secret %s: %w", sec.ID, err)
	}
	return nil
}

// SecretUpdate is a new version of a secret: its sealed value (sealed with
// the secret's ID and owner, which do not change) and, when Metadata is not
// nil, its new metadata (nil keeps the old).
type SecretUpdate struct {
	Sealed    []byte
	KeyID     string
	Metadata  map[string]string
	UpdatedAt time.Time
}

// UpdateSecret replaces owner's secret id's value with u, one version up,
// and returns the record as it now is (without its value); ErrNotFound when
// owner has no such secret. The old value is overwritten, not kept.
func (s *DB) UpdateSecret(ctx context.Context, owner, id string, u SecretUpdate) (Secret, error) {
	var md any // NULL keeps the stored metadata
	if u.Metadata != nil {
		b, err := json.Marshal(u.Metadata)
		if err != nil {
			return Secret{}, fmt.Errorf("store: secret metadata: %w", err)
		}
		md = string(b)
	}
	sec, err := scanSecret(s.db.QueryRowContext(ctx, `UPDATE secrets
		SET version = version + 1, sealed = ?, key_id = ?, metadata = coalesce(?, metadata), updated_at = ?
		WHERE id = ? AND owner = ? RETURNING `+secretInfoColumns,
		u.Sealed, u.KeyID, md, u.UpdatedAt.UnixNano(), id, owner))
	if errors.Is(err, sql.ErrNoRows) {
		return Secret{}, fmt.Errorf("%w: secret %s", ErrNotFound, id)
	}
	if err != nil {
		return Secret{}, fmt.Errorf("store: update secret %s: %w", id, err)
	}
	return sec, nil
}

// GetSecret returns owner's secret by ID, or by canonical name when byName,
// with its sealed value; ErrNotFound if owner has none (another owner's
// secret is not found either).
func (s *DB) GetSecret(ctx context.Context, owner, ref string, byName bool) (Secret, error) {
	col := "id"
	if byName {
		col = "name"
	}
	sec, err := scanSecret(s.db.QueryRowContext(ctx, `SELECT `+secretColumns+` FROM secrets WHERE owner = ? AND `+col+` = ?`, owner, ref))
	if errors.Is(err, sql.ErrNoRows) {
		return Secret{}, fmt.Errorf("%w: secret %s", ErrNotFound, ref)
	}
	return sec, err
}

// ListSecrets returns up to limit of owner's secrets (every owner's when
// owner is ""), in name order after the name after ("" starts at the
// first), without their values.
func (s *DB) ListSecrets(ctx context.Context, owner, after string, limit int) ([]Secret, error) {
	q := `SELECT ` + secretInfoColumns + ` FROM secrets WHERE name > ?`
	args := []any{after}
	if owner != "" {
		q += ` AND owner = ?`
		args = append(args, owner)
	}
	q += ` ORDER BY name, owner`
	if limit > 0 {
		q += ` LIMIT ?`
		args = append(args, limit)
	}
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("store: list secrets: %w", err)
	}
	defer rows.Close()
	var out []Secret
	for rows.Next() {
		sec, err := scanSecret(rows)
		if err != nil {
			return nil, fmt.Errorf("store: list secrets: %w", err)
		}
		out = append(out, sec)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list secrets: %w", err)
	}
	return out, nil
}

// CountSecretsNotUnder counts the secrets sealed with another key than
// keyID (a key file replaced or lost since they were stored).
func (s *DB) CountSecretsNotUnder(ctx context.Context, keyID string) (int, error) {
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM secrets WHERE key_id != ?`, keyID).Scan(&n); err != nil {
		return 0, fmt.Errorf("store: count secrets: %w", err)
	}
	return n, nil
}

// DeleteSecret removes owner's secret id, its value with it; ErrNotFound
// when owner has no such secret.
func (s *DB) DeleteSecret(ctx context.Context, owner, id string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM secrets WHERE id = ? AND owner = ?`, id, owner)
	if err != nil {
		return fmt.Errorf("store: delete secret %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w: secret %s", ErrNotFound, id)
	}
	return nil
}

func scanSecret(row interface{ Scan(...any) error }) (Secret, error) {
	var sec Secret
	var md string
	var created, updated int64
	if err := row.Scan(&sec.ID, &sec.Owner, &sec.Name, &sec.Version, &md, &sec.Sealed, &sec.KeyID, &created, &updated); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return Secret{}, err
		}
		return Secret{}, fmt.Errorf("store: scan secret: %w", err)
	}
	if err := json.Unmarshal([]byte(md), &sec.Metadata); err != nil {
		return Secret{}, fmt.Errorf("store: secret %s metadata: %w", sec.ID, err)
	}
	if sec.Metadata == nil {
		sec.Metadata = map[string]string{}
	}
	if len(sec.Sealed) == 0 {
		sec.Sealed = nil
	}
	sec.CreatedAt = time.Unix(0, created)
	sec.UpdatedAt = time.Unix(0, updated)
	return sec, nil
}
