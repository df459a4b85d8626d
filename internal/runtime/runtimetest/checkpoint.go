package runtimetest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/mountutil"
	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// counterMarker is in the counter's script and nowhere else, so that a
// process listing inside a sandbox tells whether a counter runs there.
const counterMarker = "airlock-counter"

// counter is the first process of the checkpoint tests: a shell that counts,
// appends each number through a descriptor opened once (fd 3, on a file of
// the writable layer), marks each step with a file of its own, and after each
// step reports, atomically in /out/state, what the kernel says of it: its pid
// (/proc/self read by the shell itself), its working directory and fd 3
// (through /proc), how many lines the file holds, whether it was poked (a
// write the host asks for through /out/poke), how many times it started, the
// first step whose file was there before the step (the writable layer ahead
// of the counter's memory), and the boot id. With a writable layer of the same instant
// as the memory, lines == i at every report and no step is ahead; a layer
// copied before the image has fewer lines, one copied after it steps ahead.
const counter = `# ` + counterMarker + `
exec </dev/null >>/root/init.out 2>&1
mkdir -p /root/work /root/steps && cd /root/work
echo start >> /root/starts
cat /proc/sys/kernel/random/boot_id > /out/bootid
exec 3>>/root/held
i=0
ahead=-
while :; do
  i=$((i+1))
  if [ "$ahead" = - ] && [ -e /root/steps/$i ]; then ahead=$i; fi
  : > /root/steps/$i
  echo $i >&3
  if [ -e /out/poke ]; then echo poked > /root/poked; rm -f /out/poke; fi
  read -r pid rest < /proc/self/stat
  read -r boot < /proc/sys/kernel/random/boot_id
  printf '%s %s %s %s %s %s %s %s %s\n' "$i" "$pid" "$(readlink /proc/$pid/cwd)" "$(readlink /proc/$pid/fd/3)" \
    "$(wc -l < /root/held)" "$(cat /root/poked 2>/dev/null || echo -)" "$(wc -l < /root/starts)" "$ahead" "$boot" > /out/state.tmp
  mv /out/state.tmp /out/state
  sleep 0.2
done
`

// counterState is one report of the counter.
type counterState struct {
	I      int
	Pid    string
	Cwd    string
	FD3    string
	Lines  int
	Poked  string
	Starts int
	Ahead  string
	BootID string
}

func (s counterState) String() string {
	return fmt.Sprintf("i=%d pid=%s cwd=%s fd3=%s lines=%d poked=%s starts=%d ahead=%s boot_id=%s", s.I, s.Pid, s.Cwd, s.FD3, s.Lines, s.Poked, s.Starts, s.Ahead, s.BootID)
}

// readCounter returns the counter's last report in out, if there is one.
func readCounter(out string) (counterState, bool) {
	b, err := os.ReadFile(filepath.Join(out, "state"))
	if err != nil {
		return counterState{}, false
	}
	f := strings.Fields(string(b))
	if len(f) != 9 {
		return counterState{}, false
	}
	var s counterState
	var errs [3]error
	s.I, errs[0] = strconv.Atoi(f[0])
	s.Lines, errs[1] = strconv.Atoi(f[4])
	s.Starts, errs[2] = strconv.Atoi(f[6])
	s.Pid, s.Cwd, s.FD3, s.Poked, s.Ahead, s.BootID = f[1], f[2], f[3], f[5], f[7], f[8]
	return s, errors.Join(errs[:]...) == nil
}

// waitCounter waits until the counter in out has reported a number above
// after, and returns that report.
func waitCounter(t *testing.T, out string, after int) counterState {
	t.Helper()
	var s counterState
	testenv.Eventually(t, 60*time.Second, fmt.Sprintf("the counter in %s to pass %d", out, after), func() bool {
		var ok bool
		s, ok = readCounter(out)
		return ok && s.I > after
	})
	return s
}

