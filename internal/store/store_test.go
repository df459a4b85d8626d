package store

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"
	"time"
)

func TestRoundTripAndReopen(t *testing.T) { forEachDB(t, testRoundTripAndReopen) }

func testRoundTripAndReopen(t *testing.T, open func() *DB) {
	ctx := context.Background()
	s := open()
	yes := true
	in := Sandbox{
		ID: "abc123", TemplateID: "base", Alias: "base", ClientID: "local",
		Metadata: map[string]string{"a b": "c&d"}, EnvVars: map[string]string{"FOO": "bar"},
		AccessToken: "tok", StartedAt: time.Unix(100, 5), EndAt: time.Unix(400, 7),
		State: "running", CPUCount: 2, MemoryMB: 512, DiskSizeMB: 1024, AllowInternet: &yes,
		Owner: "k1",
	}
	if err := s.Put(ctx, in); err != nil {
		t.Fatal(err)
	}
	in.State = "paused"
	if err := s.Put(ctx, in); err != nil {
		t.Fatal(err)
	}
	s.Close()

	s = open()
	got, err := s.Get(ctx, "abc123")
	if err != nil {
		t.Fatal(err)
	}
	if got.State != "paused" || got.Metadata["a b"] != "c&d" || got.EnvVars["FOO"] != "bar" ||
		!got.StartedAt.Equal(in.StartedAt) || !got.EndAt.Equal(in.EndAt) || got.AllowInternet == nil || !*got.AllowInternet || got.Owner != "k1" {
		t.Fatalf("round trip lost data: %+v", got)
	}
	list, err := s.List(ctx)
	if err != nil || len(list) != 1 {
		t.Fatalf("List = %v, %v", list, err)
	}
	if err := s.Delete(ctx, "abc123"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "abc123"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get after Delete: %v", err)
	}
}

// TestSQLiteMigratesOldSchema opens a database made before the owner column
// existed: its records must stay readable and new ones must keep their owner.
// SQLite only: PostgreSQL stores began with the owner column.
func TestSQLiteMigratesOldSchema(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "airlock.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE sandboxes (
		id TEXT PRIMARY KEY, template_id TEXT NOT NULL, alias TEXT NOT NULL, client_id TEXT NOT NULL,
		metadata TEXT NOT NULL, env_vars TEXT NOT NULL, access_token TEXT NOT NULL,
		started_at INTEGER NOT NULL, end_at INTEGER NOT NULL, state TEXT NOT NULL,
		cpu_count INTEGER NOT NULL, memory_mb INTEGER NOT NULL, disk_size_mb INTEGER NOT NULL,
		allow_internet INTEGER);
		INSERT INTO sandboxes VALUES ('old1','base','base','c','{}','{}','',1,2,'running',2,512,1024,NULL);`); err != nil {
		t.Fatal(err)
	}
	db.Close()

	s, err := OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	old, err := s.Get(ctx, "old1")
	if err != nil || old.Owner != "" || old.State != "running" {
		t.Fatalf("old record after migration = %+v, %v", old, err)
	}
	if err := s.Put(ctx, Sandbox{ID: "new1", State: "running", Owner: "k2"}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Get(ctx, "new1"); err != nil || got.Owner != "k2" {
		t.Fatalf("new record = %+v, %v", got, err)
	}
}

func TestEventsFollowTheirSandbox(t *testing.T) { forEachDB(t, testEventsFollowTheirSandbox) }

func testEventsFollowTheirSandbox(t *testing.T, open func() *DB) {
	s := open()
	ctx := context.Background()
	t0 := time.Unix(1700000000, 0)
	for i, id := range []string{"a", "b", "a"} {
		if err := s.AddEvent(ctx, Event{SandboxID: id, Time: t0.Add(time.Duration(i) * time.Second), Kind: "oom", Count: int64(i + 1), Message: "m"}); err != nil {
			t.Fatal(err)
		}
	}
	evs, err := s.Events(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 2 || evs[0].Count != 1 || evs[1].Count != 3 || !evs[1].Time.Equal(t0.Add(2*time.Second)) || evs[0].Kind != "oom" {
		t.Fatalf("events of a: %+v", evs)
	}
	if err := s.Delete(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if evs, _ := s.Events(ctx, "a"); len(evs) != 0 {
		t.Errorf("events outlived their sandbox: %+v", evs)
	}
	if evs, _ := s.Events(ctx, "b"); len(evs) != 1 {
		t.Errorf("events of b: %+v", evs)
	}
}

// TestInsertSandboxWithinLimits: a new record is written only while its
// owner's records with it stay within the limits; an ID is taken once.
func TestInsertSandboxWithinLimits(t *testing.T) { forEachDB(t, testInsertSandboxWithinLimits) }

func testInsertSandboxWithinLimits(t *testing.T, open func() *DB) {
	ctx := context.Background()
	s := open()
	lim := SandboxLimits{MaxCount: 3, MaxCPUs: 4, MaxMemoryMB: 2048}
	rec := func(id, owner string, cpu, mem int) Sandbox {
		return Sandbox{ID: id, Owner: owner, State: "creating", CPUCount: cpu, MemoryMB: mem}
	}
	if err := s.InsertSandbox(ctx, rec("a", "o", 2, 512), lim); err != nil {
		t.Fatal(err)
	}
	if err := s.InsertSandbox(ctx, rec("a", "p", 1, 1), lim); !errors.Is(err, ErrExists) {
		t.Fatalf("an ID taken (by another owner): %v", err)
	}
	var le *SandboxLimitError
	if err := s.InsertSandbox(ctx, rec("b", "o", 3, 512), lim); !errors.As(err, &le) || !errors.Is(err, ErrSandboxLimit) ||
		*le != (SandboxLimitError{Limit: "vcpus", Used: 2, Max: 4, Asked: 3}) {
		t.Fatalf("past the vCPUs: %v", err)
	}
	if err := s.InsertSandbox(ctx, rec("b", "o", 1, 2048), lim); !errors.As(err, &le) || le.Limit != "memory" || le.Used != 512 {
		t.Fatalf("past the memory: %v", err)
	}
	for _, id := range []string{"b", "c"} {
		if err := s.InsertSandbox(ctx, rec(id, "o", 1, 256), lim); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.InsertSandbox(ctx, rec("d", "o", 0, 0), lim); !errors.As(err, &le) || le.Limit != "sandboxes" || le.Used != 3 {
		t.Fatalf("past the count: %v", err)
	}
	// Another owner's records do not count, and zero limits nothing.
	if err := s.InsertSandbox(ctx, rec("e", "p", 4, 2048), lim); err != nil {
		t.Fatal(err)
	}
	if err := s.InsertSandbox(ctx, rec("f", "o", 64, 1<<20), SandboxLimits{}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Get(ctx, "f"); err != nil || got.CPUCount != 64 || got.Owner != "o" {
		t.Fatalf("inserted record = %+v, %v", got, err)
	}
}
