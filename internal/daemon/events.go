package daemon

import (
	"context"
	"time"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// DefaultEventsRetention is how long lifecycle events are kept unless
// serve --events-retention says otherwise (E2B keeps them 7 days).
const DefaultEventsRetention = 7 * 24 * time.Hour

// startEvents opens the lifecycle event store over the database and prunes
// it of events older than the retention: at once (what a stopped server
// left to age) and then periodically, until Close.
func (d *Daemon) startEvents() {
	d.Events = store.NewLifecycleEvents(d.Store)
	retention := d.cfg.EventsRetention
	if retention <= 0 {
		retention = DefaultEventsRetention
	}
	// Often enough that an event outlives its retention by a small part of
	// it, and at most hourly.
	every := min(max(retention/10, time.Second), time.Hour)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			if n, err := d.Events.PruneBefore(ctx, time.Now().Add(-retention)); err != nil {
				if ctx.Err() != nil {
					return
				}
				d.log.Warn("lifecycle events: prune", "err", err)
			} else if n > 0 {
				d.log.Debug("lifecycle events: pruned", "deleted", n, "retention", retention)
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	d.push("lifecycle events", func() error {
		stop()
		<-done
		return nil
	})
}

// managerEvents is what the manager records through.
func (d *Daemon) managerEvents() sandbox.EventLog {
	if d.cfg.WrapEvents != nil {
		return d.cfg.WrapEvents(d.Events, d.Store)
	}
	return d.Events
}
