package store

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

func TestSandboxLogs(t *testing.T) { forEachDB(t, testSandboxLogs) }

func testSandboxLogs(t *testing.T, open func() *DB) {
	ctx := context.Background()
	db := open()
	t0 := time.Unix(1700000000, 0)
	if err := db.Put(ctx, Sandbox{ID: "live", StartedAt: t0, EndAt: t0.Add(time.Hour), State: "running"}); err != nil {
		t.Fatal(err)
	}
	e := func(i int) LogEntry {
		return LogEntry{Time: t0.Add(time.Duration(i) * time.Second), Level: "info", Logger: "airlock.test", Message: fmt.Sprint(i), Fields: map[string]string{"i": fmt.Sprint(i)}, Origin: "host"}
	}
	if err := db.AddLogs(ctx, "live", []LogEntry{e(2), e(1)}); err != nil {
		t.Fatal(err)
	}
	got, err := db.Logs(ctx, "live")
	if err != nil || len(got) != 2 || got[0].Message != "1" || got[1].Fields["i"] != "2" || got[0].Origin != "host" {
		t.Fatalf("Logs = %+v, %v", got, err)
	}
	if _, _, err := db.LogEnd(ctx, "live"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("LogEnd of a live sandbox: %v", err)
	}

	// Killed: the end and the sandbox's entries go in together, the record
	// goes, and the log stays until the retention sweeps it.
	if err := db.EndLogs(ctx, "live", "owner1", t0.Add(time.Minute), []LogEntry{e(3)}); err != nil {
		t.Fatal(err)
	}
	// A second end (a kill a crash cut short, then the real one) replaces
	// the sandbox's own entries rather than adding them twice.
	inside := LogEntry{Time: t0.Add(4 * time.Second), Level: "warn", Logger: "envd.process", Message: "inside", Origin: "sandbox"}
	for range 2 {
		if err := db.EndLogs(ctx, "live", "owner1", t0.Add(time.Minute), []LogEntry{inside}); err != nil {
			t.Fatal(err)
		}
	}
	if got, _ := db.Logs(ctx, "live"); len(got) != 4 {
		t.Fatalf("after two ends: %d entries, want 4: %+v", len(got), got)
	}
	if err := db.Delete(ctx, "live"); err != nil {
		t.Fatal(err)
	}
	owner, at, err := db.LogEnd(ctx, "live")
	if err != nil || owner != "owner1" || !at.Equal(t0.Add(time.Minute)) {
		t.Fatalf("LogEnd = %q %v %v", owner, at, err)
	}
	if got, _ := db.Logs(ctx, "live"); len(got) != 4 {
		t.Fatalf("a killed sandbox's log has %d entries, want 4", len(got))
	}
	// An orphan (no record, no end: a failed create) older than the cutoff.
	if err := db.AddLogs(ctx, "orphan", []LogEntry{e(1)}); err != nil {
		t.Fatal(err)
	}
	if n, err := db.SweepLogs(ctx, t0.Add(30*time.Second)); err != nil || n != 0 {
		t.Fatalf("sweep before the end: %d, %v", n, err)
	}
	if got, _ := db.Logs(ctx, "live"); len(got) != 4 {
		t.Fatalf("swept a log within its retention: %d left", len(got))
	}
	if got, _ := db.Logs(ctx, "orphan"); len(got) != 0 {
		t.Fatalf("an orphan log older than the retention survived: %+v", got)
	}
	if n, err := db.SweepLogs(ctx, t0.Add(2*time.Minute)); err != nil || n != 1 {
		t.Fatalf("sweep after the retention: %d, %v", n, err)
	}
	if got, _ := db.Logs(ctx, "live"); len(got) != 0 {
		t.Fatalf("swept log still has %d entries", len(got))
	}
	if _, _, err := db.LogEnd(ctx, "live"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("LogEnd after the sweep: %v", err)
	}
}

func TestSandboxLogsCapped(t *testing.T) { forEachDB(t, testSandboxLogsCapped) }

func testSandboxLogsCapped(t *testing.T, open func() *DB) {
	ctx := context.Background()
	db := open()
	t0 := time.Unix(1700000000, 0)
	batch := make([]LogEntry, 0, MaxLogEntries+10)
	for i := range MaxLogEntries + 10 {
		batch = append(batch, LogEntry{Time: t0.Add(time.Duration(i) * time.Millisecond), Level: "error", Logger: "airlock.oom", Message: fmt.Sprint(i), Origin: "host"})
	}
	if err := db.AddLogs(ctx, "s", batch); err != nil {
		t.Fatal(err)
	}
	got, err := db.Logs(ctx, "s")
	if err != nil || len(got) != MaxLogEntries || got[0].Message != "10" {
		t.Fatalf("kept %d entries starting at %q, %v", len(got), got[0].Message, err)
	}
}

// BenchmarkEndLogs is what a kill adds: storing a killed sandbox's log.
func BenchmarkEndLogs(b *testing.B) {
	for _, kind := range dbKinds {
		for _, n := range []int{20, 1000} {
			b.Run(fmt.Sprint(kind, "/", n), func(b *testing.B) {
				benchmarkEndLogs(b, opener(b, kind)(), n)
			})
		}
	}
}

func benchmarkEndLogs(b *testing.B, db *DB, n int) {
	entries := make([]LogEntry, n)
	for i := range entries {
		entries[i] = LogEntry{Time: time.Now(), Level: "info", Logger: "envd.process", Message: "process 123 exited with code 0",
			Fields: map[string]string{"pid": "123", "cmd": "/bin/bash -l -c \"echo hello\"", "exitCode": "0"}, Origin: "sandbox"}
	}
	ctx := context.Background()
	b.ResetTimer()
	for i := range b.N {
		if err := db.EndLogs(ctx, fmt.Sprint("s", i), "o", time.Now(), entries); err != nil {
			b.Fatal(err)
		}
	}
}
