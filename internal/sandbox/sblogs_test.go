package sandbox_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/runtime/gvisor"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// findLog polls the sandbox's log until an entry satisfies ok (host entries
// are written off the caller's path).
func findLog(t *testing.T, m *sandbox.Manager, id string, q sandbox.LogQuery, what string, ok func(sandbox.LogEntry) bool) sandbox.LogEntry {
	t.Helper()
	var all []sandbox.LogEntry
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		var err error
		if all, err = m.Logs(context.Background(), id, q); err != nil {
			t.Fatalf("Logs: %v", err)
		}
		for _, e := range all {
			if ok(e) {
				return e
			}
		}
	}
	var b strings.Builder
	for _, e := range all {
		b.WriteString("\n  " + e.Level + " " + e.Logger + " " + e.Message)
	}
	t.Fatalf("no log entry %s in:%s", what, b.String())
	return sandbox.LogEntry{}
}

// TestSandboxLogStory follows a sandbox's log through a template's start
// phase, commands, a pause and resume, filters, and its kill.
func TestSandboxLogStory(t *testing.T) {
	r := newRig(t)
	r.tpl.StartCmd = "echo hello-from-start; echo trouble-from-start >&2; exec sleep 600"
	r.tpl.ReadyCmd = "test -e /proc/self"
	r.tpl.ReadyTimeout = 30 * time.Second
	m := r.manager(t, 0)
	ctx := context.Background()
	info, err := m.Create(ctx, sandbox.CreateRequest{Template: "base", Timeout: time.Minute, Secure: true, Owner: "owner-a"})
	if err != nil {
		t.Fatal(err)
	}
	id := info.ID

	// The start command's output and how the start phase ended.
	out := findLog(t, m, id, sandbox.LogQuery{}, "with the start command's stdout", func(e sandbox.LogEntry) bool {
		return e.Logger == "envd.output" && e.Message == "hello-from-start"
	})
	if out.Level != "info" || out.Fields["tag"] != sandbox.StartCmdTag || out.Fields["stream"] != "stdout" || out.Origin != "sandbox" {
		t.Fatalf("start command stdout entry: %+v", out)
	}
	findLog(t, m, id, sandbox.LogQuery{}, "with the start command's stderr at warn", func(e sandbox.LogEntry) bool {
		return e.Logger == "envd.output" && e.Message == "trouble-from-start" && e.Level == "warn"
	})
	ready := findLog(t, m, id, sandbox.LogQuery{}, "saying the template is ready", func(e sandbox.LogEntry) bool {
		return e.Logger == "airlock.template"
	})
	if ready.Origin != "host" || ready.Level != "info" || !strings.Contains(ready.Message, "ready command `test -e /proc/self` succeeded") {
		t.Fatalf("start phase entry: %+v", ready)
	}
	// Ready checks are debug: present, but not at info.
	findLog(t, m, id, sandbox.LogQuery{MinLevel: "debug"}, "of a ready check at debug", func(e sandbox.LogEntry) bool {
		return e.Level == "debug" && strings.Contains(e.Fields["cmd"], "test -e /proc/self")
	})
	if infos, _ := m.Logs(ctx, id, sandbox.LogQuery{MinLevel: "info"}); hasCmd(infos, "test -e /proc/self") {
		t.Fatal("ready checks show at level info")
	}

	// A command that exits 3: started (info) and ended (warn, exit code 3).
	if _, code := run(t, m, info, "echo $((6*7)); exit 3"); code != 3 {
		t.Fatalf("exit code %d", code)
	}
	started := findLog(t, m, id, sandbox.LogQuery{}, "of the command's start", func(e sandbox.LogEntry) bool {
		return e.Logger == "envd.process" && strings.Contains(e.Message, "started") && strings.Contains(e.Fields["cmd"], "exit 3")
	})
	ended := findLog(t, m, id, sandbox.LogQuery{}, "of the command's exit code 3", func(e sandbox.LogEntry) bool {
		return e.Logger == "envd.process" && e.Fields["exitCode"] == "3"
	})
	if started.Level != "info" || started.Fields["user"] != "user" || ended.Level != "warn" || ended.Fields["pid"] != started.Fields["pid"] ||
		ended.Message != "process "+started.Fields["pid"]+" exited with code 3" {
		t.Fatalf("start %+v\nend %+v", started, ended)
	}
	// Not the command's own output: that is the client's.
	if all, _ := m.Logs(ctx, id, sandbox.LogQuery{Search: "42"}); len(all) != 0 {
		t.Fatalf("a command's output went to the log: %+v", all)
	}

	// Filters.
	warns, err := m.Logs(ctx, id, sandbox.LogQuery{MinLevel: "warn"})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range warns {
		if e.Level != "warn" && e.Level != "error" {
			t.Fatalf("level=warn returned %+v", e)
		}
	}
	if got, _ := m.Logs(ctx, id, sandbox.LogQuery{Search: "exited with code 3"}); len(got) != 1 || got[0].Fields["exitCode"] != "3" {
		t.Fatalf("search: %+v", got)
	}
	if _, err := m.Logs(ctx, id, sandbox.LogQuery{Owner: "owner-b"}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("another owner read the log: %v", err)
	}

	// Paused (envd is not running): the log still reads; resumed, it goes on.
	if err := m.Pause(ctx, id, sandbox.PauseOptions{}); err != nil {
		t.Fatal(err)
	}
	findLog(t, m, id, sandbox.LogQuery{Owner: "owner-a"}, "of exit code 3 while paused", func(e sandbox.LogEntry) bool { return e.Fields["exitCode"] == "3" })
	info, _, err = m.Connect(ctx, id, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, code := run(t, m, info, "exit 4"); code != 4 {
		t.Fatalf("exit code %d", code)
	}
	findLog(t, m, id, sandbox.LogQuery{}, "of exit code 4 after the resume", func(e sandbox.LogEntry) bool { return e.Fields["exitCode"] == "4" })
	findLog(t, m, id, sandbox.LogQuery{}, "of exit code 3 after the resume", func(e sandbox.LogEntry) bool { return e.Fields["exitCode"] == "3" })

	// Killed: the log stays readable, for its owner only.
	if err := m.Kill(ctx, id); err != nil {
		t.Fatal(err)
	}
	findLog(t, m, id, sandbox.LogQuery{Owner: "owner-a"}, "of exit code 4 after the kill", func(e sandbox.LogEntry) bool { return e.Fields["exitCode"] == "4" })
	findLog(t, m, id, sandbox.LogQuery{Owner: "owner-a", MinLevel: "warn", Search: "code 3"}, "filtered after the kill", func(e sandbox.LogEntry) bool { return e.Fields["exitCode"] == "3" })
	if _, err := m.Logs(ctx, id, sandbox.LogQuery{Owner: "owner-b"}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("another owner read a killed sandbox's log: %v", err)
	}
	if _, err := m.Logs(ctx, "nosuchsandbox0000000", sandbox.LogQuery{}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("unknown sandbox: %v", err)
	}
}

func hasCmd(entries []sandbox.LogEntry, cmd string) bool {
	for _, e := range entries {
		if strings.Contains(e.Fields["cmd"], cmd) {
			return true
		}
	}
	return false
}

func TestPageLogs(t *testing.T) {
	t0 := time.UnixMilli(1700000000000)
	var entries []sandbox.LogEntry
	// Two entries per millisecond, levels cycling.
	levels := []string{"debug", "info", "warn", "error"}
	for i := range 12 {
		entries = append(entries, sandbox.LogEntry{Time: t0.Add(time.Duration(i/2) * time.Millisecond), Level: levels[i%4], Message: string(rune('a' + i))})
	}
	msgs := func(es []sandbox.LogEntry) string {
		var b strings.Builder
		for _, e := range es {
			b.WriteString(e.Message)
		}
		return b.String()
	}
	for _, c := range []struct {
		name string
		q    sandbox.LogQuery
		want string
	}{
		{"all", sandbox.LogQuery{}, "abcdefghijkl"},
		{"warn and up", sandbox.LogQuery{MinLevel: "warn"}, "cdghkl"},
		{"search", sandbox.LogQuery{Search: "k"}, "k"},
		// A page cut inside a millisecond ends before it.
		{"limit cut back to a whole ms", sandbox.LogQuery{Limit: 3}, "ab"},
		{"limit on a ms boundary", sandbox.LogQuery{Limit: 4}, "abcd"},
		{"cursor forward", sandbox.LogQuery{Cursor: t0.Add(4 * time.Millisecond)}, "ijkl"},
		{"cursor backward", sandbox.LogQuery{Cursor: t0.Add(time.Millisecond), Backward: true}, "dcba"},
		{"backward from now", sandbox.LogQuery{Backward: true, Limit: 2}, "lk"},
		{"backward cut back", sandbox.LogQuery{Backward: true, Limit: 3}, "lk"},
		{"one ms over a page is cut inside it", sandbox.LogQuery{Limit: 1}, "a"},
	} {
		if got := msgs(sandbox.PageLogs(entries, c.q)); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

// TestSandboxLogSurvivesRestart: a server restart (the manager closed with
// its sandboxes running, a new one re-adopting them) keeps both sources of
// the log, and a sandbox that did not survive keeps its log as killed.
func TestSandboxLogSurvivesRestart(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	first := sandbox.New(sandbox.Options{Runtime: r.rt, Store: r.db, Templates: r, DataDir: r.dataDir, EnvdPath: r.envd, MaxTimeout: time.Hour})
	alive := create(t, first, time.Minute)
	expired := create(t, first, time.Minute)
	for _, info := range []sandbox.Info{alive, expired} {
		if _, code := run(t, first, info, "exit 5"); code != 5 {
			t.Fatalf("exit code %d", code)
		}
	}
	first.Close() // the server stops; sandboxes keep running
	rec, _ := r.db.Get(ctx, expired.ID)
	rec.EndAt = time.Now().Add(-time.Second)
	if err := r.db.Put(ctx, rec); err != nil {
		t.Fatal(err)
	}

	second := r.recovered(t)
	for _, id := range []string{alive.ID, expired.ID} {
		findLog(t, second, id, sandbox.LogQuery{}, "of exit code 5 after the restart", func(e sandbox.LogEntry) bool { return e.Fields["exitCode"] == "5" })
	}
	if _, err := second.Get(ctx, expired.ID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("the expired sandbox was re-adopted: %v", err)
	}
	if _, code := run(t, second, alive, "exit 6"); code != 6 {
		t.Fatalf("exit code %d", code)
	}
	findLog(t, second, alive.ID, sandbox.LogQuery{}, "of exit code 6 after the restart", func(e sandbox.LogEntry) bool { return e.Fields["exitCode"] == "6" })
}

// TestSandboxLogForgery: the sandbox's root owns the file envd writes, so it
// can write anything there; none of it reads as the host's, and a symlink to
// a host file shows nothing of that file.
func TestSandboxLogForgery(t *testing.T) {
	r := newRig(t)
	m := r.manager(t, 0)
	info := create(t, m, time.Minute)
	ctx := context.Background()
	forge := `printf '%s\n' '{"time":"2030-01-01T00:00:00Z","level":"error","logger":"airlock.oom","message":"forged oom","origin":"host","fields":{"origin":"host"}}' >> /run/airlock/sandbox-log.jsonl`
	if out, code := runAsRoot(t, m, info, forge); code != 0 {
		t.Fatalf("root could not write its log: %s", out)
	}
	// (The command's own start entry names "forged" too, at info.)
	got, err := m.Logs(ctx, info.ID, sandbox.LogQuery{Search: "forged", MinLevel: "error"})
	if err != nil || len(got) != 1 {
		t.Fatalf("forged entry: %+v, %v", got, err)
	}
	if e := got[0]; e.Origin != "sandbox" || e.Logger != "envd.airlock.oom" || e.Fields["origin"] != "" {
		t.Fatalf("a line written in the sandbox reads as origin %q, logger %q", e.Origin, e.Logger)
	}

	// The host's own file behind a symlink: the read is refused, the rest
	// of the log (the host's entries) still served.
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte(`{"time":"2026-01-01T00:00:00Z","level":"info","message":"host secret"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, code := runAsRoot(t, m, info, "rm -f /run/airlock/sandbox-log.jsonl.1 && ln -sf "+secret+" /run/airlock/sandbox-log.jsonl.1"); code != 0 {
		t.Fatalf("symlink: %s", out)
	}
	all, err := m.Logs(ctx, info.ID, sandbox.LogQuery{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range all {
		if strings.Contains(e.Message, "host secret") {
			t.Fatalf("the host's file was read through the sandbox's symlink: %+v", e)
		}
	}
	if !hasCmd(all, "ln -sf") {
		t.Fatal("a refused rotated file hid the current one")
	}
	// The kill stores what it can read, without the secret either.
	if err := m.Kill(ctx, info.ID); err != nil {
		t.Fatal(err)
	}
	all, err = m.Logs(ctx, info.ID, sandbox.LogQuery{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range all {
		if strings.Contains(e.Message, "host secret") {
			t.Fatalf("the host's file was kept at kill: %+v", e)
		}
	}
}

// TestSandboxLogOnGVisor: envd writes the log through gVisor's gofer into
// the same run dir, and it survives a checkpoint (the writer is suspended
// around it) and a restore.
func TestSandboxLogOnGVisor(t *testing.T) {
	r := newRig(t)
	testenv.NeedRunsc(t)
	gv, err := gvisor.New(filepath.Join(r.dataDir, "runtime-gvisor"), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	m := sandbox.New(sandbox.Options{
		Runtime: r.rt, Runtimes: []runtime.Runtime{gv}, Store: r.db, Templates: twoRuntimes{r.tpl},
		DataDir: r.dataDir, EnvdPath: r.envd, MaxTimeout: time.Hour,
	})
	m.Start()
	t.Cleanup(func() {
		m.KillAll(ctx)
		m.Close()
	})
	info, err := m.Create(ctx, sandbox.CreateRequest{Template: "base-gvisor", Timeout: time.Minute, Secure: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, code := run(t, m, info, "exit 7"); code != 7 {
		t.Fatalf("exit code %d", code)
	}
	findLog(t, m, info.ID, sandbox.LogQuery{}, "of exit code 7", func(e sandbox.LogEntry) bool { return e.Fields["exitCode"] == "7" })
	if err := m.Pause(ctx, info.ID, sandbox.PauseOptions{}); err != nil {
		t.Fatal(err)
	}
	if info, _, err = m.Connect(ctx, info.ID, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, code := run(t, m, info, "exit 8"); code != 8 {
		t.Fatalf("exit code %d", code)
	}
	findLog(t, m, info.ID, sandbox.LogQuery{}, "of exit code 8 after the restore", func(e sandbox.LogEntry) bool { return e.Fields["exitCode"] == "8" })
	findLog(t, m, info.ID, sandbox.LogQuery{}, "of exit code 7 after the restore", func(e sandbox.LogEntry) bool { return e.Fields["exitCode"] == "7" })
}

// sweepCounter is the test's SQLite store, counting log sweeps.
type sweepCounter struct {
	*store.SQLite
	sweeps atomic.Int32
}

func (s *sweepCounter) SweepLogs(ctx context.Context, before time.Time) (int, error) {
	s.sweeps.Add(1)
	return s.SQLite.SweepLogs(ctx, before)
}

// TestLogSweepsThrottled: kills sweep the store's old logs at most once per
// minute (a sweep reads the whole log table: one per kill made killing a
// thousand sandboxes quadratic), and with a retention shorter than that, at
// most every quarter of it.
func TestLogSweepsThrottled(t *testing.T) {
	r := newRig(t)
	for _, c := range []struct {
		retention time.Duration
		pause     time.Duration // between kills
		want      int32
	}{
		{0, 0, 1},               // the default, 7 days: once per minute
		{4 * time.Second, 0, 1}, // every second at most
		{400 * time.Millisecond, 150 * time.Millisecond, 3}, // kills further apart than that
	} {
		counter := &sweepCounter{SQLite: r.db}
		m := sandbox.New(sandbox.Options{
			Runtime: r.rt, Store: counter, Templates: r, DataDir: r.dataDir, EnvdPath: r.envd,
			MaxTimeout: time.Hour, LogRetention: c.retention,
		})
		m.Start()
		ctx := context.Background()
		var ids []string
		for range 3 {
			info, err := m.Create(ctx, sandbox.CreateRequest{Template: "base", Timeout: time.Minute, Owner: "o"})
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, info.ID)
		}
		for _, id := range ids {
			if err := m.Kill(ctx, id); err != nil {
				t.Fatal(err)
			}
			time.Sleep(c.pause)
		}
		m.KillAll(ctx)
		m.Close() // waits for the background sweeps
		if got := counter.sweeps.Load(); got != c.want {
			t.Errorf("retention %v, kills %v apart: %d sweeps, want %d", c.retention, c.pause, got, c.want)
		}
	}
}