// checkIntact checks a counter report taken after a restore against one taken
// before the checkpoint: same process, same working directory and fd 3, same
// boot, one start, and a writable layer that agrees with the counter's memory.
func checkIntact(t *testing.T, what string, before, after counterState) {
	t.Helper()
	if after.Pid != before.Pid {
		t.Errorf("%s: the counter's pid is %s inside, was %s", what, after.Pid, before.Pid)
	}
	if after.Cwd != "/root/work" {
		t.Errorf("%s: the counter's cwd is %q, want /root/work", what, after.Cwd)
	}
	if after.FD3 != "/root/held" {
		t.Errorf("%s: the counter's fd 3 is %q, want /root/held", what, after.FD3)
	}
	if after.BootID != before.BootID {
		t.Errorf("%s: the boot id is %s, was %s: a restore is not a boot", what, after.BootID, before.BootID)
	}
	if after.Starts != 1 {
		t.Errorf("%s: the counter started %d times; a restore must not rerun it", what, after.Starts)
	}
	if after.Lines != after.I || after.Ahead != "-" {
		t.Errorf("%s: the writable layer and the counter's memory are not of one instant: %v", what, after)
	}
}

// counterSpec is a spec whose first process is the counter, with its own
// directory bound at /out.
func counterSpec(t *testing.T, h Harness) (runtime.Spec, string) {
	t.Helper()
	spec, out := newSpec(t, h)
	spec.Init.Args = []string{"/bin/sh", "-c", counter}
	spec.Init.Stdin = nil
	return spec, out
}

// forkSpec is a spec for a restore of from's image into a new sandbox: a new
// id, Dir (not created: the caller copies the original's there), /out source
// and log, and everything the image fixes (Lower, Init, mount targets) as
// from's.
func forkSpec(t *testing.T, h Harness, from runtime.Spec) (runtime.Spec, string) {
	t.Helper()
	spec, out := newSpec(t, h)
	logPath := spec.Init.LogPath
	spec.Init = from.Init
	spec.Init.LogPath = logPath
	spec.Resources = from.Resources
	return spec, out
}

// copyDir copies a sandbox directory as a snapshot would: reflinked where the
// filesystem can, and without descending into mounts (a running sandbox's
// root overlay is mounted under its Dir).
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	if out, err := exec.Command("cp", "-a", "-x", "--reflink=auto", src, dst).CombinedOutput(); err != nil {
		t.Fatalf("copy %s to %s: %v: %s", src, dst, err, out)
	}
}

func checkpointer(t *testing.T, sb runtime.Sandbox) runtime.Checkpointer {
	t.Helper()
	c, ok := sb.(runtime.Checkpointer)
	if !ok {
		t.Fatalf("%T does not implement runtime.Checkpointer (set Harness.NoCheckpoint for a backend that cannot)", sb)
	}
	return c
}

func restorer(t *testing.T, r runtime.Runtime) runtime.Restorer {
	t.Helper()
	rs, ok := r.(runtime.Restorer)
	if !ok {
		t.Fatalf("%T does not implement runtime.Restorer (set Harness.NoCheckpoint for a backend that cannot)", r)
	}
	return rs
}

// restore restores spec from img and destroys the sandbox at the test's end.
func restore(t *testing.T, r runtime.Runtime, spec runtime.Spec, img string) runtime.Sandbox {
	t.Helper()
	sb, err := restorer(t, r).Restore(context.Background(), spec, img)
	if err != nil {
		t.Fatalf("Restore %s: %v", spec.ID, err)
	}
	t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
	return sb
}

// checkReleased checks that nothing of a released sandbox is left on the host
// but its directory.
func checkReleased(t *testing.T, r runtime.Runtime, spec runtime.Spec) {
	t.Helper()
	if _, err := os.Stat(spec.Dir); err != nil {
		t.Errorf("Release removed Dir: %v", err)
	}
	if m := mountutil.MountedUnder(spec.Dir); len(m) > 0 {
		t.Errorf("mounts under Dir after Release: %v", m)
	}
	if ids, _ := r.List(); contains(ids, spec.ID) {
		t.Errorf("List still has %s after Release", spec.ID)
	}
}

// testCheckpoint is the Checkpointer and Restorer contract (runtime.go): pause
// to disk and back, fork, concurrent restores from one image, a pause that
// keeps only the files, a failed checkpoint, and teardown after Release.
func testCheckpoint(t *testing.T, h Harness) {
	if h.NoCheckpoint {
		t.Skip("the harness says the backend does not checkpoint (NoCheckpoint)")
	}
	restorer(t, h.New(t))
	t.Run("RestoreKeepsProcesses", func(t *testing.T) { testRestoreKeepsProcesses(t, h) })
	t.Run("LeaveRunningFork", func(t *testing.T) { testLeaveRunningFork(t, h) })
	t.Run("ConcurrentRestoresReadOnlyImage", func(t *testing.T) { testConcurrentRestores(t, h) })
	t.Run("ReleaseThenCreateKeepsFiles", func(t *testing.T) { testReleaseThenCreate(t, h) })
	t.Run("FailedCheckpointLeavesRunning", func(t *testing.T) { testCheckpointFails(t, h) })
	t.Run("DestroyAfterRelease", func(t *testing.T) { testDestroyAfterRelease(t, h) })
	t.Run("CheckpointInNetwork", func(t *testing.T) { testCheckpointInNetwork(t, h) })
}

