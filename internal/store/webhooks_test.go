package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"
)

func TestWebhooksScopedToOwner(t *testing.T) { forEachDB(t, testWebhooksScopedToOwner) }

func testWebhooksScopedToOwner(t *testing.T, open func() *DB) {
	ctx := context.Background()
	s := open()
	now := time.Now()
	w := Webhook{ID: "w1", Owner: "a", Name: "n", URL: "http://x", Enabled: true, Events: []string{"t1"}, Secret: "s", CreatedAt: now, UpdatedAt: now}
	if err := s.PutWebhook(ctx, w); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetWebhook(ctx, "a", "w1")
	if err != nil || got.Secret != "s" || got.URL != "http://x" || len(got.Events) != 1 || !got.Enabled || !got.CreatedAt.Equal(now) {
		t.Fatalf("GetWebhook = %+v, %v", got, err)
	}
	if _, err := s.GetWebhook(ctx, "b", "w1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("another owner's Get = %v, want ErrNotFound", err)
	}
	if l, _ := s.ListWebhooks(ctx, "b"); len(l) != 0 {
		t.Errorf("another owner lists %d webhooks", len(l))
	}
	if ok, err := s.DeleteWebhook(ctx, "b", "w1"); ok || err != nil {
		t.Errorf("another owner's Delete = %v, %v", ok, err)
	}
	if ok, err := s.DeleteWebhook(ctx, "a", "w1"); !ok || err != nil {
		t.Errorf("Delete = %v, %v", ok, err)
	}
	if l, _ := s.ListWebhooks(ctx, "a"); len(l) != 0 {
		t.Errorf("%d webhooks left after Delete", len(l))
	}
}

func TestDispatchEvents(t *testing.T) { forEachDB(t, testDispatchEvents) }

