package sandbox

// Retention of paused sandboxes: a paused sandbox holds disk (its writable
// layer, and its checkpoint image when paused with memory) but no process,
// so nothing else ever ends it. One paused longer than
// Options.PausedRetention ago is killed like any other: its image, writable
// layer, network and record go (its cleanup stack, cleanup.go).

import (
	"context"
	"time"

	"github.com/airlock-sandbox/airlock/internal/lifecycle"
)

// DefaultPausedRetention is how long `airlock serve` keeps a paused sandbox
// unless told otherwise (E2B keeps them 30 days).
const DefaultPausedRetention = 30 * 24 * time.Hour

// retentionInterval is how often the sweep runs: often enough that a
// sandbox outlives its retention by a small part of it, and at most hourly.
func retentionInterval(retention time.Duration) time.Duration {
	return min(max(retention/10, time.Second), time.Hour)
}

// retentionLoop sweeps once at once (Start runs after Recover, so this is
// the sweep of what a previous server left) and then periodically.
func (m *Manager) retentionLoop() {
	defer m.wg.Done()
	if m.opts.PausedRetention <= 0 {
		return
	}
	t := time.NewTicker(retentionInterval(m.opts.PausedRetention))
	defer t.Stop()
	for {
		m.sweepPaused(time.Now())
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
	}
}

// sweepPaused kills every sandbox paused at least PausedRetention before
// now and returns how many it killed.
func (m *Manager) sweepPaused(now time.Time) int {
	retention := m.opts.PausedRetention
	if retention <= 0 {
		return 0
	}
	expired := func(e *entry) bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.info.State == StatePaused && !e.info.PausedAt.IsZero() && now.Sub(e.info.PausedAt) >= retention
	}
	m.mu.Lock()
	live := m.liveLocked()
	m.mu.Unlock()
	n := 0
	for _, e := range live {
		if !expired(e) {
			continue
		}
		err := m.with(e.id, func(e *entry) error {
			// Checked again under the op lock: a resume may have won.
			if !expired(e) {
				return nil
			}
			e.mu.Lock()
			at := e.info.PausedAt
			e.mu.Unlock()
			m.log.Info("deleting a paused sandbox past its retention", "id", e.id, "paused_at", at, "retention", retention)
			m.kill(context.Background(), e, lifecycle.KillPausedRetention)
			n++
			return nil
		})
		if err != nil {
			// Killed or resumed meanwhile: nothing to do.
			m.log.Debug("retention sweep", "id", e.id, "err", err)
		}
	}
	return n
}
