// Package pgtest gives tests a PostgreSQL database of their own: a
// throwaway server started from the machine's PostgreSQL binaries (initdb
// into a temporary directory, pg_ctl start as the unprivileged postgres
// user, listening on 127.0.0.1 and a unix socket in that directory, fsync
// off), or a fresh database on the server AIRLOCK_TEST_POSTGRES names.
//
// Two ways to use it. Start(t) starts a server for one test and stops it at
// the test's cleanup: simple, and an initdb (about a second) per call.
// NewDatabase(t) hands each test a fresh database on one server shared by
// the package's tests, started on first use; the package's TestMain must
// call Main, which stops that server when the tests are done:
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
//
// Without PostgreSQL installed both skip the test, or fail it when
// AIRLOCK_TEST_REQUIRE=1 (as scripts/test.sh sets), naming the Debian package
// to install.
//
// Written here because the Go libraries that start PostgreSQL for tests
// either download its binaries (which this machine kind cannot) or run it in
// a container; this runs the machine's own, which Debian's package installs.
package pgtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
)

// EnvDSN names an outside server to use instead of starting one: a
// postgres:// URL of a role that may create databases. Each test gets a
// database of its own there, dropped at its cleanup.
const EnvDSN = "AIRLOCK_TEST_POSTGRES"

// Package is the Debian package that installs the server binaries.
const Package = "postgresql"

// ErrUnavailable is returned (wrapped) by NewServer when no PostgreSQL
// server binaries are installed.
var ErrUnavailable = errors.New("pgtest: PostgreSQL is not installed (Debian package " + Package + ")")

// dirPrefix names the temporary directories of the servers this package
// starts; owner.pid in each holds the test process's pid, so a later run
// can stop what a killed one left (see reapLeftovers).
const dirPrefix = "airlock-pgtest-"

// Server is a PostgreSQL server for tests: one this package started, or an
// outside one (EnvDSN).
type Server struct {
	// admin is a URL of the server's maintenance database ("postgres").
	admin *url.URL
	// dir, pgCtl and cred are set for a server this package started.
	dir   string
	pgCtl string
	cred  *syscall.Credential
	seq   atomic.Int64

	closeOnce sync.Once
	closeErr  error
}

// Start returns the DSN of a fresh database for t: on a server started for t
// alone and stopped (its directory removed) at t's cleanup, whether t
// passed or not; or, when EnvDSN is set, on that server.
func Start(t testing.TB) (dsn string) {
	t.Helper()
	srv, err := NewServer()
	if err != nil {
		unavailable(t, err)
	}
	t.Cleanup(func() {
		if err := srv.Close(); err != nil {
			t.Errorf("pgtest: %v", err)
		}
	})
	return srv.NewDatabase(t)
}

// NewServer starts a server (or, when EnvDSN is set, connects to that one);
// Close stops it. Errors wrap ErrUnavailable when PostgreSQL is not
// installed.
func NewServer() (*Server, error) {
	if dsn := os.Getenv(EnvDSN); dsn != "" {
		u, err := url.Parse(dsn)
		if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
			return nil, fmt.Errorf("pgtest: %s must be a postgres:// URL, got %q", EnvDSN, dsn)
		}
		s := &Server{admin: u}
		if err := s.ping(); err != nil {
			return nil, fmt.Errorf("pgtest: the server %s names: %w", EnvDSN, err)
		}
		return s, nil
	}
	bin, err := findBinaries()
	if err != nil {
		return nil, err
	}
	reapLeftovers(bin)
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		// PostgreSQL refuses to run as root.
		if cred, err = postgresUser(); err != nil {
			return nil, err
		}
	}
	dir, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	s := &Server{dir: dir, pgCtl: filepath.Join(bin, "pg_ctl"), cred: cred}
	if err := s.start(bin); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// start makes the cluster and starts its server.
