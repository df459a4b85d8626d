package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"
)

func TestPausedSandboxFieldsRoundTrip(t *testing.T) { forEachDB(t, testPausedSandboxFieldsRoundTrip) }

func testPausedSandboxFieldsRoundTrip(t *testing.T, open func() *DB) {
	ctx := context.Background()
	s := open()
	paused := time.Unix(1700000000, 123)
	in := Sandbox{
		ID: "p1", State: "paused",
		Lifecycle:        Lifecycle{OnTimeout: OnTimeoutPause, DropMemory: true, AutoResume: true},
		PausedWithMemory: true, PausedAt: paused, HostKey: "hk-secret", PausedDiskBytes: 5 << 20,
	}
	if err := s.Put(ctx, in); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(ctx, "p1")
	if err != nil {
		t.Fatal(err)
	}
	if got.Lifecycle != in.Lifecycle || !got.PausedWithMemory || !got.PausedAt.Equal(paused) || got.HostKey != "hk-secret" || got.PausedDiskBytes != 5<<20 {
		t.Fatalf("paused record = %+v", got)
	}
	// The zero values: kill at timeout, never paused.
	if err := s.Put(ctx, Sandbox{ID: "r1", State: "running"}); err != nil {
		t.Fatal(err)
	}
	got, err = s.Get(ctx, "r1")
	if err != nil {
		t.Fatal(err)
	}
	if got.Lifecycle != (Lifecycle{OnTimeout: OnTimeoutKill}) || got.PausedWithMemory || !got.PausedAt.IsZero() || got.HostKey != "" {
		t.Fatalf("running record = %+v", got)
	}
	if err := s.Put(ctx, Sandbox{ID: "bad", Lifecycle: Lifecycle{OnTimeout: "hibernate"}}); err == nil {
		t.Errorf("an unknown on-timeout action was stored")
	}
}

