package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/api/gen/process"
	"github.com/airlock-sandbox/airlock/api/gen/process/processconnect"
	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/runtime/gvisor"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// webTemplate is the base template with a start command that serves HTTP and
// a ready command that succeeds once it does.
func webTemplate(tpl sandbox.Template) sandbox.Template {
	tpl.StartCmd = "python3 -m http.server 8000"
	tpl.ReadyCmd = "curl -sf -o /dev/null localhost:8000"
	tpl.ReadyTimeout = 30 * time.Second
	tpl.DefaultWorkdir = "/tmp"
	tpl.Env = []string{"GREETING=hello from the template", "FOO=template"}
	return tpl
}

// procs lists the sandbox's processes as commands.list does.
func procs(t *testing.T, m *sandbox.Manager, info sandbox.Info) []*process.ProcessInfo {
	t.Helper()
	tr, err := m.EnvdTransport(info.ID)
	if err != nil {
		t.Fatal(err)
	}
	c := processconnect.NewProcessClient(&http.Client{Transport: tr}, "http://envd")
	req := connect.NewRequest(&process.ListRequest{})
	req.Header().Set("X-Access-Token", info.AccessToken)
	resp, err := c.List(context.Background(), req)
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	return resp.Msg.GetProcesses()
}

// startCmdPid returns the pid of the sandbox's start command, failing unless
// the process list shows exactly one, as the template's shell command.
func startCmdPid(t *testing.T, m *sandbox.Manager, info sandbox.Info, cmd string) uint32 {
	t.Helper()
	var found []*process.ProcessInfo
	for _, p := range procs(t, m, info) {
		if p.GetTag() == sandbox.StartCmdTag {
			found = append(found, p)
		}
	}
	if len(found) != 1 {
		t.Fatalf("process list has %d processes tagged %q: %v", len(found), sandbox.StartCmdTag, found)
	}
	p := found[0]
	if got := p.GetConfig().GetCmd() + " " + strings.Join(p.GetConfig().GetArgs(), " "); got != "/bin/bash -l -c "+cmd {
		t.Fatalf("start command runs as %q", got)
	}
	return p.GetPid()
}

// checkWebSandbox checks a sandbox of webTemplate right after its create
// returned: it serves at once, its start command is listed and runs as the
// template's user in its workdir, and env is template env + client env.
// startSeesClientEnv tells whether the start command got the client's env
// (cold start) or only the template's (warm pool).
func checkWebSandbox(t *testing.T, m *sandbox.Manager, info sandbox.Info, startSeesClientEnv bool) {
	t.Helper()
	// No sleep, no retry: create returned, so it must already serve.
	if out, code := run(t, m, info, "curl -s -o /dev/null -w '%{http_code}' localhost:8000/"); out != "200" || code != 0 {
		t.Fatalf("right after create the start command does not serve: %q (exit %d)", out, code)
	}
	pid := startCmdPid(t, m, info, "python3 -m http.server 8000")
	out, _ := run(t, m, info, fmt.Sprintf(`stat -c %%U /proc/%d; readlink /proc/%d/cwd; tr '\0' '\n' < /proc/%d/environ | grep -E '^(GREETING|FOO)=' | sort`, pid, pid, pid))
	want := "user\n/tmp\nFOO=template\nGREETING=hello from the template\n"
	if startSeesClientEnv {
		want = "user\n/tmp\nFOO=bar\nGREETING=hello from the template\n"
	}
	if out != want {
		t.Fatalf("start command's user, cwd and env:\n%s\nwant\n%s", out, want)
	}
	if out, _ := run(t, m, info, `echo "$GREETING|$FOO"`); out != "hello from the template|bar\n" {
		t.Fatalf("commands see env %q, want the template's GREETING and the client's FOO", out)
	}
	if len(info.EnvVars) != 1 || info.EnvVars["FOO"] != "bar" {
		t.Fatalf("Info.EnvVars = %v, want only what the client sent", info.EnvVars)
	}
}

func TestStartCmdReadyBeforeCreateReturns(t *testing.T) {
	r := newRig(t)
	r.tpl = webTemplate(r.tpl)
	m := r.manager(t, 0)
	began := time.Now()
	info := create(t, m, time.Minute)
	t.Logf("cold create with start + ready command: %s", time.Since(began).Round(time.Millisecond))
	checkWebSandbox(t, m, info, true)
}