func (s *Server) start(bin string) error {
	if err := os.WriteFile(filepath.Join(s.dir, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	if s.cred != nil {
		if err := os.Chown(s.dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			return fmt.Errorf("pgtest: %w", err)
		}
	}
	data := filepath.Join(s.dir, "data")
	if out, err := s.run(filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "--auth=trust",
		"-E", "UTF8", "--locale=C", "--no-sync"); err != nil {
		return fmt.Errorf("pgtest: initdb: %w\n%s", err, out)
	}
	// The port is found free, then taken by the server: another process can
	// take it in between, so a failed start tries another.
	var lastErr error
	for range 3 {
		port, err := freePort()
		if err != nil {
			return err
		}
		conf := fmt.Sprintf(`
listen_addresses = '127.0.0.1'
port = %d
unix_socket_directories = '%s'
fsync = off
synchronous_commit = off
full_page_writes = off
max_connections = 200
`, port, s.dir)
		if err := os.WriteFile(filepath.Join(data, "postgresql.auto.conf"), []byte(conf), 0o600); err != nil {
			return fmt.Errorf("pgtest: %w", err)
		}
		if s.cred != nil {
			if err := os.Chown(filepath.Join(data, "postgresql.auto.conf"), int(s.cred.Uid), int(s.cred.Gid)); err != nil {
				return fmt.Errorf("pgtest: %w", err)
			}
		}
		logFile := filepath.Join(s.dir, "server.log")
		out, err := s.run(s.pgCtl, "start", "-D", data, "-l", logFile, "-w", "-t", "60", "-s")
		if err == nil {
			s.admin = &url.URL{Scheme: "postgres", User: url.User("postgres"), Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
				Path: "/postgres", RawQuery: "sslmode=disable"}
			return s.ping()
		}
		log, _ := os.ReadFile(logFile)
		lastErr = fmt.Errorf("pgtest: pg_ctl start: %w\n%s\n%s", err, out, log)
	}
	return lastErr
}

// run runs a PostgreSQL program as the server's user.
func (s *Server) run(prog string, args ...string) ([]byte, error) {
	cmd := exec.Command(prog, args...)
	cmd.Dir = s.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	return cmd.CombinedOutput()
}

func (s *Server) ping() error {
	db, err := sql.Open("pgx", s.admin.String())
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return db.PingContext(ctx)
}

// DSN is the URL of the server's maintenance database.
func (s *Server) DSN() string { return s.admin.String() }

// NewDatabase creates a database for t alone and returns its URL; it is
// dropped at t's cleanup.
func (s *Server) NewDatabase(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("airlock_test_%d_%d_%d", os.Getpid(), time.Now().UnixNano()%1e9, s.seq.Add(1))
	db, err := sql.Open("pgx", s.admin.String())
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := db.ExecContext(ctx, `CREATE DATABASE `+name); err != nil {
		t.Fatalf("pgtest: create database: %v", err)
	}
	t.Cleanup(func() {
		db, err := sql.Open("pgx", s.admin.String())
		if err != nil {
			t.Errorf("pgtest: %v", err)
			return
		}
		defer db.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// FORCE: a connection the test left open does not keep it.
		if _, err := db.ExecContext(ctx, `DROP DATABASE IF EXISTS `+name+` WITH (FORCE)`); err != nil {
			t.Errorf("pgtest: drop database %s: %v", name, err)
		}
	})
	u := *s.admin
	u.Path = "/" + name
	return u.String()
}

// Close stops a server this package started (immediately: its data is
// thrown away) and removes its directory; for an outside server it does
// nothing.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		if s.dir == "" {
			return
		}
		if _, err := os.Stat(filepath.Join(s.dir, "data", "postmaster.pid")); err == nil {
			if out, err := s.run(s.pgCtl, "stop", "-D", filepath.Join(s.dir, "data"), "-m", "immediate", "-w", "-s"); err != nil {
				s.closeErr = fmt.Errorf("pg_ctl stop: %w\n%s", err, out)
			}
		}
		if err := os.RemoveAll(s.dir); err != nil && s.closeErr == nil {
			s.closeErr = err
		}
	})
	return s.closeErr
}

