package template

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"golang.org/x/sys/unix"
)

// These tests drive the store with stand-in debootstrap and chroot scripts placed first
// on PATH, so they run in milliseconds without a network and can fail or hang on cue.
// The real tools are exercised by TestBuildBase (AIRLOCK_TEST_BUILD=1).

// fakeDebootstrap behaves per $FAKE_MODE: "ok" makes a tiny rootfs, "fail" prints some
// progress and a detailed log and exits 1, "hang" starts a child and sleeps until killed.
// Each run appends a line to $FAKE_RUNS.
const fakeDebootstrap = `#!/bin/sh
target=$(eval echo \${$(($# - 1))})
echo run >> "$FAKE_RUNS"
echo "I: Retrieving InRelease "
echo "I: Resolving dependencies of required packages..."
echo "I: Retrieving bash 5.2"
echo "I: Validating bash 5.2"
mkdir -p "$target/bin" "$target/etc" "$target/debootstrap"
echo "I: Extracting bash..."
case "$FAKE_MODE" in
fail)
	echo "dpkg: error processing package bash (--configure): boom" > "$target/debootstrap/debootstrap.log"
	echo "I: Unpacking bash..."
	echo "W: Failure trying to run: chroot $target dpkg --configure bash" >&2
	exit 1 ;;
hang)
	sleep 300 &
	echo $! > "$FAKE_PIDS"
	echo "I: Configuring bash..."
	wait
	exit 0 ;;
esac
[ -n "$FAKE_SLEEP" ] && sleep "$FAKE_SLEEP"
echo "I: Unpacking bash..."
echo "I: Configuring bash:amd64..."
rm -r "$target/debootstrap"
echo hello > "$target/etc/motd"
echo "I: Base system installed successfully."
`

// fakeChroot records each step's script in the rootfs instead of running it there.
const fakeChroot = `#!/bin/sh
root=$1
printf '%s\n--\n' "$4" >> "$root/steps.log"
echo "step output"
`

func testDefs(steps ...string) fstest.MapFS {
	var s []string
	for i, run := range steps {
		s = append(s, fmt.Sprintf(`{"name": "step%d", "run": [%q]}`, i+1, run))
	}
	def := fmt.Sprintf(`{"name": "tiny",
	  "from": {"debootstrap": {"suite": "bookworm", "variant": "minbase", "include": ["bash"]}},
	  "steps": [%s],
	  "settings": {"cpuCount": 1, "memoryMB": 128, "diskSizeMB": 256, "defaultUser": "user"}}`, strings.Join(s, ","))
	return fstest.MapFS{"tiny/template.json": {Data: []byte(def)}}
}

type fakeEnv struct {
	data string
	runs string
	pids string
}