// testRestoreKeepsProcesses: Checkpoint, Release and Restore with the same
// Spec (the same Dir): the counter goes on from where it was, as the same
// process with the same working directory and open file.
func testRestoreKeepsProcesses(t *testing.T, h Harness) {
	r := h.New(t)
	spec, out := counterSpec(t, h)
	sb := create(t, r, spec)
	before := waitCounter(t, out, 2)
	// A backend that says up front whether it can checkpoint a sandbox
	// must not refuse the one it is about to checkpoint.
	if c, ok := sb.(runtime.CheckpointChecker); ok {
		if err := c.CanCheckpoint(); err != nil {
			t.Fatalf("CanCheckpoint of a sandbox in its own network namespace: %v", err)
		}
	}
	img := filepath.Join(t.TempDir(), "image")
	if err := checkpointer(t, sb).Checkpoint(context.Background(), runtime.CheckpointOptions{ImageDir: img}); err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	// Only its owner may list or read it (the linux runtime lets any uid
	// search it: CRIU opens images by fd as a not yet mapped uid).
	if fi, err := os.Stat(img); err != nil || !fi.IsDir() || fi.Mode().Perm()&0o066 != 0 {
		t.Errorf("image dir: %v, %v; want a directory no one but its owner can list or read", fi, err)
	}
	if st, err := sb.Status(); err != nil || st != runtime.StatusStopped {
		t.Errorf("Status after Checkpoint = %v, %v; want stopped", st, err)
	}
	at, ok := readCounter(out)
	if !ok {
		t.Fatal("no counter report")
	}
	if err := checkpointer(t, sb).Release(context.Background()); err != nil {
		t.Fatalf("Release: %v", err)
	}
	checkReleased(t, r, spec)

	restored := restore(t, r, spec, img)
	after := waitCounter(t, out, at.I)
	checkIntact(t, "restored", before, after)
	if st, err := restored.Status(); err != nil || st != runtime.StatusRunning {
		t.Errorf("Status after Restore = %v, %v; want running", st, err)
	}
	if err := restored.Destroy(context.Background()); err != nil {
		t.Fatalf("Destroy of the restored sandbox: %v", err)
	}
	if _, err := os.Stat(spec.Dir); !os.IsNotExist(err) {
		t.Errorf("Dir survived Destroy of the restored sandbox (err=%v)", err)
	}
}