// The shared server of NewDatabase.
var shared struct {
	mu      sync.Mutex
	inMain  bool
	started bool
	srv     *Server
	err     error
}

// Main runs the package's tests (m.Run) and then stops the server
// NewDatabase started, if it did; its result is the exit code. Call it from
// TestMain.
func Main(m *testing.M) int {
	shared.mu.Lock()
	shared.inMain = true
	shared.mu.Unlock()
	code := m.Run()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.srv != nil {
		if err := shared.srv.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: %v\n", err)
			if code == 0 {
				code = 1
			}
		}
		shared.srv = nil
	}
	return code
}

// NewDatabase returns the URL of a fresh database for t on the server shared
// by the package's tests (started by the first call; Main stops it), dropped
// at t's cleanup.
func NewDatabase(t testing.TB) string {
	t.Helper()
	shared.mu.Lock()
	if !shared.inMain {
		shared.mu.Unlock()
		t.Fatal("pgtest.NewDatabase needs the package's TestMain to run pgtest.Main (which stops the shared server)")
	}
	if !shared.started {
		shared.started = true
		shared.srv, shared.err = NewServer()
	}
	srv, err := shared.srv, shared.err
	shared.mu.Unlock()
	if err != nil {
		unavailable(t, err)
	}
	return srv.NewDatabase(t)
}

// unavailable skips t, or fails it when AIRLOCK_TEST_REQUIRE=1 or the
// server is there but would not start.
func unavailable(t testing.TB, err error) {
	t.Helper()
	if errors.Is(err, ErrUnavailable) && os.Getenv("AIRLOCK_TEST_REQUIRE") != "1" {
		t.Skipf("%v", err)
	}
	t.Fatalf("%v", err)
}

// findBinaries returns the directory of initdb, pg_ctl and postgres: the
// highest version under /usr/lib/postgresql (Debian's layout), else PATH's.
func findBinaries() (string, error) {
	has := func(dir string) bool {
		for _, p := range []string{"initdb", "pg_ctl", "postgres"} {
			if fi, err := os.Stat(filepath.Join(dir, p)); err != nil || fi.IsDir() {
				return false
			}
		}
		return true
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if has(d) {
			return d, nil
		}
	}
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil && has(filepath.Dir(real)) {
			return filepath.Dir(real), nil
		}
		if has(filepath.Dir(p)) {
			return filepath.Dir(p), nil
		}
	}
	return "", ErrUnavailable
}

// version is the major version in /usr/lib/postgresql/<v>/bin (0 if none).
func version(binDir string) float64 {
	v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(binDir)), 64)
	return v
}

// postgresUser is the credential of the postgres user (Debian's package
// makes it).
func postgresUser() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgtest: running as root needs the postgres user to run the server as (Debian package %s makes it): %w", Package, err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("pgtest: postgres user: %w", err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgtest: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// reapLeftovers stops the servers, and removes the directories, that test
// processes no longer running left behind (killed by a timeout or a
// signal before their cleanup ran).
func reapLeftovers(bin string) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, "owner.pid"))
		if err != nil {
			continue // being made, or not ours
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid == os.Getpid() || alive(pid) {
			continue
		}
		fi, err := os.Stat(dir)
		if err != nil {
			continue
		}
		st, _ := fi.Sys().(*syscall.Stat_t)
		s := &Server{dir: dir, pgCtl: filepath.Join(bin, "pg_ctl")}
		if st != nil && st.Uid != uint32(os.Geteuid()) {
			s.cred = &syscall.Credential{Uid: st.Uid, Gid: st.Gid, NoSetGroups: true}
		}
		_ = s.Close()
	}
}

// alive tells whether a process pid exists.
func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