// TestSQLiteMigratesPrePersistenceSchema opens a database made by the Airlock
// before pause-to-disk and snapshots (the schema below is that version's):
// its rows must read as never-paused sandboxes killed at their timeout, and
// the new columns and tables must work. SQLite only: PostgreSQL stores began
// after it.
func TestSQLiteMigratesPrePersistenceSchema(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "airlock.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE sandboxes (
	id            TEXT PRIMARY KEY,
	template_id   TEXT NOT NULL,
	alias         TEXT NOT NULL,
	client_id     TEXT NOT NULL,
	metadata      TEXT NOT NULL,
	env_vars      TEXT NOT NULL,
	access_token  TEXT NOT NULL,
	started_at    INTEGER NOT NULL,
	end_at        INTEGER NOT NULL,
	state         TEXT NOT NULL,
	cpu_count     INTEGER NOT NULL,
	memory_mb     INTEGER NOT NULL,
	disk_size_mb  INTEGER NOT NULL,
	allow_internet INTEGER,
	owner         TEXT NOT NULL DEFAULT '',
	network       TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE events (
	sandbox_id TEXT NOT NULL,
	at         INTEGER NOT NULL,
	kind       TEXT NOT NULL,
	count      INTEGER NOT NULL,
	message    TEXT NOT NULL
);
CREATE INDEX events_sandbox ON events (sandbox_id, at);
INSERT INTO sandboxes VALUES ('old1','base','base','c','{"k":"v"}','{}','tok',1,2,'running',2,512,1024,1,'k1','{"allowOut":["1.1.1.1"]}');
INSERT INTO events VALUES ('old1', 5, 'oom', 1, 'm');`); err != nil {
		t.Fatal(err)
	}
	db.Close()

	for range 2 { // a second open finds nothing to migrate
		s, err := OpenSQLite(path)
		if err != nil {
			t.Fatal(err)
		}
		old, err := s.Get(ctx, "old1")
		if err != nil {
			t.Fatal(err)
		}
		if old.State != "running" || old.Owner != "k1" || old.AccessToken != "tok" || old.Metadata["k"] != "v" ||
			len(old.Network.AllowOut) != 1 || old.AllowInternet == nil || !*old.AllowInternet {
			t.Fatalf("old record lost data: %+v", old)
		}
		if old.Lifecycle != (Lifecycle{OnTimeout: OnTimeoutKill}) || old.PausedWithMemory || !old.PausedAt.IsZero() || old.HostKey != "" || old.PausedDiskBytes != 0 {
			t.Fatalf("old record's new fields = %+v", old)
		}
		if evs, err := s.Events(ctx, "old1"); err != nil || len(evs) != 1 {
			t.Fatalf("old events = %v, %v", evs, err)
		}
		old.State, old.PausedAt, old.HostKey, old.PausedDiskBytes = "paused", time.Unix(9, 0), "hk", 4096
		if err := s.Put(ctx, old); err != nil {
			t.Fatal(err)
		}
		if got, err := s.Get(ctx, "old1"); err != nil || got.HostKey != "hk" || !got.PausedAt.Equal(time.Unix(9, 0)) || got.PausedDiskBytes != 4096 {
			t.Fatalf("updated old record = %+v, %v", got, err)
		}
		old.PausedAt, old.HostKey, old.State, old.PausedDiskBytes = time.Time{}, "", "running", 0
		if err := s.Put(ctx, old); err != nil {
			t.Fatal(err)
		}
		if _, err := s.PutSnapshot(ctx, Snapshot{ID: "sn1", SandboxID: "old1"}); err != nil {
			t.Fatal(err)
		}
		if err := s.PutOp(ctx, Op{ID: "op1", Kind: OpPause, SandboxID: "old1"}); err != nil {
			t.Fatal(err)
		}
		s.Close()
	}
}

func TestSnapshotRecords(t *testing.T) { forEachDB(t, testSnapshotRecords) }

func testSnapshotRecords(t *testing.T, open func() *DB) {
	ctx := context.Background()
	s := open()
	t0 := time.Unix(1700000000, 0)
	put := func(sn Snapshot) string {
		t.Helper()
		replaced, err := s.PutSnapshot(ctx, sn)
		if err != nil {
			t.Fatal(err)
		}
		return replaced
	}
	spec := json.RawMessage(`{"rootfs":"x","memoryMB":512}`)
	put(Snapshot{ID: "a", SandboxID: "sb1", TemplateID: "base", Owner: "k1", CreatedAt: t0, Spec: spec})
	if r := put(Snapshot{ID: "b", Name: "nightly", SandboxID: "sb1", TemplateID: "base", Owner: "k1", CreatedAt: t0.Add(time.Second)}); r != "" {
		t.Fatalf("first use of a name replaced %q", r)
	}
	put(Snapshot{ID: "u", SandboxID: "sb2", Owner: "k2", CreatedAt: t0.Add(2 * time.Second)}) // a second unnamed one

	for _, key := range []string{"a", "a:default"} {
		got, err := s.GetSnapshot(ctx, "k1", key)
		if err != nil || got.ID != "a" || got.Name != "" || string(got.Spec) != string(spec) || !got.CreatedAt.Equal(t0) || got.TemplateID != "base" {
			t.Fatalf("GetSnapshot(%s) = %+v, %v", key, got, err)
		}
	}
	for _, key := range []string{"b", "b:default", "nightly", "nightly:default"} {
		if got, err := s.GetSnapshot(ctx, "k1", key); err != nil || got.ID != "b" || got.Name != "nightly" || got.Spec != nil {
			t.Fatalf("GetSnapshot(%s) = %+v, %v", key, got, err)
		}
	}
	if _, err := s.GetSnapshot(ctx, "k1", "nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("GetSnapshot(nope): %v", err)
	}
	// Another owner's snapshot is not found, by ID or by name.
	for _, key := range []string{"a", "b", "nightly"} {
		if _, err := s.GetSnapshot(ctx, "k2", key); !errors.Is(err, ErrNotFound) {
			t.Fatalf("GetSnapshot(k2, %s) found k1's: %v", key, err)
		}
	}

	// A new snapshot takes the name: the old one is gone in the same step.
	if r := put(Snapshot{ID: "c", Name: "nightly", SandboxID: "sb1", Owner: "k1", CreatedAt: t0.Add(3 * time.Second)}); r != "b" {
		t.Fatalf("replacing put reported %q, want b", r)
	}
	if _, err := s.GetSnapshot(ctx, "k1", "b"); !errors.Is(err, ErrNotFound) {
		t.Errorf("replaced snapshot still there: %v", err)
	}
	if got, _ := s.GetSnapshot(ctx, "k1", "nightly:default"); got.ID != "c" {
		t.Errorf("name resolves to %q", got.ID)
	}
	// Putting the holder again (an update) replaces nothing.
	if r := put(Snapshot{ID: "c", Name: "nightly", SandboxID: "sb1", Owner: "k1", CreatedAt: t0.Add(3 * time.Second), Spec: spec}); r != "" {
		t.Errorf("update of the name's holder replaced %q", r)
	}
	// An id wins over another snapshot's name equal to it.
	put(Snapshot{ID: "d", Name: "a", SandboxID: "sb3", Owner: "k1", CreatedAt: t0.Add(4 * time.Second)})
	if got, _ := s.GetSnapshot(ctx, "k1", "a"); got.ID != "a" {
		t.Errorf("GetSnapshot(a) = %s, want the id match", got.ID)
	}

	ids := func(f SnapshotFilter) string {
		t.Helper()
		list, err := s.ListSnapshots(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		out := ""
		for _, sn := range list {
			out += sn.ID
		}
		return out
	}
	for f, want := range map[SnapshotFilter]string{
		{}:                                  "dcua",
		{SandboxID: "sb1"}:                  "ca",
		{Owner: "k1"}:                       "dca",
		{Owner: "k2"}:                       "u",
		{Name: "nightly"}:                   "c",
		{Name: "nightly:default"}:           "c",
		{Name: "u:default"}:                 "u",
		{Name: "a"}:                         "da",
		{SandboxID: "sb1", Name: "nightly"}: "c",
		{SandboxID: "sb2", Name: "nightly"}: "",
	} {
		if got := ids(f); got != want {
			t.Errorf("ListSnapshots(%+v) = %q, want %q", f, got, want)
		}
	}

	for _, bad := range []Snapshot{{ID: ""}, {ID: "x:default"}, {ID: "x", Name: "n:tag"}, {ID: "x", Spec: json.RawMessage(`{`)}} {
		if _, err := s.PutSnapshot(ctx, bad); err == nil {
			t.Errorf("PutSnapshot(%+v) succeeded", bad)
		}
	}

	if ok, err := s.DeleteSnapshot(ctx, "c"); err != nil || !ok {
		t.Fatalf("DeleteSnapshot(c) = %v, %v", ok, err)
	}
	if ok, err := s.DeleteSnapshot(ctx, "c"); err != nil || ok {
		t.Fatalf("second DeleteSnapshot(c) = %v, %v", ok, err)
	}
	// The name is free again.
	if r := put(Snapshot{ID: "e", Name: "nightly", CreatedAt: t0.Add(5 * time.Second)}); r != "" {
		t.Errorf("a deleted snapshot's name replaced %q", r)
	}

	s.Close()
	s2 := open()
	if list, err := s2.ListSnapshots(ctx, SnapshotFilter{}); err != nil || len(list) != 4 || list[0].ID != "e" {
		t.Fatalf("after reopen: %+v, %v", list, err)
	}
}

// TestSnapshotNameRace puts many snapshots with one name at once: whatever
// the interleaving, one holds the name at the end, and every other one was
// reported replaced exactly once (so the caller deletes each one's files).
func TestSnapshotNameRace(t *testing.T) { forEachDB(t, testSnapshotNameRace) }

func testSnapshotNameRace(t *testing.T, open func() *DB) {
	ctx := context.Background()
	s := open()
	const n = 20
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		replaced []string
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := s.PutSnapshot(ctx, Snapshot{ID: fmt.Sprintf("s%02d", i), Name: "same", CreatedAt: time.Unix(int64(i), 0)})
			if err != nil {
				t.Error(err)
				return
			}
			if r != "" {
				mu.Lock()
				replaced = append(replaced, r)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	list, err := s.ListSnapshots(ctx, SnapshotFilter{})
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

// TestSnapshotNamesPerOwner: a name is unique per owner. Two owners' snapshots
// of one name are both kept and each found by its owner; a second snapshot
// of that name by the same owner replaces the first, and only its.
func TestSnapshotNamesPerOwner(t *testing.T) { forEachDB(t, testSnapshotNamesPerOwner) }

func testSnapshotNamesPerOwner(t *testing.T, open func() *DB) {
	ctx := context.Background()
	s := open()
	t0 := time.Unix(1700000000, 0)
	for i, sn := range []Snapshot{
		{ID: "a1", Name: "nightly", Owner: "teamA", CreatedAt: t0},
		{ID: "b1", Name: "nightly", Owner: "teamB", CreatedAt: t0.Add(time.Second)},
	} {
		if r, err := s.PutSnapshot(ctx, sn); err != nil || r != "" {
			t.Fatalf("put %d: replaced %q, %v; want both kept", i, r, err)
		}
	}
	for owner, want := range map[string]string{"teamA": "a1", "teamB": "b1"} {
		if got, err := s.GetSnapshot(ctx, owner, "nightly:default"); err != nil || got.ID != want {
			t.Fatalf("GetSnapshot(%s, nightly) = %+v, %v; want %s", owner, got, err, want)
		}
	}
	if _, err := s.GetSnapshot(ctx, "teamC", "nightly"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a third team found someone's nightly: %v", err)
	}

	if r, err := s.PutSnapshot(ctx, Snapshot{ID: "a2", Name: "nightly", Owner: "teamA", CreatedAt: t0.Add(2 * time.Second)}); err != nil || r != "a1" {
		t.Fatalf("teamA's second nightly replaced %q, %v; want a1", r, err)
	}
	list, err := s.ListSnapshots(ctx, SnapshotFilter{Name: "nightly"})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].ID != "a2" || list[1].ID != "b1" {
		t.Fatalf("nightly snapshots = %+v, want a2 and b1", list)
	}
	if list, _ := s.ListSnapshots(ctx, SnapshotFilter{Name: "nightly", Owner: "teamB"}); len(list) != 1 || list[0].ID != "b1" {
		t.Fatalf("teamB's nightly = %+v", list)
	}
	// Moving a snapshot to another owner (a put by ID) cannot leave that
	// owner with two of one name.
	if r, err := s.PutSnapshot(ctx, Snapshot{ID: "a2", Name: "nightly", Owner: "teamB", CreatedAt: t0.Add(2 * time.Second)}); err != nil || r != "b1" {
		t.Fatalf("a2 put as teamB's replaced %q, %v; want b1", r, err)
	}
}

// TestSQLiteMigratesGlobalSnapshotNames opens a database whose snapshots
// table has the schema of before names were per owner (a UNIQUE name
// column): the table is rebuilt, every row kept with its name, spec and
// owner, and afterwards two owners may share a name. SQLite only: PostgreSQL
// stores began with names unique per owner.
func TestSQLiteMigratesGlobalSnapshotNames(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "airlock.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE snapshots (
	id          TEXT PRIMARY KEY,
	name        TEXT UNIQUE,           -- NULL when unnamed
	sandbox_id  TEXT NOT NULL,
	template_id TEXT NOT NULL,
	owner       TEXT NOT NULL,
	created_at  INTEGER NOT NULL,
	spec        TEXT NOT NULL DEFAULT ''
);
CREATE INDEX snapshots_created ON snapshots (created_at);
INSERT INTO snapshots VALUES ('snapa', 'nightly', 'sb1', 'base', 'teamA', 1, '{"memoryMB":512}');
INSERT INTO snapshots VALUES ('snapb', 'weekly', 'sb2', 'python3', 'teamB', 2, '');
INSERT INTO snapshots VALUES ('snapc', NULL, 'sb2', 'python3', 'teamB', 3, '');
INSERT INTO snapshots VALUES ('snapd', NULL, 'sb3', 'base', 'teamA', 4, '');
-- Fails the rebuild halfway (the table it reads is gone once dropped),
-- as a crash would stop it: see below.
CREATE VIEW blocker AS SELECT id FROM snapshots;`); err != nil {
		t.Fatal(err)
	}
	oldSQL := func() string {
		t.Helper()
		var ddl string
		if err := db.QueryRow(`SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'snapshots'`).Scan(&ddl); err != nil {
			t.Fatal(err)
		}
		return ddl
	}
	before := oldSQL()
	db.Close()

	// A rebuild that fails after its first steps leaves the old table as
	// it was, rows and all, and nothing of the new one.
	if s, err := OpenSQLite(path); err == nil {
		s.Close()
		t.Fatal("the rebuild went through despite the view on the old table")
	}
	if db, err = sql.Open("sqlite", "file:"+path); err != nil {
		t.Fatal(err)
	}
	var rows, leftovers int
	if err := db.QueryRow(`SELECT count(*) FROM snapshots`).Scan(&rows); err != nil || rows != 4 {
		t.Fatalf("after the failed rebuild: %d rows, %v", rows, err)
	}
	if err := db.QueryRow(`SELECT count(*) FROM sqlite_master WHERE name = 'snapshots_rebuild'`).Scan(&leftovers); err != nil || leftovers != 0 {
		t.Fatalf("after the failed rebuild: %d half-made tables, %v", leftovers, err)
	}
	if got := oldSQL(); got != before {
		t.Fatalf("after the failed rebuild the table is %s", got)
	}
	if _, err := db.Exec(`DROP VIEW blocker`); err != nil {
		t.Fatal(err)
	}
	db.Close()

	for i := range 2 { // a second open finds nothing to migrate
		s, err := OpenSQLite(path)
		if err != nil {
			t.Fatalf("open %d: %v", i, err)
		}
		list, err := s.ListSnapshots(ctx, SnapshotFilter{})
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]Snapshot{}
		for _, sn := range list {
			got[sn.ID] = sn
		}
		if a := got["snapa"]; a.Name != "nightly" || a.Owner != "teamA" || a.SandboxID != "sb1" || a.TemplateID != "base" ||
			!a.CreatedAt.Equal(time.Unix(0, 1)) || string(a.Spec) != `{"memoryMB":512}` {
			t.Fatalf("open %d: snapa = %+v", i, a)
		}
		if b := got["snapb"]; b.Name != "weekly" || b.Owner != "teamB" {
			t.Fatalf("open %d: snapb = %+v", i, b)
		}
		if len(got) != 4 || got["snapc"].Name != "" || got["snapd"].Name != "" {
			t.Fatalf("open %d: snapshots = %+v", i, list)
		}
		var unique int
		if err := s.db.raw.QueryRow(`SELECT count(*) FROM pragma_index_list('snapshots') WHERE origin = 'u'`).Scan(&unique); err != nil || unique != 0 {
			t.Fatalf("open %d: %d indexes from a UNIQUE constraint left, %v", i, unique, err)
		}
		var idx []string
		rows, err := s.db.raw.Query(`SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'snapshots' AND sql IS NOT NULL ORDER BY name`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var n string
			rows.Scan(&n)
			idx = append(idx, n)
		}
		rows.Close()
		if fmt.Sprint(idx) != "[snapshots_created snapshots_owner_name]" {
			t.Fatalf("open %d: indexes %v", i, idx)
		}
		s.Close()
	}

	s, err := OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if r, err := s.PutSnapshot(ctx, Snapshot{ID: "snape", Name: "nightly", Owner: "teamB", CreatedAt: time.Unix(0, 5)}); err != nil || r != "" {
		t.Fatalf("teamB's nightly beside teamA's: replaced %q, %v", r, err)
	}
	if r, err := s.PutSnapshot(ctx, Snapshot{ID: "snapf", Name: "nightly", Owner: "teamA", CreatedAt: time.Unix(0, 6)}); err != nil || r != "snapa" {
		t.Fatalf("teamA's new nightly replaced %q, %v; want snapa", r, err)
	}
	// The per-owner index holds even against a write that skips PutSnapshot's check.
	if _, err := s.db.raw.Exec(`INSERT INTO snapshots (id, name, sandbox_id, template_id, owner, created_at) VALUES ('snapg', 'nightly', 'x', 'base', 'teamA', 7)`); err == nil {
		t.Fatal("a second nightly of teamA's was inserted")
	}
}

