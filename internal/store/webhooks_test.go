package store

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"
)

func openTestStore(t *testing.T) *SQLite {
	t.Helper()
	s, err := OpenSQLite(filepath.Join(t.TempDir(), "airlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestWebhooksScopedToOwner(t *testing.T) {
	ctx := context.Background()
	s := openTestStore(t)
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

func TestDispatchEvents(t *testing.T) {
	ctx := context.Background()
	s := openTestStore(t)
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
