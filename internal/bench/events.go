package bench

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/airlock-sandbox/airlock/internal/lifecycle"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// EventsGate stands between the manager and the lifecycle event store so
// that one server can create with recording on and off in the same run:
// off, Record returns at once without touching the event store, and the
// writes that carry a record with their event write the record alone, as
// a manager without an event log does.
type EventsGate struct {
	sandbox.EventLog
	records store.Store
	off     atomic.Bool
}

// NewEventsGate returns a gate, open (recording), over log; records is the
// store the manager's sandbox records are in.
func NewEventsGate(log sandbox.EventLog, records store.Store) *EventsGate {
	return &EventsGate{EventLog: log, records: records}
}

// Record implements lifecycle.Recorder.
func (g *EventsGate) Record(ctx context.Context, e lifecycle.Event) (lifecycle.Event, error) {
	if g.off.Load() {
		return e, nil
	}
	return g.EventLog.Record(ctx, e)
}

// RecordWithSandbox implements sandbox.EventLog.
func (g *EventsGate) RecordWithSandbox(ctx context.Context, e lifecycle.Event, rec store.Sandbox) (lifecycle.Event, error) {
	if g.off.Load() {
		return e, g.records.Put(ctx, rec)
	}
	return g.EventLog.RecordWithSandbox(ctx, e, rec)
}

// RecordWithSnapshot implements sandbox.EventLog.
func (g *EventsGate) RecordWithSnapshot(ctx context.Context, e lifecycle.Event, rec store.Snapshot) (lifecycle.Event, string, error) {
	if g.off.Load() {
		replaced, err := g.records.PutSnapshot(ctx, rec)
		return e, replaced, err
	}
	return g.EventLog.RecordWithSnapshot(ctx, e, rec)
}

// EventsConfig configures RunEvents.
type EventsConfig struct {
	Config
	// Store is a lifecycle event store to measure Record on, with the server
	// running beside it.
	Store lifecycle.Recorder
	// Gate is the one the server's manager records through.
	Gate *EventsGate
	// Records is how many events are recorded one after another, and by
	// each of Workers goroutines at once.
	Records, Workers int
	// Creates is how many creates are measured with recording on, and as
	// many with it off, interleaved.
	Creates int
}

// RunEvents measures the lifecycle event store (events it accepts per
// second, recorded one after another and from several goroutines at once)
// and what recording costs a create: creates through the API with the
// manager recording and not, interleaved one by one so that both see the
// same machine.
func RunEvents(ctx context.Context, cfg EventsConfig) ([]Row, error) {
	var rows []Row
	add := func(r Row) {
		rows = append(rows, r)
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, "measured %s (%d samples)\n", r.Name, len(r.Samples))
		}
	}
	ev := func(i int) lifecycle.Event {
		return lifecycle.Event{
			Type: lifecycle.Updated, SandboxID: fmt.Sprintf("benchevents%09d", i), SandboxTeamID: "bench-events",
			SandboxTemplateID: "base", SandboxExecutionID: "bench", SandboxBuildID: "bench",
			EventData: []byte(`{"sandbox_metadata":{"bench":"events"},"set_timeout":"2030-01-01T00:00:00Z"}`),
		}
	}

	seq := Row{Name: fmt.Sprintf("lifecycle event Record, %d sequential", cfg.Records)}
	start := time.Now()
	for i := range cfg.Records {
		t := time.Now()
		if _, err := cfg.Store.Record(ctx, ev(i)); err != nil {
			return nil, err
		}
		seq.Samples = append(seq.Samples, time.Since(t))
	}
	seq.Note = rate(cfg.Records, time.Since(start))
	add(seq)

	conc := Row{Name: fmt.Sprintf("lifecycle event Record, %d goroutines x %d", cfg.Workers, cfg.Records)}
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		errs = make(chan error, cfg.Workers)
	)
	start = time.Now()
	for w := range cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := make([]time.Duration, 0, cfg.Records)
			for i := range cfg.Records {
				t := time.Now()
				if _, err := cfg.Store.Record(ctx, ev(w*cfg.Records+i)); err != nil {
					errs <- err
					return
				}
				local = append(local, time.Since(t))
			}
			mu.Lock()
			conc.Samples = append(conc.Samples, local...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, err
	}
	conc.Note = rate(cfg.Workers*cfg.Records, time.Since(start))
	add(conc)

	c := newClient(cfg.Config)
	// Warm-up: the first create pays for page-cache misses of the template.
	sb, err := c.create(ctx)
	if err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	c.kill(ctx, sb)
	on := Row{Name: fmt.Sprintf("create (POST /sandboxes), events recorded, %d", cfg.Creates)}
	off := Row{Name: fmt.Sprintf("create (POST /sandboxes), events off, %d", cfg.Creates)}
	defer cfg.Gate.off.Store(false)
	for i := range 2 * cfg.Creates {
		row := &on
		if i%2 == 1 {
			row = &off
		}
		cfg.Gate.off.Store(row == &off)
		t := time.Now()
		sb, err := c.create(ctx)
		if err != nil {
			return nil, err
		}
		row.Samples = append(row.Samples, time.Since(t))
		c.kill(ctx, sb)
	}
	on.Note = fmt.Sprintf("recording adds %+.2f ms at p50 (%+.2f ms mean)", delta(on.Samples, off.Samples, true), delta(on.Samples, off.Samples, false))
	add(on)
	add(off)
	return rows, nil
}

// delta is a's p50 (or mean) minus b's, in milliseconds.
func delta(a, b []time.Duration, p50 bool) float64 {
	stat := func(s []time.Duration) time.Duration {
		s = slices.Clone(s)
		slices.Sort(s)
		if p50 {
			return Percentile(s, 50)
		}
		var sum time.Duration
		for _, d := range s {
			sum += d
		}
		return sum / time.Duration(max(len(s), 1))
	}
	return float64(stat(a)-stat(b)) / float64(time.Millisecond)
}

func rate(n int, d time.Duration) string {
	return fmt.Sprintf("%.0f events/s", float64(n)/d.Seconds())
}