func setupFake(t *testing.T, mode string) *fakeEnv {
	t.Helper()
	bin := t.TempDir()
	for name, body := range map[string]string{"debootstrap": fakeDebootstrap, "chroot": fakeChroot} {
		if err := os.WriteFile(filepath.Join(bin, name), []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", bin+string(filepath.ListSeparator)+os.Getenv("PATH"))
	f := &fakeEnv{data: t.TempDir(), runs: filepath.Join(bin, "runs"), pids: filepath.Join(bin, "pids")}
	t.Setenv("FAKE_MODE", mode)
	t.Setenv("FAKE_RUNS", f.runs)
	t.Setenv("FAKE_PIDS", f.pids)
	t.Setenv("FAKE_SLEEP", "")
	return f
}

func (f *fakeEnv) store(t *testing.T, defs fstest.MapFS) *Store {
	t.Helper()
	s, err := Open(Options{DataDir: f.data, Mirror: "http://mirror.invalid/debian", Definitions: defs})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (f *fakeEnv) runCount(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile(f.runs)
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "run\n")
}

// entries lists DataDir/templates/tiny, to check what a build left behind.
func (f *fakeEnv) entries(t *testing.T) []string {
	t.Helper()
	es, err := os.ReadDir(filepath.Join(f.data, "templates", "tiny"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

func TestEnsureBuildsOnceAndCaches(t *testing.T) {
	f := setupFake(t, "ok")
	s := f.store(t, testDefs("echo one", "echo two"))

	if _, err := s.Get("tiny"); !errors.Is(err, ErrNotBuilt) {
		t.Fatalf("Get before build: %v, want ErrNotBuilt", err)
	}
	if _, err := s.Get("nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get(nope): %v, want ErrNotFound", err)
	}
	list, err := s.List()
	if err != nil || len(list) != 1 || list[0].Ready || list[0].ID != "tiny" {
		t.Fatalf("List before build = %+v, %v", list, err)
	}

	var out strings.Builder
	tmpl, err := s.Ensure(context.Background(), "tiny", &out)
	if err != nil {
		t.Fatal(err)
	}
	def, _ := s.Definition("tiny")
	key := def.Key()
	wantRoot := filepath.Join(f.data, "templates", "tiny", key, "rootfs")
	if tmpl.RootFS != wantRoot || !tmpl.Ready || tmpl.ID != "tiny" || tmpl.Alias != "tiny" || tmpl.Key != key ||
		tmpl.Settings.MemoryMB != 128 || tmpl.Settings.DefaultUser != "user" || tmpl.BuiltAt.IsZero() {
		t.Errorf("Ensure = %+v", tmpl)
	}
	if b, err := os.ReadFile(filepath.Join(wantRoot, "etc/motd")); err != nil || string(b) != "hello\n" {
		t.Errorf("rootfs content: %q, %v", b, err)
	}
	steps, _ := os.ReadFile(filepath.Join(wantRoot, "steps.log"))
	if string(steps) != "echo one\n--\necho two\n--\n" {
		t.Errorf("steps ran as %q", steps)
	}
	log, _ := os.ReadFile(filepath.Join(wantRoot, "..", "build.log"))
	for _, want := range []string{"+ debootstrap --variant=minbase --include=bash bookworm ", " http://mirror.invalid/debian\n", "I: Retrieving bash 5.2", "+ step 2/2: step2", "step output"} {
		if !strings.Contains(string(log), want) {
			t.Errorf("build.log lacks %q:\n%s", want, log)
		}
	}
	if got := f.entries(t); strings.Join(got, " ") != ".lock "+key {
		t.Errorf("template dir holds %v, want only .lock and %s", got, key)
	}
	if !strings.Contains(out.String(), "tiny: ready in ") {
		t.Errorf("progress output lacks the ready line:\n%s", out.String())
	}

	// Cached: neither Ensure nor a fresh Store builds again.
	if _, err := s.Ensure(context.Background(), "tiny", nil); err != nil {
		t.Fatal(err)
	}
	s2 := f.store(t, testDefs("echo one", "echo two"))
	if got, err := s2.Get("tiny"); err != nil || got.RootFS != wantRoot {
		t.Errorf("Get from a new store = %+v, %v", got, err)
	}
	if _, err := s2.Ensure(context.Background(), "tiny", nil); err != nil {
		t.Fatal(err)
	}
	if n := f.runCount(t); n != 1 {
		t.Errorf("debootstrap ran %d times, want 1", n)
	}
}

func TestEnsureFailureLeavesNothing(t *testing.T) {
	f := setupFake(t, "fail")
	s := f.store(t, testDefs("true"))
	_, err := s.Ensure(context.Background(), "tiny", nil)
	var be *BuildError
	if !errors.As(err, &be) {
		t.Fatalf("err = %v, want a *BuildError", err)
	}
	msg := err.Error()
	for _, want := range []string{"exit status 1", "I: Unpacking bash...", "W: Failure trying to run", "dpkg: error processing package bash", "full log: "} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q:\n%s", want, msg)
		}
	}
	key := be.Key
	if got := f.entries(t); strings.Join(got, " ") != ".lock "+key+".failed.log" {
		t.Errorf("template dir holds %v after a failed build, want only .lock and the failed log", got)
	}
	if log, _ := os.ReadFile(be.Log); !strings.Contains(string(log), "boom") {
		t.Errorf("failed log %s lacks debootstrap.log's content:\n%s", be.Log, log)
	}
	if _, err := s.Get("tiny"); !errors.Is(err, ErrNotBuilt) {
		t.Errorf("Get after failure: %v, want ErrNotBuilt", err)
	}

	// The next successful build replaces the failed log.
	t.Setenv("FAKE_MODE", "ok")
	if _, err := s.Ensure(context.Background(), "tiny", nil); err != nil {
		t.Fatal(err)
	}
	if got := f.entries(t); strings.Join(got, " ") != ".lock "+key {
		t.Errorf("after a good build: %v", got)
	}
}

func TestEnsureCancelKillsBuildAndCleansUp(t *testing.T) {
	f := setupFake(t, "hang")
	s := f.store(t, testDefs("true"))
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := s.Ensure(ctx, "tiny", nil)
		errc <- err
	}()
	pid := waitForPid(t, f.pids)
	if _, err := s.Get("tiny"); err == nil || !strings.Contains(err.Error(), "still being built") {
		t.Errorf("Get during build: %v", err)
	}
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Ensure did not return after cancel")
	}
	// The last waiter returns after cleanup, so this is already true, not eventually.
	if got := f.entries(t); strings.Join(got, " ") != ".lock" {
		t.Errorf("template dir holds %v after cancel", got)
	}
	if alive(pid) {
		t.Errorf("debootstrap's child %d survived the cancel", pid)
	}
}

