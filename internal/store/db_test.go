package store

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/store/pgtest"
)

// The package's tests are one conformance suite for both databases: each
// test of the store's behaviour takes its store from forEachDB and runs once
// on SQLite and once on PostgreSQL (a fresh database on one server shared by
// the package's tests, started on first use and stopped by TestMain). Tests
// about SQLite's files alone (migrations from an older schema) open SQLite
// directly and say so; pg_test.go has the tests of several processes sharing
// one PostgreSQL database.

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// dbKinds are the databases forEachDB runs a test on.
var dbKinds = []string{"sqlite", "postgres"}

// forEachDB runs f as a subtest per database ("sqlite", "postgres"), each on
// an empty database of its own. open opens a store on that database, again
// at each call (a restart, when the one before was closed); every store it
// opens is closed when the subtest ends.
func forEachDB(t *testing.T, f func(t *testing.T, open func() *DB)) {
	t.Helper()
	for _, kind := range dbKinds {
		t.Run(kind, func(t *testing.T) {
			f(t, opener(t, kind))
		})
	}
}

// opener returns the open function of forEachDB for one kind of database.
func opener(t testing.TB, kind string) func() *DB {
	t.Helper()
	var openDB func() (*DB, error)
	switch kind {
	case "sqlite":
		path := filepath.Join(t.TempDir(), "airlock.db")
		openDB = func() (*DB, error) { return OpenSQLite(path) }
	case "postgres":
		dsn := pgtest.NewDatabase(t)
		openDB = func() (*DB, error) { return OpenPostgres(context.Background(), dsn) }
	default:
		t.Fatalf("unknown database kind %q", kind)
	}
	return func() *DB {
		t.Helper()
		s, err := openDB()
		if err != nil {
			t.Fatal(err)
		}
		if s.Dialect() != kind {
			t.Fatalf("opened a %s store for %s", s.Dialect(), kind)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
}