// testLeaveRunningFork: a fork as the manager makes it (Pause, Checkpoint with
// LeaveRunning, copy of Dir, Resume, then Restore into a new id, Dir and /out):
// both run on, each with its own writable layer.
func testLeaveRunningFork(t *testing.T, h Harness) {
	r := h.New(t)
	spec, out := counterSpec(t, h)
	sb := create(t, r, spec)
	before := waitCounter(t, out, 2)

	fork, forkOut := forkSpec(t, h, spec)
	img := filepath.Join(t.TempDir(), "image")
	if err := sb.Pause(); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if err := checkpointer(t, sb).Checkpoint(context.Background(), runtime.CheckpointOptions{ImageDir: img, LeaveRunning: true}); err != nil {
		t.Fatalf("Checkpoint LeaveRunning: %v", err)
	}
	copyDir(t, spec.Dir, fork.Dir)
	at, _ := readCounter(out)
	if err := sb.Resume(); err != nil {
		t.Fatalf("Resume after the checkpoint: %v", err)
	}
	if st, err := sb.Status(); err != nil || st != runtime.StatusRunning {
		t.Fatalf("Status of the original after Checkpoint LeaveRunning = %v, %v; want running", st, err)
	}

	forked := restore(t, r, fork, img)
	origAfter := waitCounter(t, out, at.I)
	forkAfter := waitCounter(t, forkOut, at.I)
	checkIntact(t, "original", before, origAfter)
	checkIntact(t, "fork", before, forkAfter)

	// A write in the original is not seen in the fork.
	if err := os.WriteFile(filepath.Join(out, "poke"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "the original to record the poke", func() bool {
		s, ok := readCounter(out)
		return ok && s.Poked == "poked"
	})
	seen, _ := readCounter(forkOut)
	forkLater := waitCounter(t, forkOut, seen.I+1)
	if forkLater.Poked != "-" {
		t.Errorf("the fork sees the original's write (/root/poked = %q)", forkLater.Poked)
	}
	if st, err := forked.Status(); err != nil || st != runtime.StatusRunning {
		t.Errorf("Status of the fork = %v, %v; want running", st, err)
	}
	if st, err := sb.Status(); err != nil || st != runtime.StatusRunning {
		t.Errorf("Status of the original = %v, %v; want running", st, err)
	}
}

// testConcurrentRestores: two restores at once from one image, which is
// mounted read-only for them: the contract says Restore only reads it.
func testConcurrentRestores(t *testing.T, h Harness) {
	r := h.New(t)
	spec, out := counterSpec(t, h)
	sb := create(t, r, spec)
	before := waitCounter(t, out, 2)
	img := filepath.Join(t.TempDir(), "image")
	if err := checkpointer(t, sb).Checkpoint(context.Background(), runtime.CheckpointOptions{ImageDir: img}); err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	at, _ := readCounter(out)
	if err := checkpointer(t, sb).Release(context.Background()); err != nil {
		t.Fatalf("Release: %v", err)
	}
	ro := readOnlyView(t, img)

	var specs [2]runtime.Spec
	var outs [2]string
	for i := range specs {
		specs[i], outs[i] = forkSpec(t, h, spec)
		copyDir(t, spec.Dir, specs[i].Dir)
	}
	rs := restorer(t, r)
	var (
		wg   sync.WaitGroup
		sbs  [2]runtime.Sandbox
		errs [2]error
	)
	for i := range specs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sbs[i], errs[i] = rs.Restore(context.Background(), specs[i], ro)
		}()
	}
	wg.Wait()
	for i := range sbs {
		if sbs[i] != nil {
			t.Cleanup(func() { _ = sbs[i].Destroy(context.Background()) })
		}
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Restore %d of 2 from a read-only image: %v", i+1, err)
		}
	}
	for i := range outs {
		checkIntact(t, fmt.Sprintf("restore %d", i+1), before, waitCounter(t, outs[i], at.I))
	}
}

