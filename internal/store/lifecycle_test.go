package store

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/lifecycle"
)

func openLifecycle(open func() *DB) (*DB, *LifecycleEvents) {
	s := open()
	return s, NewLifecycleEvents(s)
}

func ev(owner, sandbox, typ string, at time.Time) lifecycle.Event {
	return lifecycle.Event{
		Type: typ, SandboxID: sandbox, SandboxTeamID: owner, SandboxTemplateID: "base",
		SandboxExecutionID: "x-" + sandbox, SandboxBuildID: "b1", Timestamp: at,
		EventData: json.RawMessage(`{"sandbox_metadata":{"k":"v"}}`),
	}
}

func types(evs []lifecycle.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.SandboxID + ":" + e.Type
	}
	return out
}

func TestLifecycleEventsPagingScopingFeed(t *testing.T) {
	forEachDB(t, testLifecycleEventsPagingScopingFeed)
}

func testLifecycleEventsPagingScopingFeed(t *testing.T, open func() *DB) {
	ctx := context.Background()
	db, l := openLifecycle(open)

	// The feed's channel is empty until a Record.
	select {
	case <-l.Notify():
		t.Fatal("Notify signalled before any Record")
	default:
	}
	t0 := time.Now().Add(-time.Minute)
	var recorded []lifecycle.Event
	for i, typ := range lifecycle.Types {
		e, err := l.Record(ctx, ev("alice", "sb1", typ, t0.Add(time.Duration(i)*time.Second)))
		if err != nil {
			t.Fatal(err)
		}
		recorded = append(recorded, e)
		e, err = l.Record(ctx, ev("bob", "sb2", typ, time.Time{}))
		if err != nil {
			t.Fatal(err)
		}
		recorded = append(recorded, e)
	}
	// Many Records, one buffered signal: never blocked, still readable.
	select {
	case <-l.Notify():
	default:
		t.Fatal("Notify not signalled after Record")
	}
	select {
	case <-l.Notify():
		t.Fatal("Notify holds more than one signal")
	default:
	}
	ids := map[string]bool{}
	for i, e := range recorded {
		if e.Seq <= 0 || (i > 0 && e.Seq <= recorded[i-1].Seq) {
			t.Fatalf("Seq not increasing: %d after %d", e.Seq, recorded[max(i-1, 0)].Seq)
		}
		if len(e.ID) != 36 || ids[e.ID] {
			t.Fatalf("event id %q: not a fresh UUID", e.ID)
		}
		ids[e.ID] = true
		if e.Version != lifecycle.Version || e.Timestamp.IsZero() || e.Timestamp.Location() != time.UTC {
			t.Fatalf("Record did not fill version and a UTC timestamp: %+v", e)
		}
	}

	// Newest first by default; alice sees only hers.
	got, err := l.OwnerEvents(ctx, "alice", lifecycle.Page{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 6 || got[0].Type != lifecycle.Killed || got[5].Type != lifecycle.Created {
		t.Fatalf("alice's events newest first: %v", types(got))
	}
	for _, e := range got {
		if e.SandboxTeamID != "alice" || e.SandboxID != "sb1" || e.Seq == 0 || string(e.EventData) != `{"sandbox_metadata":{"k":"v"}}` {
			t.Fatalf("alice's page holds %+v", e)
		}
	}
	// Ascending pages of two walk every event once, in order.
	var walked []string
	for off := 0; ; off += 2 {
		page, err := l.OwnerEvents(ctx, "alice", lifecycle.Page{Offset: off, Limit: 2, OrderAsc: true})
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, e := range page {
			walked = append(walked, e.Type)
		}
	}
	if fmt.Sprint(walked) != fmt.Sprint(lifecycle.Types) {
		t.Fatalf("ascending pages: %v, want %v", walked, lifecycle.Types)
	}
	// One sandbox; another owner's sandbox has nothing for alice.
	if got, err := l.SandboxEvents(ctx, "alice", "sb1", lifecycle.Page{Limit: 3, Offset: 1}); err != nil || fmt.Sprint(types(got)) != "[sb1:sandbox.lifecycle.checkpointed sb1:sandbox.lifecycle.resumed sb1:sandbox.lifecycle.paused]" {
		t.Fatalf("sb1 offset 1 limit 3: %v %v", types(got), err)
	}
	if got, err := l.SandboxEvents(ctx, "alice", "sb2", lifecycle.Page{Limit: 10}); err != nil || len(got) != 0 {
		t.Fatalf("alice reads bob's sandbox: %v %v", types(got), err)
	}
	// Types filter.
	if got, err := l.SandboxEvents(ctx, "bob", "sb2", lifecycle.Page{Limit: 10, Types: []string{lifecycle.Created, lifecycle.Killed}}); err != nil || fmt.Sprint(types(got)) != "[sb2:sandbox.lifecycle.killed sb2:sandbox.lifecycle.created]" {
		t.Fatalf("types filter: %v %v", types(got), err)
	}
	// Out-of-range pages are refused, not clamped.
	for _, p := range []lifecycle.Page{{Limit: 0}, {Limit: 101}, {Limit: 1, Offset: -1}} {
		if _, err := l.OwnerEvents(ctx, "alice", p); err == nil {
			t.Fatalf("page %+v accepted", p)
		}
	}

	// The feed: every owner's events after a seq, oldest first, in batches.
	var fed []lifecycle.Event
	for after := int64(0); ; {
		batch, err := l.After(ctx, after, 5)
		if err != nil {
			t.Fatal(err)
		}
		if len(batch) == 0 {
			break
		}
		fed = append(fed, batch...)
		after = batch[len(batch)-1].Seq
	}
	if len(fed) != len(recorded) {
		t.Fatalf("feed gave %d events, recorded %d", len(fed), len(recorded))
	}
	for i := range fed {
		if fed[i].ID != recorded[i].ID || fed[i].Seq != recorded[i].Seq {
			t.Fatalf("feed[%d] = %s/%d, recorded %s/%d", i, fed[i].ID, fed[i].Seq, recorded[i].ID, recorded[i].Seq)
		}
	}

	// Bad events are refused.
	if _, err := l.Record(ctx, lifecycle.Event{Type: lifecycle.Created}); err == nil {
		t.Fatal("an event without a sandbox id was recorded")
	}
	bad := ev("alice", "sb1", lifecycle.Created, time.Time{})
	bad.EventData = json.RawMessage(`{not json`)
	if _, err := l.Record(ctx, bad); err == nil {
		t.Fatal("an event with invalid eventData was recorded")
	}

	// Reopened (a restart), everything is still there, and new events
	// continue the sequence.
	db.Close()
	_, l = openLifecycle(open)
	got, err = l.After(ctx, 0, 100)
	if err != nil || len(got) != len(recorded) {
		t.Fatalf("after reopening: %d events, %v", len(got), err)
	}
	e, err := l.Record(ctx, ev("alice", "sb3", lifecycle.Created, time.Time{}))
	if err != nil || e.Seq <= recorded[len(recorded)-1].Seq {
		t.Fatalf("seq after reopening: %d (last %d) %v", e.Seq, recorded[len(recorded)-1].Seq, err)
	}
}

// TestLifecycleEventsRetention: pruning drops old events whatever their
// sandbox's state, keeps newer ones, and never lets a seq be reused (a
// feed reader's position stays meaningful).
func TestLifecycleEventsRetention(t *testing.T) { forEachDB(t, testLifecycleEventsRetention) }

func testLifecycleEventsRetention(t *testing.T, open func() *DB) {
	ctx := context.Background()
	db, l := openLifecycle(open)
	now := time.Now()
	var last lifecycle.Event
	for i := range 10 {
		var err error
		// sb-old's whole life (killed included) is 8 days ago; sb-new's now.
		at, sb := now.Add(-8*24*time.Hour), "sbold"
		if i >= 6 {
			at, sb = now.Add(-time.Duration(10-i)*time.Minute), "sbnew"
		}
		if last, err = l.Record(ctx, ev("o", sb, lifecycle.Types[i%len(lifecycle.Types)], at)); err != nil {
			t.Fatal(err)
		}
	}
	// A sandbox record and its deletion do not touch its lifecycle events.
	if err := db.Put(ctx, Sandbox{ID: "sbnew", State: "running", StartedAt: now, EndAt: now}); err != nil {
		t.Fatal(err)
	}
	if err := db.Delete(ctx, "sbnew"); err != nil {
		t.Fatal(err)
	}
	n, err := l.PruneBefore(ctx, now.Add(-7*24*time.Hour))
	if err != nil || n != 6 {
		t.Fatalf("PruneBefore deleted %d, %v; want 6", n, err)
	}
	if got, _ := l.SandboxEvents(ctx, "o", "sbold", lifecycle.Page{Limit: 100}); len(got) != 0 {
		t.Fatalf("old sandbox's events survive pruning: %v", types(got))
	}
	if got, _ := l.SandboxEvents(ctx, "o", "sbnew", lifecycle.Page{Limit: 100}); len(got) != 4 {
		t.Fatalf("new sandbox's events after pruning: %v", types(got))
	}
	// Prune everything: the next event still gets a higher seq.
	if _, err := l.PruneBefore(ctx, now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	e, err := l.Record(ctx, ev("o", "sbx", lifecycle.Created, time.Time{}))
	if err != nil || e.Seq <= last.Seq {
		t.Fatalf("seq after pruning all: %d, last was %d (%v)", e.Seq, last.Seq, err)
	}
}

// TestLifecycleEventsConcurrentRecord: concurrent Records all land, each
// with its own seq, and the feed sees them all.
func TestLifecycleEventsConcurrentRecord(t *testing.T) {
	forEachDB(t, testLifecycleEventsConcurrentRecord)
}

func testLifecycleEventsConcurrentRecord(t *testing.T, open func() *DB) {
	ctx := context.Background()
	_, l := openLifecycle(open)
	const workers, each = 8, 50
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				if _, err := l.Record(ctx, ev("o", fmt.Sprintf("sb%d", w), lifecycle.Updated, time.Time{})); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	all, err := l.After(ctx, 0, workers*each+1)
	if err != nil || len(all) != workers*each {
		t.Fatalf("feed after concurrent records: %d, %v", len(all), err)
	}
	seen := map[int64]bool{}
	for _, e := range all {
		if seen[e.Seq] {
			t.Fatalf("seq %d twice", e.Seq)
		}
		seen[e.Seq] = true
	}
}

// TestRecordWithRecordsIsOneTransaction: a transition's record and its event
// are written together or not at all; a failure of either leaves the old
// state, and the feed is woken only by what was committed.
func TestRecordWithRecordsIsOneTransaction(t *testing.T) {
	forEachDB(t, testRecordWithRecordsIsOneTransaction)
}

func testRecordWithRecordsIsOneTransaction(t *testing.T, open func() *DB) {
	ctx := context.Background()
	db, l := openLifecycle(open)
	now := time.Now()
	sb := Sandbox{ID: "sb1", TemplateID: "base", State: "running", Owner: "alice", StartedAt: now, EndAt: now.Add(time.Minute)}
	if err := db.Put(ctx, sb); err != nil {
		t.Fatal(err)
	}
	countEvents := func() int {
		evs, err := l.SandboxEvents(ctx, "alice", "sb1", lifecycle.Page{Limit: lifecycle.MaxLimit})
		if err != nil {
			t.Fatal(err)
		}
		return len(evs)
	}

	// Both written.
	paused := sb
	paused.State, paused.PausedAt, paused.PausedWithMemory = "paused", now, true
	e, err := l.RecordWithSandbox(ctx, ev("alice", "sb1", lifecycle.Paused, now), paused)
	if err != nil || e.Seq == 0 || e.ID == "" {
		t.Fatalf("RecordWithSandbox = %+v, %v", e, err)
	}
	<-l.Notify()
	if got, err := db.Get(ctx, "sb1"); err != nil || got.State != "paused" || !got.PausedWithMemory {
		t.Fatalf("record after the transition = %+v, %v", got, err)
	}
	if n := countEvents(); n != 1 {
		t.Fatalf("%d events, want 1", n)
	}

	// A bad event: the record is not written either.
	bad := ev("alice", "sb1", lifecycle.Resumed, now)
	bad.EventData = json.RawMessage(`{not json`)
	running := sb
	if _, err := l.RecordWithSandbox(ctx, bad, running); err == nil {
		t.Fatal("an event that is not JSON was recorded")
	}
	if got, _ := db.Get(ctx, "sb1"); got.State != "paused" {
		t.Fatalf("a failed transition wrote its record: state %q", got.State)
	}
	// A bad record: the event is not written either.
	badRec := sb
	badRec.Lifecycle.OnTimeout = "explode"
	if _, err := l.RecordWithSandbox(ctx, ev("alice", "sb1", lifecycle.Resumed, now), badRec); err == nil {
		t.Fatal("a record with an unknown on-timeout action was written")
	}
	if n := countEvents(); n != 1 {
		t.Fatalf("a failed transition recorded its event: %d events, want 1", n)
	}
	select {
	case <-l.Notify():
		t.Fatal("Notify signalled for transitions that were not committed")
	default:
	}

	// A snapshot with its checkpointed event; a name taken moves, and the
	// snapshot it was on is reported.
	s1 := Snapshot{ID: "snapA", Name: "n", SandboxID: "sb1", Owner: "alice", CreatedAt: now}
	if _, replaced, err := l.RecordWithSnapshot(ctx, ev("alice", "sb1", lifecycle.Checkpointed, now), s1); err != nil || replaced != "" {
		t.Fatalf("RecordWithSnapshot = %q, %v", replaced, err)
	}
	s2 := Snapshot{ID: "snapB", Name: "n", SandboxID: "sb1", Owner: "alice", CreatedAt: now}
	if _, replaced, err := l.RecordWithSnapshot(ctx, ev("alice", "sb1", lifecycle.Checkpointed, now), s2); err != nil || replaced != "snapA" {
		t.Fatalf("RecordWithSnapshot = %q, %v; want snapA replaced", replaced, err)
	}
	// A bad snapshot: no event.
	if _, _, err := l.RecordWithSnapshot(ctx, ev("alice", "sb1", lifecycle.Checkpointed, now), Snapshot{ID: "bad:id"}); err == nil {
		t.Fatal("a snapshot id with ':' was written")
	}
	if n := countEvents(); n != 3 {
		t.Fatalf("%d events, want 3 (paused and two checkpointed)", n)
	}
	if _, err := db.GetSnapshot(ctx, "alice", "snapA"); err == nil {
		t.Fatal("the replaced snapshot's record is still there")
	}
}
