package store

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/lifecycle"
	"github.com/airlock-sandbox/airlock/internal/store/pgtest"
)

// The tests here are of several server processes (replicas) sharing one
// PostgreSQL database: each *DB opened on it is one replica's store, with
// its own pool of connections. They cover what SQLite's single writer made
// safe and PostgreSQL's concurrent transactions would not on their own.

// replicas opens n stores on one fresh PostgreSQL database.
func replicas(t *testing.T, n int) []*DB {
	t.Helper()
	open := opener(t, "postgres")
	out := make([]*DB, n)
	for i := range out {
		out[i] = open()
	}
	return out
}

// together runs f(0..n-1) in goroutines released at once, and waits.
func together(n int, f func(i int)) {
	var ready, done sync.WaitGroup
	start := make(chan struct{})
	ready.Add(n)
	done.Add(n)
	for i := range n {
		go func() {
			defer done.Done()
			ready.Done()
			<-start
			f(i)
		}()
	}
	ready.Wait()
	close(start)
	done.Wait()
}

// TestPostgresReplicasOpenAtOnce: replicas opening one empty database at the
// same moment all succeed (one makes the schema, the others find it), and
// each then reads what another wrote.
func TestPostgresReplicasOpenAtOnce(t *testing.T) {
	ctx := context.Background()
	for round := range 3 {
		dsn := pgtest.NewDatabase(t)
		const n = 6
		dbs := make([]*DB, n)
		errs := make([]error, n)
		together(n, func(i int) { dbs[i], errs[i] = OpenPostgres(ctx, dsn) })
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d: replica %d: %v", round, i, err)
			}
			t.Cleanup(func() { dbs[i].Close() })
		}
		if err := dbs[0].Put(ctx, Sandbox{ID: "sb", State: "running"}); err != nil {
			t.Fatal(err)
		}
		for i, db := range dbs {
			if got, err := db.Get(ctx, "sb"); err != nil || got.State != "running" {
				t.Fatalf("round %d: replica %d reads %+v, %v", round, i, got, err)
			}
		}
	}
}