func TestConcurrentEnsureBuildsOnce(t *testing.T) {
	f := setupFake(t, "ok")
	t.Setenv("FAKE_SLEEP", "0.3")
	defs := testDefs("true")
	// Two stores on one data dir stand for two processes: they share only the lock file.
	stores := []*Store{f.store(t, defs), f.store(t, defs)}
	var wg sync.WaitGroup
	roots := make([]string, 8)
	errs := make([]error, 8)
	for i := range roots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tmpl, err := stores[i%2].Ensure(context.Background(), "tiny", nil)
			roots[i], errs[i] = tmpl.RootFS, err
		}()
	}
	wg.Wait()
	for i := range roots {
		if errs[i] != nil || roots[i] != roots[0] {
			t.Errorf("caller %d: %q, %v", i, roots[i], errs[i])
		}
	}
	if n := f.runCount(t); n != 1 {
		t.Errorf("debootstrap ran %d times, want 1", n)
	}
}

func TestNewDefinitionReplacesOldBuild(t *testing.T) {
	f := setupFake(t, "ok")
	old, err := f.store(t, testDefs("echo v1")).Ensure(context.Background(), "tiny", nil)
	if err != nil {
		t.Fatal(err)
	}
	// A stale temporary directory from a crashed build is cleaned by the next build.
	stale := filepath.Join(f.data, "templates", "tiny", ".build-0000-123")
	if err := os.MkdirAll(filepath.Join(stale, "rootfs", "etc"), 0o755); err != nil {
		t.Fatal(err)
	}

	// While the old rootfs is in use, it stays.
	var asked []string
	inUse := func(rootfs string) bool { asked = append(asked, rootfs); return true }
	s2, err := Open(Options{DataDir: f.data, Mirror: "http://m/debian", Definitions: testDefs("echo v2"), InUse: inUse})
	if err != nil {
		t.Fatal(err)
	}
	v2, err := s2.Ensure(context.Background(), "tiny", nil)
	if err != nil {
		t.Fatal(err)
	}
	if v2.Key == old.Key {
		t.Fatal("a changed step kept the key")
	}
	if len(asked) != 1 || asked[0] != old.RootFS {
		t.Errorf("InUse asked about %v, want [%s]", asked, old.RootFS)
	}
	want := []string{".lock", old.Key, v2.Key}
	slices.Sort(want)
	if got := f.entries(t); !slices.Equal(got, want) {
		t.Errorf("with the old build in use: %v", got)
	}

	// Once nothing uses it, the next new build removes it.
	v3, err := f.store(t, testDefs("echo v3")).Ensure(context.Background(), "tiny", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := f.entries(t); strings.Join(got, " ") != ".lock "+v3.Key {
		t.Errorf("after v3: %v, want only .lock and %s", got, v3.Key)
	}
}

func waitForPid(t *testing.T, path string) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(path); err == nil && strings.HasSuffix(string(b), "\n") {
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err == nil {
				return pid
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("the fake debootstrap never started its child")
	return 0
}

// alive reports whether pid runs. A killed orphan stays a zombie until init reaps it,
// which on some hosts takes seconds; a zombie runs nothing, so it counts as dead.
func alive(pid int) bool {
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the ")" that ends the command name.
	i := strings.LastIndexByte(string(st), ')')
	return i < 0 || i+2 >= len(st) || st[i+2] != 'Z'
}

// A superseded build that is the lower layer of a mounted overlay (a running sandbox)
// must survive the next build even when nobody passed an InUse hook.
func TestSupersededBuildUnderOverlayIsKept(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting an overlay needs root")
	}
	f := setupFake(t, "ok")
	old, err := f.store(t, testDefs("echo v1")).Ensure(context.Background(), "tiny", nil)
	if err != nil {
		t.Fatal(err)
	}
	sb := t.TempDir()
	for _, d := range []string{"upper", "work", "merged"} {
		if err := os.Mkdir(filepath.Join(sb, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s/upper,workdir=%s/work", old.RootFS, sb, sb)
	merged := filepath.Join(sb, "merged")
	if err := unix.Mount("overlay", merged, "overlay", 0, opts); err != nil {
		t.Fatalf("mount overlay: %v", err)
	}
	mounted := true
	defer func() {
		if mounted {
			_ = unix.Unmount(merged, unix.MNT_DETACH)
		}
	}()

	v2, err := f.store(t, testDefs("echo v2")).Ensure(context.Background(), "tiny", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(old.RootFS, "etc/motd")); err != nil {
		t.Fatalf("the rootfs under a live overlay was removed: %v", err)
	}
	if err := unix.Unmount(merged, 0); err != nil {
		t.Fatal(err)
	}
	mounted = false
	v3, err := f.store(t, testDefs("echo v3")).Ensure(context.Background(), "tiny", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := f.entries(t); strings.Join(got, " ") != ".lock "+v3.Key {
		t.Errorf("after unmount and v3: %v (v2 %s), want only .lock and %s", got, v2.Key, v3.Key)
	}
}
