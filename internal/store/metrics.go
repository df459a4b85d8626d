package store

import (
	"context"
	"fmt"
	"time"
)

// metricsSchema holds the sandboxes' resource samples where replicas share
// them (the Kubernetes backend: one replica samples, any replica answers
// GET /sandboxes/{id}/metrics). One box keeps its samples in memory.
const metricsSchema = `
CREATE TABLE IF NOT EXISTS sandbox_metrics (
	sandbox_id   TEXT NOT NULL,
	at           BIGINT NOT NULL,
	cpu_count    BIGINT NOT NULL,
	cpu_used_pct DOUBLE PRECISION NOT NULL,
	mem_used     BIGINT NOT NULL,
	mem_total    BIGINT NOT NULL,
	mem_cache    BIGINT NOT NULL,
	disk_used    BIGINT NOT NULL,
	disk_total   BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS sandbox_metrics_sandbox ON sandbox_metrics (sandbox_id, at);
CREATE INDEX IF NOT EXISTS sandbox_metrics_at ON sandbox_metrics (at);`

// Metric is one resource sample of a sandbox.
type Metric struct {
	SandboxID  string
	Time       time.Time
	CPUCount   int
	CPUUsedPct float64
	MemUsed    int64
	MemTotal   int64
	MemCache   int64
	DiskUsed   int64
	DiskTotal  int64
}

// AddMetrics writes samples, in one transaction.
func (s *DB) AddMetrics(ctx context.Context, ms []Metric) error {
	if len(ms) == 0 {
		return nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: add metrics: %w", err)
	}
	defer tx.Rollback()
	for _, m := range ms {
		if _, err := tx.ExecContext(ctx, `INSERT INTO sandbox_metrics (sandbox_id, at, cpu_count, cpu_used_pct, mem_used, mem_total, mem_cache, disk_used, disk_total)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`, m.SandboxID, m.Time.UnixNano(), m.CPUCount, m.CPUUsedPct,
			m.MemUsed, m.MemTotal, m.MemCache, m.DiskUsed, m.DiskTotal); err != nil {
			return fmt.Errorf("store: add metrics of %s: %w", m.SandboxID, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: add metrics: %w", err)
	}
	return nil
}

// Metrics returns a sandbox's samples taken from start to end (a zero time
// bounds nothing), oldest first.
func (s *DB) Metrics(ctx context.Context, sandboxID string, start, end time.Time) ([]Metric, error) {
	from, to := int64(0), int64(1<<63-1)
	if !start.IsZero() {
		from = start.UnixNano()
	}
	if !end.IsZero() {
		to = end.UnixNano()
	}
	rows, err := s.db.QueryContext(ctx, `SELECT at, cpu_count, cpu_used_pct, mem_used, mem_total, mem_cache, disk_used, disk_total
		FROM sandbox_metrics WHERE sandbox_id = ? AND at >= ? AND at <= ? ORDER BY at`, sandboxID, from, to)
	if err != nil {
		return nil, fmt.Errorf("store: metrics of %s: %w", sandboxID, err)
	}
	defer rows.Close()
	out := []Metric{}
	for rows.Next() {
		m := Metric{SandboxID: sandboxID}
		var at int64
		if err := rows.Scan(&at, &m.CPUCount, &m.CPUUsedPct, &m.MemUsed, &m.MemTotal, &m.MemCache, &m.DiskUsed, &m.DiskTotal); err != nil {
			return nil, fmt.Errorf("store: metrics of %s: %w", sandboxID, err)
		}
		m.Time = time.Unix(0, at)
		out = append(out, m)
	}
	return out, rows.Err()
}

// PruneMetrics deletes the samples taken before t, of every sandbox.
func (s *DB) PruneMetrics(ctx context.Context, t time.Time) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM sandbox_metrics WHERE at < ?`, t.UnixNano()); err != nil {
		return fmt.Errorf("store: prune metrics: %w", err)
	}
	return nil
}
