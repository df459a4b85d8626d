package pgtest

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

func TestMain(m *testing.M) { os.Exit(Main(m)) }

// TestStart: a server of its own answers, and is gone (directory and all)
// after the test's cleanup.
func TestStart(t *testing.T) {
	if os.Getenv(EnvDSN) != "" {
		t.Skip("an outside server: nothing is started")
	}
	ours := func() (dirs []string) {
		all, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
		for _, d := range all {
			if b, _ := os.ReadFile(filepath.Join(d, "owner.pid")); string(b) == strconv.Itoa(os.Getpid()) {
				dirs = append(dirs, d)
			}
		}
		return dirs
	}
	before := len(ours())
	t.Run("server", func(t *testing.T) {
		dsn := Start(t)
		query(t, dsn)
		if n := len(ours()); n != before+1 {
			t.Fatalf("%d server directories of this process, want %d", n, before+1)
		}
	})
	if n := len(ours()); n != before {
		t.Fatalf("%d server directories of this process after cleanup, want %d", n, before)
	}
}

// TestNewDatabase: two databases on the shared server are apart.
func TestNewDatabase(t *testing.T) {
	a, b := NewDatabase(t), NewDatabase(t)
	if a == b {
		t.Fatalf("one database twice: %s", a)
	}
	execSQL(t, a, `CREATE TABLE only_in_a (x int)`)
	execSQL(t, b, `CREATE TABLE only_in_a (x int)`) // would fail if b were a
	query(t, b)
}

func open(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func execSQL(t *testing.T, dsn, q string) {
	t.Helper()
	if _, err := open(t, dsn).ExecContext(context.Background(), q); err != nil {
		t.Fatal(err)
	}
}

func query(t *testing.T, dsn string) {
	t.Helper()
	var n int
	if err := open(t, dsn).QueryRowContext(context.Background(), `SELECT 1 + 1`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("SELECT 1 + 1 = %d, %v", n, err)
	}
}