func TestOpJournal(t *testing.T) { forEachDB(t, testOpJournal) }

func testOpJournal(t *testing.T, open func() *DB) {
	ctx := context.Background()
	s := open()
	t0 := time.Unix(1700000000, 0)
	if err := s.PutOp(ctx, Op{ID: "2", Kind: OpFork, SandboxID: "sb2", StartedAt: t0.Add(time.Second), Data: json.RawMessage(`{"forks":["f1","f2"]}`)}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutOp(ctx, Op{ID: "1", Kind: OpPause, SandboxID: "sb1", StartedAt: t0}); err != nil {
		t.Fatal(err)
	}
	// An op records its progress by being put again.
	if err := s.PutOp(ctx, Op{ID: "1", Kind: OpPause, SandboxID: "sb1", StartedAt: t0, Data: json.RawMessage(`{"step":"checkpointed"}`)}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutOp(ctx, Op{ID: "3", Data: json.RawMessage(`nope`)}); err == nil {
		t.Errorf("an op with data that is not JSON was stored")
	}
	s.Close()
	s = open()
	ops, err := s.ListOps(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ops) != 2 || ops[0].ID != "1" || ops[0].Kind != OpPause || string(ops[0].Data) != `{"step":"checkpointed"}` || !ops[0].StartedAt.Equal(t0) ||
		ops[1].ID != "2" || ops[1].SandboxID != "sb2" || string(ops[1].Data) != `{"forks":["f1","f2"]}` {
		t.Fatalf("ops = %+v", ops)
	}
	if err := s.DeleteOp(ctx, "1"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteOp(ctx, "unknown"); err != nil {
		t.Errorf("DeleteOp of an unknown op: %v", err)
	}
	if ops, _ := s.ListOps(ctx); len(ops) != 1 || ops[0].ID != "2" {
		t.Errorf("ops after delete = %+v", ops)
	}
}
