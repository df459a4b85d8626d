package sandbox

import (
	"context"
	"fmt"

	"github.com/airlock-sandbox/airlock/internal/runtime"
)

// Stats reads sandbox id's resource use from its runtime now, where Metrics
// reports samples up to MetricsInterval old: `airlock bench persist` needs
// what a sandbox holds at the instant before it pauses. A sandbox paused to
// disk has no runtime sandbox to ask (ErrConflict); one frozen in place
// answers, its memory still resident.
func (m *Manager) Stats(_ context.Context, id string) (runtime.Stats, error) {
	var st runtime.Stats
	// Under op, as sample: Stats must not run beside the runtime's Destroy
	// or Checkpoint.
	err := m.with(id, func(e *entry) error {
		if e.rt == nil {
			return fmt.Errorf("%w: sandbox %q has no processes on the host", ErrConflict, id)
		}
		var err error
		if st, err = e.rt.Stats(); err != nil {
			return fmt.Errorf("stats %s: %w", id, err)
		}
		return nil
	})
	return st, err
}

// stats samples rt; without the writable layer's walk when the disk pool
// accounts for it (diskUsed).
func (m *Manager) stats(rt runtime.Sandbox) (runtime.Stats, error) {
	if rs, ok := rt.(runtime.ResourceStatter); ok && m.opts.Disk != nil {
		return rs.ResourceStats()
	}
	return rt.Stats()
}