func TestStartCmdThroughWarmPool(t *testing.T) {
	r := newRig(t)
	r.tpl = webTemplate(r.tpl)
	m := r.manager(t, 0)
	m.SetWarmPool(r.tpl, 1)
	deadline := time.Now().Add(60 * time.Second)
	for m.WarmCount(r.tpl.ID) < 1 {
		if time.Now().After(deadline) {
			t.Fatal("warm pool did not fill")
		}
		time.Sleep(10 * time.Millisecond)
	}
	began := time.Now()
	info := create(t, m, time.Minute)
	t.Logf("create from the warm pool: %s", time.Since(began).Round(time.Millisecond))
	if m.WarmCount(r.tpl.ID) != 0 {
		t.Fatal("create did not take the pooled sandbox")
	}
	checkWebSandbox(t, m, info, false)
}

// idWatcher records the ids of sandboxes that exist while a create runs, so a
// test can check that a failed create left nothing of them behind.
type idWatcher struct {
	mu   sync.Mutex
	ids  map[string]bool
	stop chan struct{}
	done chan struct{}
}

func watchIDs(dataDir string) *idWatcher {
	w := &idWatcher{ids: map[string]bool{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			entries, _ := os.ReadDir(filepath.Join(dataDir, "sandboxes"))
			w.mu.Lock()
			for _, e := range entries {
				if e.IsDir() {
					w.ids[e.Name()] = true
				}
			}
			w.mu.Unlock()
			select {
			case <-w.stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	return w
}

func (w *idWatcher) result(t *testing.T) []string {
	t.Helper()
	close(w.stop)
	<-w.done
	var ids []string
	for id := range w.ids {
		ids = append(ids, id)
	}
	if len(ids) == 0 {
		t.Fatal("watcher saw no sandbox: the leak check would be blind")
	}
	return ids
}

// assertNothingLeft checks that the failed creates of ids left nothing: no
// store record, runtime sandbox, sandbox dir or log, mount, cgroup or process.
func assertNothingLeft(t *testing.T, r *rig, ids []string) {
	t.Helper()
	if recs, err := r.db.List(context.Background()); err != nil || len(recs) != 0 {
		t.Errorf("store holds %d records (%v)", len(recs), err)
	}
	if list, err := r.rt.List(); err != nil || len(list) != 0 {
		t.Errorf("runtime still has %v (%v)", list, err)
	}
	if left := count(t, r.dataDir, ids); left != (resources{}) {
		t.Errorf("left behind: %+v", left)
	}
	for _, id := range ids {
		if _, err := os.Stat(filepath.Join(r.dataDir, "sandboxes", id+".log")); !os.IsNotExist(err) {
			t.Errorf("log of %s survived: %v", id, err)
		}
	}
}

// TestReadyTimeout: a ready command that never succeeds fails the create at
// the template's deadline with what it and the start command printed, and
// the sandbox is gone completely, its network included.
func TestReadyTimeout(t *testing.T) {
	nr := newNetRig(t)
	nr.tpl.StartCmd = "echo server starting; sleep 1000"
	nr.tpl.ReadyCmd = "echo not yet; exit 1"
	nr.tpl.ReadyTimeout = 2 * time.Second
	w := watchIDs(nr.dataDir)
	began := time.Now()
	_, err := nr.m.Create(context.Background(), sandbox.CreateRequest{Template: "base", Timeout: time.Minute, Secure: true})
	took := time.Since(began)
	ids := w.result(t)
	t.Logf("failed after %s: %v", took.Round(time.Millisecond), err)
	var se *sandbox.StartError
	if !errors.As(err, &se) || !errors.Is(err, sandbox.ErrTemplateNotReady) || !errors.Is(err, sandbox.ErrTemplateStart) {
		t.Fatalf("Create = %v, want a not-ready StartError", err)
	}
	want := "template base: ready command `echo not yet; exit 1` did not succeed within 2s (last exit code 1: not yet); start command output: server starting"
	if err.Error() != want {
		t.Fatalf("error %q\nwant  %q", err, want)
	}
	if took < 2*time.Second {
		t.Fatalf("gave up after %s, before the 2 s deadline", took)
	}
	nr.m.KillAll(context.Background()) // waits for network teardowns
	assertNothingLeft(t, nr.rig, ids)
	nr.assertClean(t, ids)
}

// TestStartCmdExitFailsFast: a start command that exits before ready fails
// the create at once, with its exit code and output, long before the
// deadline; nothing is left.
func TestStartCmdExitFailsFast(t *testing.T) {
	r := newRig(t)
	r.tpl.StartCmd = "echo cannot bind port >&2; exit 1"
	r.tpl.ReadyCmd = "false"
	r.tpl.ReadyTimeout = time.Minute
	m := r.manager(t, 0)
	w := watchIDs(r.dataDir)
	began := time.Now()
	_, err := m.Create(context.Background(), sandbox.CreateRequest{Template: "base", Timeout: time.Minute, Secure: true})
	took := time.Since(began)
	ids := w.result(t)
	t.Logf("failed after %s: %v", took.Round(time.Millisecond), err)
	if !errors.Is(err, sandbox.ErrTemplateStart) || errors.Is(err, sandbox.ErrTemplateNotReady) {
		t.Fatalf("Create = %v, want a start-command StartError", err)
	}
	want := "template base: start command `echo cannot bind port >&2; exit 1` exited with code 1 before the sandbox was ready; its output: cannot bind port"
	if err.Error() != want {
		t.Fatalf("error %q\nwant  %q", err, want)
	}
	// Generous for a loaded 2-core machine; the point is "not the minute".
	if took > 20*time.Second {
		t.Fatalf("took %s: did not fail fast", took)
	}
	assertNothingLeft(t, r, ids)
}

// TestStartCmdExitZero: a start command that exits 0 is a finished one-shot
// set-up, not a failure: the ready command decides (E2B's templates may
// pair `echo hi` with waitForTimeout).
func TestStartCmdExitZero(t *testing.T) {
	r := newRig(t)
	r.tpl.StartCmd = "echo set up > /tmp/setup-done"
	r.tpl.ReadyCmd = "sleep 1; test -f /tmp/setup-done"
	r.tpl.ReadyTimeout = time.Minute
	m := r.manager(t, 0)
	info, err := m.Create(context.Background(), sandbox.CreateRequest{Template: "base", Timeout: time.Minute, Secure: true})
	if err != nil {
		t.Fatalf("Create = %v, want a sandbox: the start command exited 0 and the ready command succeeds", err)
	}
	if err := m.Kill(context.Background(), info.ID); err != nil {
		t.Fatal(err)
	}
}

// TestStartPhaseStopsWithRequest: a client that goes away while the sandbox
// is not ready yet stops the wait, and the sandbox is torn down.
func TestStartPhaseStopsWithRequest(t *testing.T) {
	r := newRig(t)
	r.tpl.StartCmd = "sleep 1000"
	r.tpl.ReadyCmd = "false"
	m := r.manager(t, 0)
	w := watchIDs(r.dataDir)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	began := time.Now()
	_, err := m.Create(ctx, sandbox.CreateRequest{Template: "base", Timeout: time.Minute, Secure: true})
	ids := w.result(t)
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, sandbox.ErrTemplateStart) {
		t.Fatalf("Create = %v, want the request's context error", err)
	}
	if took := time.Since(began); took > 20*time.Second {
		t.Fatalf("took %s after the request ended", took)
	}
	assertNothingLeft(t, r, ids)
}

// TestReadyWithoutStartCmd: a ready command alone is polled until it
// succeeds (here: once a file written by a background job exists).
func TestReadyWithoutStartCmd(t *testing.T) {
	r := newRig(t)
	r.tpl.ReadyCmd = "test -e /tmp/marker || { (sleep 0.3; touch /tmp/marker) & exit 1; }"
	m := r.manager(t, 0)
	info := create(t, m, time.Minute)
	if _, code := run(t, m, info, "test -e /tmp/marker"); code != 0 {
		t.Fatal("create returned before the ready command succeeded")
	}
	for _, p := range procs(t, m, info) {
		if p.GetTag() == sandbox.StartCmdTag {
			t.Fatalf("a start command runs without one in the template: %v", p)
		}
	}
}

// TestWarmPoolNeverReady: a pooled sandbox whose template never becomes
// ready is destroyed, not pooled.
func TestWarmPoolNeverReady(t *testing.T) {
	r := newRig(t)
	r.tpl.StartCmd = "sleep 1000"
	r.tpl.ReadyCmd = "false"
	r.tpl.ReadyTimeout = time.Second
	m := sandbox.New(sandbox.Options{Runtime: r.rt, Store: r.db, Templates: r, DataDir: r.dataDir, EnvdPath: r.envd, MaxTimeout: time.Hour})
	m.Start()
	closed := false
	t.Cleanup(func() {
		if !closed {
			m.Close()
		}
	})
	w := watchIDs(r.dataDir)
	m.SetWarmPool(r.tpl, 1)
	time.Sleep(2500 * time.Millisecond) // one fill attempt and its 1 s deadline
	if n := m.WarmCount(r.tpl.ID); n != 0 {
		t.Fatalf("a never-ready sandbox was pooled (%d)", n)
	}
	m.Close()
	closed = true
	assertNothingLeft(t, r, w.result(t))
}

// TestStartCmdWithoutBash: a template without bash (an OCI image) runs its
// commands with /bin/sh. The rootfs is dash and its libraries only.
func TestStartCmdWithoutBash(t *testing.T) {
	r := newRig(t)
	root := filepath.Join(r.dataDir, "shonly")
	dash, err := exec.LookPath("dash")
	if err != nil {
		t.Skip("no dash on the host to build a bash-less rootfs from")
	}
	copyWithLibs(t, dash, root, "/bin/sh")
	for _, d := range []string{"etc", "tmp", "proc", "dev", "sys", "run", "root"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(root, "tmp"), 0o1777); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc", "passwd"), []byte("root:x:0:0:root:/root:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Opening a fifo with no writer blocks: a start command that waits
	// forever without burning CPU, in a rootfs without sleep.
	if err := syscall.Mkfifo(filepath.Join(root, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc", "group"), []byte("root:x:0:\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r.tpl = sandbox.Template{ID: "base", Alias: "base", Rootfs: root, CPUCount: 1, MemoryMB: 256, DiskSizeMB: 256, DefaultUser: "root",
		StartCmd: "echo started > /tmp/started; read x < /fifo", ReadyCmd: "read x < /tmp/started"}
	m := r.manager(t, 0)
	info := create(t, m, time.Minute)
	var found *process.ProcessInfo
	for _, p := range procs(t, m, info) {
		if p.GetTag() == sandbox.StartCmdTag {
			found = p
		}
	}
	if found == nil || found.GetConfig().GetCmd() != "/bin/sh" || strings.Join(found.GetConfig().GetArgs(), " ") != "-c "+r.tpl.StartCmd {
		t.Fatalf("start command in a bash-less template: %v", found)
	}
}

// copyWithLibs copies a dynamically linked binary to root/as, with the
// libraries ldd names at their own paths.
func copyWithLibs(t *testing.T, bin, root, as string) {
	t.Helper()
	out, err := exec.Command("ldd", bin).Output()
	if err != nil {
		t.Fatalf("ldd %s: %v", bin, err)
	}
	files := map[string]string{bin: as}
	for _, line := range strings.Split(string(out), "\n") {
		for _, f := range strings.Fields(line) {
			if strings.HasPrefix(f, "/") {
				files[f] = f
			}
		}
	}
	for src, dst := range files {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(root, dst)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// TestStartCmdOnGVisor: the start phase goes through envd alone, so it works
// the same on the gVisor backend.
func TestStartCmdOnGVisor(t *testing.T) {
	r := newRig(t)
	testenv.NeedRunsc(t)
	gv, err := gvisor.New(filepath.Join(r.dataDir, "runtime-gvisor"), nil)
	if err != nil {
		t.Fatal(err)
	}
	r.tpl = webTemplate(r.tpl)
	r.tpl.Runtime = "gvisor"
	m := sandbox.New(sandbox.Options{
		Runtime: r.rt, Runtimes: []runtime.Runtime{gv}, Store: r.db, Templates: r,
		DataDir: r.dataDir, EnvdPath: r.envd, MaxTimeout: time.Hour,
	})
	m.Start()
	t.Cleanup(func() {
		m.KillAll(context.Background())
		m.Close()
	})
	began := time.Now()
	info := create(t, m, time.Minute)
	t.Logf("gVisor create with start + ready command: %s", time.Since(began).Round(time.Millisecond))
	checkWebSandbox(t, m, info, true)
}

// TestWarmPoolSkipsChangedStartCmd: a pooled sandbox started with another
// start command than the template now has is not handed out.
func TestWarmPoolSkipsChangedStartCmd(t *testing.T) {
	r := newRig(t)
	r.tpl.StartCmd = "sleep 1000"
	m := r.manager(t, 0)
	m.SetWarmPool(r.tpl, 1)
	deadline := time.Now().Add(60 * time.Second)
	for m.WarmCount(r.tpl.ID) < 1 {
		if time.Now().After(deadline) {
			t.Fatal("warm pool did not fill")
		}
		time.Sleep(10 * time.Millisecond)
	}
	entries, _ := os.ReadDir(filepath.Join(r.dataDir, "sandboxes"))
	var dirs []string
	for _, e := range entries {
		if e.IsDir() {
			dirs = append(dirs, e.Name())
		}
	}
	if len(dirs) != 1 {
		t.Fatalf("sandbox dirs %v with one pooled sandbox", dirs)
	}
	pooled := dirs[0]
	r.tpl.StartCmd = "sleep 2000"
	info := create(t, m, time.Minute)
	if info.ID == pooled {
		t.Fatal("the pooled sandbox of the old start command was handed out")
	}
	// The claim found it stale and destroys it in the background.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(r.dataDir, "sandboxes", pooled)); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the stale pooled sandbox was neither claimed nor destroyed")
		}
	}
	startArgs := func() string {
		for _, p := range procs(t, m, info) {
			if p.GetTag() == sandbox.StartCmdTag {
				return strings.Join(p.GetConfig().GetArgs(), " ")
			}
		}
		return ""
	}
	if got := startArgs(); got != "-l -c sleep 2000" {
		t.Fatalf("start command of the created sandbox: %q, want the template's current one", got)
	}
}

// TestWarmPoolSkipsChangedSettings: a rebuild that changes only settings
// (same rootfs) discards the pooled sandbox, and the one created instead has
// the new limits, both in what the manager reports and in its cgroups. A
// change that does not shape a started sandbox (alias, disk size, an empty
// list for none) keeps it claimable.
func TestWarmPoolSkipsChangedSettings(t *testing.T) {
	r := newRig(t)
	m := r.manager(t, 0)
	ctx := context.Background()
	// pooled waits for the pool to hold one sandbox of the current template
	// and returns its id.
	pooled := func() string {
		t.Helper()
		m.SetWarmPool(r.tpl, 1)
		for deadline := time.Now().Add(60 * time.Second); m.WarmCount(r.tpl.ID) < 1; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("warm pool did not fill")
			}
		}
		live := map[string]bool{}
		list, _ := m.List(ctx, sandbox.ListFilter{})
		for _, info := range list {
			live[info.ID] = true
		}
		var ids []string
		entries, _ := os.ReadDir(filepath.Join(r.dataDir, "sandboxes"))
		for _, e := range entries {
			if e.IsDir() && !live[e.Name()] {
				ids = append(ids, e.Name())
			}
		}
		if len(ids) != 1 {
			t.Fatalf("sandbox dirs %v besides the live ones with one pooled sandbox", ids)
		}
		return ids[0]
	}

	// Not a change to a started sandbox: the pooled one is handed out.
	id := pooled()
	r.tpl.Alias = "renamed"
	r.tpl.DiskSizeMB = 2048
	r.tpl.Env, r.tpl.Kernels = []string{}, []string{}
	if info := create(t, m, time.Minute); info.ID != id {
		t.Fatalf("a pooled sandbox was discarded for a change that does not shape it (got %s, pooled %s)", info.ID, id)
	}

	for _, c := range []struct {
		name   string
		change func(*sandbox.Template)
	}{
		{"memory", func(tpl *sandbox.Template) { tpl.MemoryMB = 384 }},
		{"cpus", func(tpl *sandbox.Template) { tpl.CPUCount = 1 }},
		// The same backend under its own name: still another record.
		{"runtime", func(tpl *sandbox.Template) { tpl.Runtime = "linux" }},
		{"ready timeout", func(tpl *sandbox.Template) { tpl.ReadyTimeout = 42 * time.Second }},
	} {
		id := pooled()
		c.change(&r.tpl)
		info := create(t, m, time.Minute)
		if info.ID == id {
			t.Fatalf("%s: the pooled sandbox of the old settings was handed out", c.name)
		}
		if info.MemoryMB != r.tpl.MemoryMB || info.CPUCount != r.tpl.CPUCount {
			t.Fatalf("%s: created with %d MiB and %d CPUs, template has %d and %d", c.name, info.MemoryMB, info.CPUCount, r.tpl.MemoryMB, r.tpl.CPUCount)
		}
		if got := readCgroupInt(t, "memory", info.ID, "memory.limit_in_bytes"); got != int64(r.tpl.MemoryMB)<<20 {
			t.Fatalf("%s: memory limit %d, want %d MiB", c.name, got, r.tpl.MemoryMB)
		}
		if got := readCgroupInt(t, "cpu", info.ID, "cpu.cfs_quota_us"); got != int64(r.tpl.CPUCount)*100000 {
			t.Fatalf("%s: CPU quota %d µs per 100 ms, want %d CPUs", c.name, got, r.tpl.CPUCount)
		}
		// The claim found it stale and destroys it in the background.
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if _, err := os.Stat(filepath.Join(r.dataDir, "sandboxes", id)); os.IsNotExist(err) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the stale pooled sandbox was neither claimed nor destroyed", c.name)
			}
		}
		if err := m.Kill(ctx, info.ID); err != nil {
			t.Fatal(err)
		}
	}
}
