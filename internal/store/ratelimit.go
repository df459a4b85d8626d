package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"time"
)

// rateSchema holds the token buckets of the API's rate limits where
// replicas share them (the Kubernetes backend: a key's requests count
// against one bucket whichever replica serves them). One box keeps its
// buckets in memory.
const rateSchema = `
CREATE TABLE IF NOT EXISTS rate_buckets (
	bucket TEXT PRIMARY KEY,
	tat    BIGINT NOT NULL
);`

// TakeToken spends one token of the bucket named bucket, which refills at
// rate tokens a second up to burst, or spends none and says how long until
// one is there. The bucket is a GCRA cell: tat, its theoretical arrival
// time, is when it would be full again; a take moves it on by one
// interval, unless that would put it more than burst intervals ahead of
// now. Check and move are one statement, so replicas taking from the same
// bucket at once never both spend its last token.
func (s *DB) TakeToken(ctx context.Context, bucket string, rate float64, burst int, now time.Time) (bool, time.Duration, error) {
	if rate <= 0 {
		return true, 0, nil
	}
	interval := int64(math.Ceil(float64(time.Second) / rate))
	limit := int64(max(burst, 1)) * interval
	at := now.UnixNano()
	var tat int64
	err := s.db.QueryRowContext(ctx, `INSERT INTO rate_buckets (bucket, tat) VALUES (?, ?)
		ON CONFLICT (bucket) DO UPDATE SET tat = (CASE WHEN rate_buckets.tat > ? THEN rate_buckets.tat ELSE ? END) + ?
		WHERE (CASE WHEN rate_buckets.tat > ? THEN rate_buckets.tat ELSE ? END) + ? - ? <= ?
		RETURNING tat`, bucket, at+interval, at, at, interval, at, at, interval, at, limit).Scan(&tat)
	if err == nil {
		return true, 0, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return false, 0, fmt.Errorf("store: rate bucket %s: %w", bucket, err)
	}
	// Refused: the bucket is as it was; the next token comes when the
	// cell is back within burst intervals of now.
	if err := s.db.QueryRowContext(ctx, `SELECT tat FROM rate_buckets WHERE bucket = ?`, bucket).Scan(&tat); err != nil {
		return false, 0, fmt.Errorf("store: rate bucket %s: %w", bucket, err)
	}
	return false, time.Duration(max(tat, at) + interval - at - limit), nil
}