func testDispatchEvents(t *testing.T, open func() *DB) {
	ctx := context.Background()
	s := open()
	// No claims: DueDeliveries is asked again below without attempts
	// recorded in between (TestDeliveryLease is about claims).
	s.SetDeliveryLease(0)
	t0 := time.Now()
	for _, w := range []Webhook{
		{ID: "all", Owner: "a", Enabled: true, Events: []string{"c", "k"}, CreatedAt: t0},
		{ID: "k-only", Owner: "a", Enabled: true, Events: []string{"k"}, CreatedAt: t0},
		{ID: "off", Owner: "a", Enabled: false, Events: []string{"c", "k"}, CreatedAt: t0},
		{ID: "later", Owner: "a", Enabled: true, Events: []string{"c", "k"}, CreatedAt: t0.Add(time.Hour)},
		{ID: "other", Owner: "b", Enabled: true, Events: []string{"c", "k"}, CreatedAt: t0},
	} {
		if err := s.PutWebhook(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	evs := []DispatchEvent{
		{ID: "e1", Seq: 1, Type: "c", Owner: "a", SandboxID: "s", Time: t0.Add(time.Second), Payload: []byte(`{"n":1}`)},
		{ID: "e2", Seq: 2, Type: "k", Owner: "a", SandboxID: "s", Time: t0.Add(2 * time.Second), Payload: []byte(`{"n":2}`)},
	}
	n, err := s.DispatchEvents(ctx, evs, 2, t0)
	if err != nil || n != 3 { // e1→all, e2→all, e2→k-only
		t.Fatalf("DispatchEvents = %d, %v; want 3", n, err)
	}
	if n, err := s.DispatchEvents(ctx, evs, 2, t0); err != nil || n != 0 {
		t.Errorf("the same events again made %d deliveries (%v), want 0", n, err)
	}
	if c, _ := s.WebhookCursor(ctx); c != 2 {
		t.Errorf("cursor = %d, want 2", c)
	}
	if _, err := s.DispatchEvents(ctx, nil, 1, t0); err != nil {
		t.Fatal(err)
	}
	if c, _ := s.WebhookCursor(ctx); c != 2 {
		t.Errorf("cursor moved back to %d", c)
	}

	// Only the first of a sandbox's pending deliveries to a webhook is due.
	due, err := s.DueDeliveries(ctx, t0, 10, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(due) != 2 {
		t.Fatalf("due = %+v, want e1→all and e2→k-only", due)
	}
	var first Delivery
	for _, d := range due {
		if d.WebhookID == "all" {
			first = d
			if d.EventID != "e1" || string(d.Payload) != `{"n":1}` {
				t.Errorf("first due of 'all' = %+v", d)
			}
		}
	}
	if got, _ := s.DueDeliveries(ctx, t0, 10, map[string]bool{first.ID: true}); len(got) != 1 {
		t.Errorf("skipping the in-flight one left %d due, want 1", len(got))
	}
	retry := t0.Add(time.Minute)
	if err := s.RecordAttempt(ctx, first.ID, Attempt{At: t0, HTTP: 500, Error: "boom"}, DeliveryPending, retry); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.DueDeliveries(ctx, t0, 10, nil); len(got) != 1 {
		t.Errorf("while e1 waits for its retry, %d due (want only k-only's)", len(got))
	}
	if next, ok, _ := s.NextAttemptAfter(ctx, t0); !ok || !next.Equal(retry) {
		t.Errorf("NextAttemptAfter = %v, %v; want %v", next, ok, retry)
	}
	if err := s.RecordAttempt(ctx, first.ID, Attempt{At: retry, HTTP: 204}, DeliveryDelivered, time.Time{}); err != nil {
		t.Fatal(err)
	}
	due, _ = s.DueDeliveries(ctx, retry, 10, nil)
	if len(due) != 2 || (due[0].EventID != "e2" || due[1].EventID != "e2") {
		t.Errorf("after e1 was delivered, due = %+v; want e2 to both", due)
	}
	ds, err := s.ListDeliveries(ctx, "a", "all", 0, 10)
	if err != nil || len(ds) != 2 {
		t.Fatalf("ListDeliveries = %d, %v", len(ds), err)
	}
	d1 := ds[1] // newest first
	if d1.EventID != "e1" || d1.Status != DeliveryDelivered || d1.Attempts != 2 || len(d1.History) != 2 ||
		d1.History[0].HTTP != 500 || d1.History[0].Error != "boom" || d1.History[1].HTTP != 204 {
		t.Errorf("e1's delivery = %+v", d1)
	}
	if ds, _ := s.ListDeliveries(ctx, "b", "all", 0, 10); len(ds) != 0 {
		t.Errorf("another owner lists %d deliveries", len(ds))
	}

	// Pruning takes finished deliveries only; deleting a webhook takes its.
	if n, err := s.PruneDeliveries(ctx, time.Now().Add(time.Hour)); err != nil || n != 1 {
		t.Errorf("PruneDeliveries = %d, %v; want 1", n, err)
	}
	if _, err := s.DeleteWebhook(ctx, "a", "all"); err != nil {
		t.Fatal(err)
	}
	if due, _ := s.DueDeliveries(ctx, retry, 10, nil); len(due) != 1 || due[0].WebhookID != "k-only" {
		t.Errorf("after deleting 'all', due = %+v", due)
	}
}

// TestDeliveryLease: a delivery DueDeliveries hands out is claimed, for this
// store and any other on the same database (another process), until its
// attempt is recorded or the lease runs out (its process died), after which
// it is handed out again.
func TestDeliveryLease(t *testing.T) { forEachDB(t, testDeliveryLease) }

func testDeliveryLease(t *testing.T, open func() *DB) {
	ctx := context.Background()
	s1, s2 := open(), open()
	const lease = time.Minute
	s1.SetDeliveryLease(lease)
	s2.SetDeliveryLease(lease)
	t0 := time.Unix(1700000000, 0)
	if err := s1.PutWebhook(ctx, Webhook{ID: "w", Owner: "a", Enabled: true, Events: []string{"c"}, CreatedAt: t0}); err != nil {
		t.Fatal(err)
	}
	if n, err := s1.DispatchEvents(ctx, []DispatchEvent{
		{ID: "e1", Seq: 1, Type: "c", Owner: "a", SandboxID: "s1", Time: t0, Payload: []byte(`{}`)},
		{ID: "e2", Seq: 2, Type: "c", Owner: "a", SandboxID: "s2", Time: t0, Payload: []byte(`{}`)},
	}, 2, t0); err != nil || n != 2 {
		t.Fatalf("DispatchEvents = %d, %v", n, err)
	}
	events := func(s *DB, now time.Time) (out []string) {
		t.Helper()
		due, err := s.DueDeliveries(ctx, now, 10, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range due {
			out = append(out, d.EventID)
		}
		return out
	}
	first, err := s1.DueDeliveries(ctx, t0, 1, nil)
	if err != nil || len(first) != 1 || first[0].EventID != "e1" {
		t.Fatalf("first claim = %+v, %v", first, err)
	}
	if got := events(s2, t0); fmt.Sprint(got) != "[e2]" {
		t.Fatalf("the other store got %v, want only e2 (e1 is claimed)", got)
	}
	if got := events(s1, t0.Add(lease/2)); len(got) != 0 {
		t.Fatalf("claimed deliveries handed out again: %v", got)
	}
	if next, ok, err := s2.NextAttemptAfter(ctx, t0); err != nil || !ok || !next.Equal(t0.Add(lease)) {
		t.Fatalf("NextAttemptAfter = %v, %v, %v; want the leases' end", next, ok, err)
	}
	// Recorded: the claim ends with it, and the delivery waits for its retry.
	retry := t0.Add(lease / 2)
	if err := s1.RecordAttempt(ctx, first[0].ID, Attempt{At: t0, HTTP: 500}, DeliveryPending, retry); err != nil {
		t.Fatal(err)
	}
	if got := events(s2, retry); fmt.Sprint(got) != "[e1]" {
		t.Fatalf("after its attempt was recorded, due = %v, want e1 at its retry", got)
	}
	// e2's claimant died: once its lease is over, e2 is handed out again.
	if got := events(s2, t0.Add(lease)); fmt.Sprint(got) != "[e2]" {
		t.Fatalf("after e2's lease, due = %v, want e2", got)
	}
}

// TestSQLiteMigratesDeliveryLease opens a database whose delivery outbox
// predates claims (no lease_until column): its pending deliveries stay due,
// and are claimed as new ones are. SQLite only: PostgreSQL stores began with
// the column.
func TestSQLiteMigratesDeliveryLease(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "airlock.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE webhooks (
	id TEXT PRIMARY KEY, owner TEXT NOT NULL, name TEXT NOT NULL, url TEXT NOT NULL, enabled INTEGER NOT NULL,
	events TEXT NOT NULL, secret TEXT NOT NULL, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL);
CREATE TABLE webhook_deliveries (
	id TEXT PRIMARY KEY, webhook_id TEXT NOT NULL, owner TEXT NOT NULL, event_id TEXT NOT NULL, event_seq INTEGER NOT NULL,
	event_type TEXT NOT NULL, sandbox_id TEXT NOT NULL, payload BLOB NOT NULL, status TEXT NOT NULL,
	attempts INTEGER NOT NULL DEFAULT 0, next_attempt_at INTEGER NOT NULL, last_error TEXT NOT NULL DEFAULT '',
	last_http INTEGER NOT NULL DEFAULT 0, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL,
	UNIQUE (webhook_id, event_id));
INSERT INTO webhooks VALUES ('w', 'o', 'n', 'http://x', 1, '["c"]', 's', 1, 1);
INSERT INTO webhook_deliveries (id, webhook_id, owner, event_id, event_seq, event_type, sandbox_id, payload, status, next_attempt_at, created_at, updated_at)
	VALUES ('d1', 'w', 'o', 'e1', 1, 'c', 'sb', x'7b7d', 'pending', 5, 1, 1);`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	s, err := OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.SetDeliveryLease(time.Minute)
	now := time.Unix(0, 10)
	if due, err := s.DueDeliveries(ctx, now, 10, nil); err != nil || len(due) != 1 || due[0].ID != "d1" || string(due[0].Payload) != "{}" {
		t.Fatalf("the old pending delivery: %+v, %v", due, err)
	}
	if due, err := s.DueDeliveries(ctx, now, 10, nil); err != nil || len(due) != 0 {
		t.Fatalf("claimed, and handed out again: %+v, %v", due, err)
	}
}