// TestPostgresSnapshotNameAcrossReplicas: puts of one owner's name from two
// replicas at once (plain and with their checkpointed event) leave exactly
// one snapshot with the name, and report every other one replaced exactly
// once, as on SQLite.
func TestPostgresSnapshotNameAcrossReplicas(t *testing.T) {
	ctx := context.Background()
	dbs := replicas(t, 2)
	events := []*LifecycleEvents{NewLifecycleEvents(dbs[0]), NewLifecycleEvents(dbs[1])}
	const n = 24
	var (
		mu       sync.Mutex
		replaced []string
	)
	together(n, func(i int) {
		sn := Snapshot{ID: fmt.Sprintf("s%02d", i), Name: "same", Owner: "team", CreatedAt: time.Unix(int64(i), 0)}
		var r string
		var err error
		if i%3 == 0 {
			_, r, err = events[i%2].RecordWithSnapshot(ctx, ev("team", "sb", lifecycle.Checkpointed, time.Time{}), sn)
		} else {
			r, err = dbs[i%2].PutSnapshot(ctx, sn)
		}
		if err != nil {
			t.Error(err)
			return
		}
		if r != "" {
			mu.Lock()
			replaced = append(replaced, r)
			mu.Unlock()
		}
	})
	list, err := dbs[0].ListSnapshots(ctx, SnapshotFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Name != "same" {
		t.Fatalf("after the race: %+v", list)
	}
	all := append(replaced, list[0].ID)
	sort.Strings(all)
	for i, id := range all {
		if id != fmt.Sprintf("s%02d", i) {
			t.Fatalf("replaced ids plus the survivor = %v, want each of s00..s%02d once", all, n-1)
		}
	}
}

// TestPostgresDeliveryClaims: the dispatchers of two replicas, several
// workers each, drain one outbox at once. No delivery is handed to two
// workers, every one is delivered, and a sandbox's deliveries to a webhook
// are handed out one at a time in the order of their events.
func TestPostgresDeliveryClaims(t *testing.T) {
	ctx := context.Background()
	dbs := replicas(t, 2)
	t0 := time.Now().Add(-time.Minute)
	if err := dbs[0].PutWebhook(ctx, Webhook{ID: "w", Owner: "o", Enabled: true, Events: []string{"c"}, CreatedAt: t0}); err != nil {
		t.Fatal(err)
	}
	const sandboxes, perSandbox = 20, 4
	var batch []DispatchEvent
	for i := range sandboxes * perSandbox {
		batch = append(batch, DispatchEvent{ID: fmt.Sprintf("e%03d", i), Seq: int64(i + 1), Type: "c", Owner: "o",
			SandboxID: fmt.Sprintf("sb%02d", i%sandboxes), Time: t0, Payload: []byte(`{}`)})
	}
	if n, err := dbs[1].DispatchEvents(ctx, batch, int64(len(batch)), t0); err != nil || n != len(batch) {
		t.Fatalf("DispatchEvents = %d, %v", n, err)
	}
	seqOf := map[string]int64{}
	for _, e := range batch {
		seqOf[e.ID] = e.Seq
	}

	var (
		mu       sync.Mutex
		handed   = map[string]int{}   // delivery ID → times handed out
		lastSeq  = map[string]int64{} // sandbox → seq of the last one handed out
		finished = map[string]bool{}  // event ID → its attempt is being recorded
		failed   error
	)
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if failed == nil {
			failed = err
		}
	}
	const workersPerReplica = 4
	deadline := time.Now().Add(30 * time.Second)
	together(2*workersPerReplica, func(w int) {
		db := dbs[w%2]
		for time.Now().Before(deadline) {
			due, err := db.DueDeliveries(ctx, time.Now(), 2, nil)
			if err != nil {
				fail(err)
				return
			}
			if len(due) == 0 {
				mu.Lock()
				all := len(finished) == len(batch)
				mu.Unlock()
				if all {
					return
				}
				time.Sleep(time.Millisecond)
				continue
			}
			for _, d := range due {
				mu.Lock()
				handed[d.ID]++
				if seq := seqOf[d.EventID]; seq < lastSeq[d.SandboxID] {
					failed = errors.Join(failed, fmt.Errorf("%s handed out after a later event of %s", d.EventID, d.SandboxID))
				} else {
					for _, e := range batch {
						if e.SandboxID == d.SandboxID && e.Seq < seq && !finished[e.ID] {
							failed = errors.Join(failed, fmt.Errorf("%s handed out before %s of %s was attempted", d.EventID, e.ID, d.SandboxID))
						}
					}
					lastSeq[d.SandboxID] = seq
				}
				finished[d.EventID] = true
				mu.Unlock()
				if err := db.RecordAttempt(ctx, d.ID, Attempt{At: time.Now(), HTTP: 204}, DeliveryDelivered, time.Time{}); err != nil {
					fail(err)
					return
				}
			}
		}
		fail(fmt.Errorf("worker %d: not drained in time", w))
	})
	if failed != nil {
		t.Fatal(failed)
	}
	if len(handed) != len(batch) {
		t.Fatalf("%d deliveries handed out, want %d", len(handed), len(batch))
	}
	for id, n := range handed {
		if n != 1 {
			t.Errorf("delivery %s handed out %d times", id, n)
		}
	}
	ds, err := dbs[0].ListDeliveries(ctx, "o", "w", 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ds {
		if d.Status != DeliveryDelivered || d.Attempts != 1 {
			t.Errorf("delivery of %s: %s after %d attempts", d.EventID, d.Status, d.Attempts)
		}
	}
}

// TestPostgresDispatchAcrossReplicas: both replicas' dispatchers turn the same
// events into deliveries at once: one delivery per webhook and event, and
// the cursor ends at the furthest through.
func TestPostgresDispatchAcrossReplicas(t *testing.T) {
	ctx := context.Background()
	dbs := replicas(t, 2)
	t0 := time.Now()
	for _, id := range []string{"w1", "w2", "w3"} {
		if err := dbs[0].PutWebhook(ctx, Webhook{ID: id, Owner: "o", Enabled: true, Events: []string{"c"}, CreatedAt: t0}); err != nil {
			t.Fatal(err)
		}
	}
	var batch []DispatchEvent
	for i := range 50 {
		batch = append(batch, DispatchEvent{ID: fmt.Sprintf("e%02d", i), Seq: int64(i + 1), Type: "c", Owner: "o",
			SandboxID: "sb", Time: t0.Add(time.Second), Payload: []byte(`{}`)})
	}
	var (
		mu   sync.Mutex
		made int
	)
	// Each of 6 dispatchers (3 per replica) offers the events in batches
	// that overlap the others'.
	together(6, func(i int) {
		for from := i % 3; from < len(batch); from += 10 {
			to := min(from+15, len(batch))
			n, err := dbs[i%2].DispatchEvents(ctx, batch[from:to], batch[to-1].Seq, t0)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			made += n
			mu.Unlock()
		}
	})
	if want := 3 * len(batch); made != want {
		t.Errorf("made %d deliveries, want %d (one per webhook and event)", made, want)
	}
	for _, w := range []string{"w1", "w2", "w3"} {
		if ds, err := dbs[1].ListDeliveries(ctx, "o", w, 0, 1000); err != nil || len(ds) != len(batch) {
			t.Errorf("webhook %s has %d deliveries, %v; want %d", w, len(ds), err, len(batch))
		}
	}
	if c, err := dbs[0].WebhookCursor(ctx); err != nil || c != int64(len(batch)) {
		t.Errorf("cursor = %d, %v; want %d", c, err, len(batch))
	}
}

// TestPostgresDeleteWebhookWhileDispatching: a webhook deleted by one replica
// while another makes deliveries for it leaves none of them behind (they
// would wait forever: nothing lists or sends a deleted webhook's
// deliveries), nor attempts of its deliveries recorded meanwhile.
func TestPostgresDeleteWebhookWhileDispatching(t *testing.T) {
	ctx := context.Background()
	dbs := replicas(t, 2)
	t0 := time.Now()
	for round := range 15 {
		id := fmt.Sprintf("w%02d", round)
		if err := dbs[0].PutWebhook(ctx, Webhook{ID: id, Owner: "o", Enabled: true, Events: []string{"c"}, CreatedAt: t0}); err != nil {
			t.Fatal(err)
		}
		var batch []DispatchEvent
		for i := range 20 {
			batch = append(batch, DispatchEvent{ID: fmt.Sprintf("r%02d-e%02d", round, i), Seq: int64(round*100 + i + 1), Type: "c", Owner: "o",
				SandboxID: fmt.Sprintf("sb%02d", i), Time: t0.Add(time.Second), Payload: []byte(`{}`)})
		}
		// Half the events first, with an attempt under way on one of them.
		if _, err := dbs[0].DispatchEvents(ctx, batch[:10], batch[9].Seq, t0); err != nil {
			t.Fatal(err)
		}
		due, err := dbs[0].DueDeliveries(ctx, time.Now(), 1, nil)
		if err != nil || len(due) != 1 {
			t.Fatalf("due = %v, %v", due, err)
		}
		together(3, func(i int) {
			var err error
			switch i {
			case 0:
				_, err = dbs[0].DispatchEvents(ctx, batch[10:], batch[19].Seq, t0)
			case 1:
				var ok bool
				if ok, err = dbs[1].DeleteWebhook(ctx, "o", id); err == nil && !ok {
					err = fmt.Errorf("webhook %s not found to delete", id)
				}
			case 2:
				err = dbs[0].RecordAttempt(ctx, due[0].ID, Attempt{At: time.Now(), HTTP: 503, Error: "down"}, DeliveryPending, time.Now().Add(time.Hour))
			}
			if err != nil {
				t.Error(err)
			}
		})
		var deliveries, attempts int
		if err := dbs[0].db.raw.QueryRow(`SELECT count(*) FROM webhook_deliveries WHERE webhook_id = $1`, id).Scan(&deliveries); err != nil {
			t.Fatal(err)
		}
		if err := dbs[0].db.raw.QueryRow(`SELECT count(*) FROM webhook_attempts WHERE delivery_id NOT IN (SELECT id FROM webhook_deliveries)`).Scan(&attempts); err != nil {
			t.Fatal(err)
		}
		if deliveries != 0 || attempts != 0 {
			t.Fatalf("round %d: the deleted webhook left %d deliveries and %d attempts", round, deliveries, attempts)
		}
	}
}

// TestPostgresFeedAcrossReplicas: while both replicas record events (alone
// and with sandbox records), a reader following the feed by seq, as the
// webhook dispatcher does, reads every event once: none is committed behind
// a seq the reader has already passed.
func TestPostgresFeedAcrossReplicas(t *testing.T) {
	ctx := context.Background()
	dbs := replicas(t, 2)
	ls := []*LifecycleEvents{NewLifecycleEvents(dbs[0]), NewLifecycleEvents(dbs[1])}
	const writers, each = 8, 40
	var (
		writing = make(chan struct{})
		seen    = map[string]int{}
		readErr error
		reader  sync.WaitGroup
	)
	reader.Add(1)
	go func() {
		defer reader.Done()
		var after int64
		for done := false; ; {
			select {
			case <-writing:
				done = true
			default:
			}
			batch, err := ls[1].After(ctx, after, 7)
			if err != nil {
				readErr = err
				return
			}
			for _, e := range batch {
				if e.Seq <= after {
					readErr = fmt.Errorf("seq %d after %d", e.Seq, after)
					return
				}
				after = e.Seq
				seen[e.ID]++
			}
			if done && len(batch) == 0 {
				return // everything committed has been read
			}
		}
	}()
	var (
		mu       sync.Mutex
		recorded []string
	)
	together(writers, func(w int) {
		l := ls[w%2]
		for i := range each {
			sbID := fmt.Sprintf("sb%d", w)
			var e lifecycle.Event
			var err error
			if i%2 == 0 {
				e, err = l.Record(ctx, ev("o", sbID, lifecycle.Updated, time.Time{}))
			} else {
				e, err = l.RecordWithSandbox(ctx, ev("o", sbID, lifecycle.Updated, time.Time{}), Sandbox{ID: sbID, State: "running"})
			}
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			recorded = append(recorded, e.ID)
			mu.Unlock()
		}
	})
	close(writing)
	reader.Wait()
	if readErr != nil {
		t.Fatal(readErr)
	}
	missed := 0
	for _, id := range recorded {
		if seen[id] != 1 {
			missed++
		}
	}
	if missed > 0 || len(seen) != len(recorded) {
		t.Fatalf("the feed reader read %d events, %d recorded; %d not read exactly once", len(seen), len(recorded), missed)
	}
}

// TestPostgresQuotasAcrossReplicas: inserts of one owner's sandbox records,
// volumes and secrets from two replicas at once stay within the owner's
// limits, and a name is taken once.
func TestPostgresQuotasAcrossReplicas(t *testing.T) {
	ctx := context.Background()
	dbs := replicas(t, 2)
	const n, limit = 12, 3
	count := func(errs []error, want error) (ok, refused int) {
		for _, err := range errs {
			switch {
			case err == nil:
				ok++
			case errors.Is(err, want):
				refused++
			default:
				t.Errorf("unexpected error: %v", err)
			}
		}
		return ok, refused
	}

	errs := make([]error, n)
	together(n, func(i int) {
		errs[i] = dbs[i%2].InsertSandbox(ctx, Sandbox{ID: fmt.Sprintf("sb%02d", i), Owner: "o", State: "creating", CPUCount: 1},
			SandboxLimits{MaxCount: limit})
	})
	if ok, refused := count(errs, ErrSandboxLimit); ok != limit || refused != n-limit {
		t.Errorf("sandboxes: %d inserted and %d refused, want %d and %d", ok, refused, limit, n-limit)
	}
	together(n, func(i int) {
		errs[i] = dbs[i%2].InsertVolume(ctx, Volume{ID: fmt.Sprintf("v%02d", i), Owner: "o", Name: fmt.Sprintf("vol%02d", i),
			SizeBytes: 1, CreatedAt: time.Now(), State: VolumeCreating}, VolumeLimits{MaxCount: limit})
	})
	if ok, refused := count(errs, ErrVolumeLimit); ok != limit || refused != n-limit {
		t.Errorf("volumes: %d inserted and %d refused, want %d and %d", ok, refused, limit, n-limit)
	}
	together(n, func(i int) {
		errs[i] = dbs[i%2].InsertVolume(ctx, Volume{ID: fmt.Sprintf("x%02d", i), Owner: "p", Name: "one",
			SizeBytes: 1, CreatedAt: time.Now(), State: VolumeCreating}, VolumeLimits{})
	})
	if ok, refused := count(errs, ErrExists); ok != 1 || refused != n-1 {
		t.Errorf("one volume name: %d inserted and %d refused, want 1 and %d", ok, refused, n-1)
	}

	together(n, func(i int) {
		errs[i] = dbs[i%2].InsertSecret(ctx, Secret{ID: fmt.Sprintf("s%02d", i), Owner: "o", Name: fmt.Sprintf("sec%02d", i),
			Version: 1, Sealed: []byte{1}, CreatedAt: time.Now(), UpdatedAt: time.Now()}, limit)
	})
	if ok, refused := count(errs, ErrSecretLimit); ok != limit || refused != n-limit {
		t.Errorf("secrets: %d inserted and %d refused, want %d and %d", ok, refused, limit, n-limit)
	}
	together(n, func(i int) {
		errs[i] = dbs[i%2].InsertSecret(ctx, Secret{ID: fmt.Sprintf("y%02d", i), Owner: "p", Name: "one",
			Version: 1, Sealed: []byte{1}, CreatedAt: time.Now(), UpdatedAt: time.Now()}, 0)
	})
	if ok, refused := count(errs, ErrExists); ok != 1 || refused != n-1 {
		t.Errorf("one secret name: %d inserted and %d refused, want 1 and %d", ok, refused, n-1)
	}
}

// TestPostgresKeysAndAuditAcrossReplicas: both replicas touching the same
// keys at once neither deadlock nor move a key's last use back, and their
// audit entries all land with distinct sequence numbers.
func TestPostgresKeysAndAuditAcrossReplicas(t *testing.T) {
	ctx := context.Background()
	dbs := replicas(t, 2)
	t0 := time.Unix(1700000000, 0)
	if err := dbs[0].PutTeam(ctx, Team{ID: "t", Name: "team", CreatedAt: t0}); err != nil {
		t.Fatal(err)
	}
	const keys = 10
	for i := range keys {
		if err := dbs[0].PutAPIKey(ctx, APIKey{ID: fmt.Sprintf("k%d", i), TeamID: "t", Hash: fmt.Sprintf("h%d", i), CreatedAt: t0}); err != nil {
			t.Fatal(err)
		}
	}
	const workers, rounds = 6, 15
	together(workers, func(w int) {
		for r := range rounds {
			used := map[string]time.Time{}
			for i := range keys {
				used[fmt.Sprintf("k%d", i)] = t0.Add(time.Duration(w*rounds+r) * time.Second)
			}
			if err := dbs[w%2].TouchAPIKeys(ctx, used); err != nil {
				t.Error(err)
				return
			}
			if err := dbs[w%2].AppendAudit(ctx, []AuditEntry{{At: time.Now(), TeamID: "t", Action: "key.touch", TargetID: fmt.Sprint(w, "/", r)}}); err != nil {
				t.Error(err)
				return
			}
		}
	})
	all, err := dbs[1].APIKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	latest := t0.Add(time.Duration(workers*rounds-1) * time.Second)
	for _, k := range all {
		if !k.LastUsed.Equal(latest) {
			t.Errorf("key %s last used %v, want %v", k.ID, k.LastUsed, latest)
		}
	}
	entries, err := dbs[0].Audit(ctx, AuditFilter{TeamID: "t", Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	seqs := map[int64]bool{}
	for _, e := range entries {
		seqs[e.Seq] = true
	}
	if len(entries) != workers*rounds || len(seqs) != len(entries) {
		t.Errorf("%d audit entries with %d distinct seqs, want %d", len(entries), len(seqs), workers*rounds)
	}
}