// readOnlyView bind-mounts dir read-only at a new path, unmounted at the
// test's end.
func readOnlyView(t *testing.T, dir string) string {
	t.Helper()
	ro := filepath.Join(t.TempDir(), "ro")
	if err := os.Mkdir(ro, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(dir, ro, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind %s: %v", dir, err)
	}
	t.Cleanup(func() { _ = unix.Unmount(ro, unix.MNT_DETACH) })
	if err := unix.Mount("", ro, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		t.Fatalf("remount %s read-only: %v", ro, err)
	}
	return ro
}

// check reports, from a fresh sandbox on a Dir that held the counter, what is
// left of it: the lines of its file, its starts, whether a process of the
// counter runs, and the boot id.
const check = `
echo "$(wc -l < /root/held) $(wc -l < /root/starts)" > /out/files
cat /proc/[0-9]*/cmdline | tr '\0' ' ' > /out/procs
cat /proc/sys/kernel/random/boot_id > /out/bootid2
touch /out/done
exec sleep 100000
`

// testReleaseThenCreate: a pause without memory. Release of a running sandbox
// then Create on the same Dir boots afresh: the files are there, the
// processes are not. A Create that fails on such a Dir keeps the files.
func testReleaseThenCreate(t *testing.T, h Harness) {
	r := h.New(t)
	spec, out := counterSpec(t, h)
	sb := create(t, r, spec)
	waitCounter(t, out, 2)
	if err := checkpointer(t, sb).Release(context.Background()); err != nil {
		t.Fatalf("Release of a running sandbox: %v", err)
	}
	at, _ := readCounter(out)
	checkReleased(t, r, spec)

	bad := spec
	bad.Init.Args = []string{"/no/such/binary"}
	if sb, err := r.Create(context.Background(), bad); err == nil {
		_ = sb.Destroy(context.Background())
		t.Fatal("Create with a missing init binary succeeded")
	}

	again := spec
	again.Init.Args = []string{"/bin/sh", "-c", check}
	create(t, r, again)
	waitFile(t, filepath.Join(out, "done"))
	var lines, starts int
	if _, err := fmt.Sscan(read(t, out, "files"), &lines, &starts); err != nil {
		t.Fatalf("files report: %v", err)
	}
	if lines < at.I || starts != 1 {
		t.Errorf("after Release and Create on the same Dir (also after a failed Create), /root/held has %d lines and /root/starts %d; want >= %d and 1", lines, starts, at.I)
	}
	if procs := read(t, out, "procs"); strings.Contains(procs, counterMarker) {
		t.Errorf("the released sandbox's counter runs in the new one: %s", procs)
	}
	// A Create on a released sandbox's files is a boot, a Restore is not
	// (checkIntact): a new boot id, whatever the kernel's is.
	if before, after := read(t, out, "bootid"), read(t, out, "bootid2"); before == "" || before == after {
		t.Errorf("boot_id before Release %q, after Create on the same Dir %q: want a new one", before, after)
	}
}

// testCheckpointFails: a Checkpoint that cannot write its image fails and
// leaves the sandbox running, and a later one succeeds.
func testCheckpointFails(t *testing.T, h Harness) {
	r := h.New(t)
	spec, out := counterSpec(t, h)
	sb := create(t, r, spec)
	waitCounter(t, out, 2)
	c := checkpointer(t, sb)
	base := t.TempDir()
	nonEmpty := filepath.Join(base, "nonempty")
	if err := os.Mkdir(nonEmpty, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(nonEmpty, "keep"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, img := range []string{filepath.Join(base, "no", "such", "parent"), nonEmpty} {
		if err := c.Checkpoint(context.Background(), runtime.CheckpointOptions{ImageDir: img}); err == nil {
			t.Fatalf("Checkpoint into %s succeeded", img)
		}
		if st, err := sb.Status(); err != nil || st != runtime.StatusRunning {
			t.Fatalf("Status after a failed Checkpoint into %s = %v, %v; want running", img, st, err)
		}
		s, _ := readCounter(out)
		waitCounter(t, out, s.I)
	}
	if b, err := os.ReadFile(filepath.Join(nonEmpty, "keep")); err != nil || string(b) != "x" {
		t.Errorf("a failed Checkpoint touched what was in the non-empty ImageDir: %q, %v", b, err)
	}
	if err := c.Checkpoint(context.Background(), runtime.CheckpointOptions{ImageDir: filepath.Join(base, "good"), LeaveRunning: true}); err != nil {
		t.Fatalf("Checkpoint after failed ones: %v", err)
	}
	s, _ := readCounter(out)
	waitCounter(t, out, s.I)
}

// testDestroyAfterRelease: after Checkpoint and Release only Dir is left, and
// Destroy removes it; nothing the backend holds names the sandbox.
func testDestroyAfterRelease(t *testing.T, h Harness) {
	r := h.New(t)
	spec, out := counterSpec(t, h)
	sb := create(t, r, spec)
	waitCounter(t, out, 2)
	c := checkpointer(t, sb)
	if err := c.Checkpoint(context.Background(), runtime.CheckpointOptions{ImageDir: filepath.Join(t.TempDir(), "image")}); err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	if err := c.Release(context.Background()); err != nil {
		t.Fatalf("Release: %v", err)
	}
	checkReleased(t, r, spec)
	if _, err := r.Load(spec.ID); err == nil {
		t.Errorf("Load after Release succeeded; want not found")
	}
	if err := sb.Destroy(context.Background()); err != nil {
		t.Fatalf("Destroy after Release: %v", err)
	}
	if _, err := os.Stat(spec.Dir); !os.IsNotExist(err) {
		t.Errorf("Dir %s survived Destroy after Release (err=%v)", spec.Dir, err)
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), spec.Dir) || strings.Contains(string(mounts), spec.ID) {
		t.Errorf("a mount of %s survived Destroy after Release", spec.ID)
	}
	if ids, _ := r.List(); contains(ids, spec.ID) {
		t.Errorf("List has %s after Destroy", spec.ID)
	}
	if err := sb.Destroy(context.Background()); err != nil {
		t.Errorf("a second Destroy must be a no-op, got %v", err)
	}
}
