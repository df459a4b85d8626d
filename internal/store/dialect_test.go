package store

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/store/pgtest"
)

func TestRebind(t *testing.T) {
	for q, want := range map[string]string{
		`SELECT 1`: `SELECT 1`,
		`SELECT a FROM t WHERE b = ? AND c IN (?, ?)`:   `SELECT a FROM t WHERE b = $1 AND c IN ($2, $3)`,
		`SELECT '?', "a?b", 'it''s ?' FROM t WHERE x=?`: `SELECT '?', "a?b", 'it''s ?' FROM t WHERE x=$1`,
		"SELECT x -- why?\nFROM t WHERE y = ?":          "SELECT x -- why?\nFROM t WHERE y = $1",
		`SELECT 'unterminated ?`:                        `SELECT 'unterminated ?`,
	} {
		if got := postgresDialect.rebind(q); got != want {
			t.Errorf("rebind(%q) = %q, want %q", q, got, want)
		}
		if got := sqliteDialect.rebind(q); got != q {
			t.Errorf("SQLite's rebind changed %q to %q", q, got)
		}
	}
}

// TestOpen: a postgres:// or postgresql:// URL opens PostgreSQL, anything
// else a SQLite file at that path.
func TestOpen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "airlock.db")
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if s.Dialect() != "sqlite" {
		t.Errorf("Open(%s) is %s", path, s.Dialect())
	}
	dsn := pgtest.NewDatabase(t)
	for _, scheme := range []string{"postgres://", "postgresql://"} {
		u := scheme + dsn[len("postgres://"):]
		s, err := Open(ctx, u)
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		if s.Dialect() != "postgres" {
			t.Errorf("Open(%s) is %s", u, s.Dialect())
		}
	}
}

// TestLogTextBothDatabases: what PostgreSQL's text cannot hold (a NUL byte,
// invalid UTF-8) reads back the same from both databases, as U+FFFD.
func TestLogTextBothDatabases(t *testing.T) { forEachDB(t, testLogText) }

func testLogText(t *testing.T, open func() *DB) {
	ctx := context.Background()
	s := open()
	in := LogEntry{Time: time.Unix(1, 0), Level: "info", Logger: "envd\x00x", Message: "a\x00b\xffc", Fields: map[string]string{"k": "v\x00"}, Origin: "sandbox"}
	if err := s.AddLogs(ctx, "sb", []LogEntry{in}); err != nil {
		t.Fatal(err)
	}
	got, err := s.Logs(ctx, "sb")
	if err != nil || len(got) != 1 {
		t.Fatalf("Logs = %+v, %v", got, err)
	}
	if got[0].Logger != "envd\uFFFDx" || got[0].Message != "a\uFFFDb\uFFFDc" || got[0].Fields["k"] != "v\x00" {
		t.Fatalf("read back %q %q %q", got[0].Logger, got[0].Message, got[0].Fields["k"])
	}
}
