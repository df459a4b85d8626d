package sandbox_test

// Attacks from inside a sandbox against its limits: each runs in a real
// sandbox through the manager, is bounded in time and size, and asserts that
// the limit held and the sandbox survived (or died cleanly), never how fast
// anything was: the machine is shared. The neighbour-latency side of the same
// attacks is a benchmark (airlock bench attacks), not a test.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/api/gen/process"
	"github.com/airlock-sandbox/airlock/api/gen/process/processconnect"
	"github.com/airlock-sandbox/airlock/internal/diskquota"
	"github.com/airlock-sandbox/airlock/internal/runtime/linux"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

const (
	attackMemoryMB = 256
	attackPidsMax  = 256
)

// attackManager is a manager with small limits (1 CPU, 256 MiB, 256 pids) and
// a disk-quota pool on a 4 GiB sparse image in the rig's temp dir; the image
// is unmounted and deleted when the test ends.
func attackManager(t *testing.T) (*rig, *sandbox.Manager) {
	t.Helper()
	r := newRig(t)
	r.tpl.CPUCount = 1
	r.tpl.MemoryMB = attackMemoryMB
	pool, err := diskquota.Open(filepath.Join(r.dataDir, "sandboxes.img"), filepath.Join(r.dataDir, "sandboxes"), 4<<30)
	if err != nil {
		t.Fatal(err)
	}
	// Registered before the manager's cleanup, so it runs after it.
	t.Cleanup(func() {
		if err := pool.Close(true); err != nil {
			t.Errorf("disk pool: %v", err)
		}
	})
	m := newAttackManager(r, pool)
	m.Start()
	t.Cleanup(func() {
		m.KillAll(context.Background())
		m.Close()
	})
	return r, m
}

func newAttackManager(r *rig, pool *diskquota.Pool) *sandbox.Manager {
	return sandbox.New(sandbox.Options{
		Runtime: r.rt, Store: r.db, Templates: r, DataDir: r.dataDir, EnvdPath: r.envd,
		MaxTimeout: time.Hour, MetricsInterval: 250 * time.Millisecond,
		PidsMax: attackPidsMax, Disk: pool,
	})
}

func attackSandbox(t *testing.T, m *sandbox.Manager, diskMB int) sandbox.Info {
	t.Helper()
	info, err := m.Create(context.Background(), sandbox.CreateRequest{
		Template: "base", Timeout: 10 * time.Minute, Secure: true, DiskSizeMB: diskMB,
	})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	return info
}

// result of a command run the way commands.run does.
type result struct {
	out   string // the first 64 KiB of stdout+stderr
	bytes int64  // all stdout+stderr bytes received
	code  int32
	err   error // transport or stream error; nil when an end event arrived
}

// sh runs a bash command in the sandbox as its default user, bounded by limit.
// onData, if set, sees every data event (for pacing a consumer).
func sh(m *sandbox.Manager, info sandbox.Info, cmd string, limit time.Duration, onData func(total int64)) result {
	tr, err := m.EnvdTransport(info.ID)
	if err != nil {
		return result{err: err}
	}
	c := processconnect.NewProcessClient(&http.Client{Transport: tr}, "http://envd", connect.WithProtoJSON())
	req := connect.NewRequest(&process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", cmd}},
	})
	req.Header().Set("X-Access-Token", info.AccessToken)
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	stream, err := c.Start(ctx, req)
	if err != nil {
		return result{err: err}
	}
	defer stream.Close()
	var res result
	var out strings.Builder
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if d := ev.GetData(); d != nil {
			for _, b := range [][]byte{d.GetStdout(), d.GetStderr()} {
				res.bytes += int64(len(b))
				if out.Len() < 64<<10 {
					out.Write(b[:min(len(b), 64<<10-out.Len())])
				}
			}
			if onData != nil {
				onData(res.bytes)
			}
		}
		if end := ev.GetEnd(); end != nil {
			res.out, res.code = out.String(), end.GetExitCode()
			return res
		}
	}
	res.out = out.String()
	res.err = stream.Err()
	if res.err == nil {
		res.err = errors.New("stream ended without an end event")
	}
	return res
}

// mustWork asserts the sandbox still runs commands.
func mustWork(t *testing.T, m *sandbox.Manager, info sandbox.Info) {
	t.Helper()
	var res result
	// A just-killed attacker's processes may take a moment to go.
	for range 20 {
		if res = sh(m, info, "echo alive", 20*time.Second, nil); res.err == nil && res.out == "alive\n" {
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("sandbox no longer runs commands: %+v", res)
}

func cgroupFile(ctrl, id, file string) string {
	return filepath.Join("/sys/fs/cgroup", ctrl, linux.CgroupParent, id, file)
}

func readCgroupInt(t *testing.T, ctrl, id, file string) int64 {
	t.Helper()
	b, err := os.ReadFile(cgroupFile(ctrl, id, file))
	if err != nil {
		t.Fatal(err)
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestAttackForkBomb(t *testing.T) {
	_, m := attackManager(t)
	info := attackSandbox(t, m, 0)
	// setsid: the bomb leaves the command's process group, and the command
	// returns at once; the bomb runs until the sandbox is killed.
	res := sh(m, info, `setsid bash -c ':(){ :|:& };:' >/dev/null 2>&1 < /dev/null & echo started`, 20*time.Second, nil)
	if res.err != nil || res.out != "started\n" {
		t.Fatalf("start bomb: %+v", res)
	}
	var peak int64
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		peak = max(peak, readCgroupInt(t, "pids", info.ID, "pids.current"))
		time.Sleep(50 * time.Millisecond)
	}
	if peak > attackPidsMax {
		t.Fatalf("pids.current reached %d past pids.max %d", peak, attackPidsMax)
	}
	if peak < attackPidsMax/2 {
		t.Fatalf("the bomb only reached %d processes; the test did not test the limit", peak)
	}
	t.Logf("fork bomb peaked at %d processes (max %d)", peak, attackPidsMax)
	// envd (pid 1) still answers: a health check needs no new process.
	tr, err := m.EnvdTransport(info.ID)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get("http://envd/health")
	if err != nil {
		t.Fatalf("envd health during the bomb: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode >= 300 {
		t.Fatalf("envd health during the bomb: %s", resp.Status)
	}
	// Cleanly dead: killing the sandbox takes every bomb process with it.
	if err := m.Kill(context.Background(), info.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(cgroupFile("pids", info.ID, "")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the sandbox's pids cgroup survived the kill: %v", err)
	}
}

func TestAttackMemoryBomb(t *testing.T) {
	_, m := attackManager(t)
	ctx := context.Background()
	info := attackSandbox(t, m, 0)
	// Touches every byte it allocates (bytes * n writes), so the pages count.
	res := sh(m, info, `python3 -c '
a = []
while True:
    a.append(b"\x01" * (16 << 20))
'`, 2*time.Minute, nil)
	if res.err != nil {
		t.Fatalf("memory bomb: %+v", res)
	}
	if res.code != 137 && res.code != -1 {
		t.Fatalf("memory bomb exited %d, want SIGKILL (137): %s", res.code, res.out)
	}
	if peak := readCgroupInt(t, "memory", info.ID, "memory.max_usage_in_bytes"); peak > attackMemoryMB<<20 {
		t.Fatalf("memory peaked at %d, past the %d MiB limit", peak, attackMemoryMB)
	}
	// The sampler (every 250 ms here) turns the kernel's counter into an
	// event, and the sandbox's log shows it beside the killed process's end.
	oomEntries := func() []sandbox.LogEntry {
		t.Helper()
		all, err := m.Logs(ctx, info.ID, sandbox.LogQuery{})
		if err != nil {
			t.Fatal(err)
		}
		var out []sandbox.LogEntry
		for _, e := range all {
			if e.Logger == "airlock.oom" {
				out = append(out, e)
			}
		}
		return out
	}
	var logs []sandbox.LogEntry
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && len(logs) == 0 {
		time.Sleep(100 * time.Millisecond)
		logs = oomEntries()
	}
	if len(logs) == 0 || logs[0].Level != "error" || logs[0].Origin != "host" || logs[0].Fields["killed"] == "0" {
		t.Fatalf("no OOM kill in the sandbox's log: %+v", logs)
	}
	t.Logf("log entry: %+v", logs[0])
	ended, err := m.Logs(ctx, info.ID, sandbox.LogQuery{Search: "ended: signal: killed"})
	if err != nil || len(ended) != 1 || ended[0].Logger != "envd.process" || ended[0].Level != "warn" {
		t.Fatalf("the killed python's end in the log: %+v (%v)", ended, err)
	}
	mustWork(t, m, info) // envd survived: only the offending process died
	// The counter is not recorded twice.
	time.Sleep(time.Second)
	if again := oomEntries(); len(again) != len(logs) {
		t.Fatalf("one OOM kill became %d entries: %+v", len(again), again)
	}
}

func TestAttackCPUSpin(t *testing.T) {
	_, m := attackManager(t)
	info := attackSandbox(t, m, 0)
	// One spinner per host core, in a quota of one core.
	res := sh(m, info, `for i in $(seq $(nproc)); do timeout 20 bash -c 'while :; do :; done' >/dev/null 2>&1 < /dev/null & done; echo started`, 20*time.Second, nil)
	if res.err != nil || res.out != "started\n" {
		t.Fatalf("start spinners: %+v", res)
	}
	time.Sleep(time.Second)
	u0, t0 := readCgroupInt(t, "cpuacct", info.ID, "cpuacct.usage"), time.Now()
	time.Sleep(4 * time.Second)
	u1, t1 := readCgroupInt(t, "cpuacct", info.ID, "cpuacct.usage"), time.Now()
	cores := float64(u1-u0) / float64(t1.Sub(t0).Nanoseconds())
	t.Logf("spinners used %.2f cores under a quota of 1", cores)
	// Slack for the period boundary (one 100 ms period over the window) and
	// for envd's own use.
	if cores > 1.1 {
		t.Fatalf("the sandbox used %.2f cores with a quota of 1", cores)
	}
	mustWork(t, m, info)
}

func TestAttackDiskFill(t *testing.T) {
	_, m := attackManager(t)
	ctx := context.Background()
	const diskMB = 128
	info := attackSandbox(t, m, diskMB)
	if info.DiskSizeMB != diskMB {
		t.Fatalf("DiskSizeMB = %d", info.DiskSizeMB)
	}
	// dd's complaint on the same pipe as the rest: stdout and stderr are two
	// streams whose chunks may arrive in either order, and the size must be
	// the last line.
	res := sh(m, info, `dd if=/dev/zero of=$HOME/fill bs=1M count=1024 conv=fsync 2>&1; echo "exit=$?"; stat -c %s $HOME/fill`, 2*time.Minute, nil)
	if res.err != nil {
		t.Fatalf("fill: %+v", res)
	}
	if !strings.Contains(res.out, "Disk quota exceeded") && !strings.Contains(res.out, "No space left") {
		t.Fatalf("dd did not stop at the quota: %s", res.out)
	}
	lines := strings.Split(strings.TrimSpace(res.out), "\n")
	size, err := strconv.ParseInt(lines[len(lines)-1], 10, 64)
	if err != nil {
		t.Fatalf("file size: %q", res.out)
	}
	if size > diskMB<<20 || size < (diskMB-32)<<20 {
		t.Fatalf("wrote %d MiB under a %d MiB quota", size>>20, diskMB)
	}
	t.Logf("dd stopped at %d MiB: %s", size>>20, lines[0])
	// Metrics report the quota's accounting, against the requested size.
	deadline := time.Now().Add(15 * time.Second)
	var last sandbox.Metric
	for time.Now().Before(deadline) {
		ms, err := m.Metrics(ctx, info.ID, time.Time{}, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		if len(ms) > 0 {
			last = ms[len(ms)-1]
			if last.DiskUsed >= size {
				break
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	if last.DiskTotal != diskMB<<20 || last.DiskUsed < size || last.DiskUsed > (diskMB+8)<<20 {
		t.Fatalf("disk metric %d / %d after writing %d", last.DiskUsed, last.DiskTotal, size)
	}
	// Usable again once the file is gone.
	res = sh(m, info, `rm $HOME/fill && sync && dd if=/dev/zero of=$HOME/again bs=1M count=16 conv=fsync 2>&1 && echo ok`, time.Minute, nil)
	if res.err != nil || res.code != 0 || !strings.HasSuffix(res.out, "ok\n") {
		t.Fatalf("write after delete: %+v", res)
	}
	dir := filepath.Join(m.DataDir(), "sandboxes", info.ID)
	if !diskquota.IsSubvolume(dir) {
		t.Fatalf("%s is not a quota subvolume", dir)
	}
	if err := m.Kill(ctx, info.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("sandbox subvolume survived the kill: %v", err)
	}
}

func TestAttackDiskSizeBounds(t *testing.T) {
	_, m := attackManager(t)
	for _, mb := range []int{1, sandbox.MinDiskSizeMB - 1, 1 << 30} {
		_, err := m.Create(context.Background(), sandbox.CreateRequest{Template: "base", Timeout: time.Minute, DiskSizeMB: mb})
		if !errors.Is(err, sandbox.ErrInvalid) {
			t.Errorf("diskSizeMB %d: %v, want ErrInvalid", mb, err)
		}
	}
}

func TestAttackOutputFlood(t *testing.T) {
	_, m := attackManager(t)
	ctx := context.Background()
	info := attackSandbox(t, m, 0)
	const total = 1 << 30
	// The consumer stalls for 1 s after the first data: envd must apply
	// back-pressure rather than buffer the flood (its memory is the
	// sandbox's, so the cgroup's peak shows what it held). The stall stays
	// under envd's subscriberStall (2 s): past it, envd marks the client
	// lagging and drops output for it instead.
	stalled := false
	baseline := readCgroupInt(t, "memory", info.ID, "memory.usage_in_bytes")
	res := sh(m, info, fmt.Sprintf("head -c %d /dev/zero", total), 5*time.Minute, func(int64) {
		if !stalled {
			stalled = true
			time.Sleep(time.Second)
		}
	})
	if res.err != nil {
		// Cutting the stream is acceptable only with a clear error.
		if res.err.Error() == "" {
			t.Fatalf("flood cut without an error message after %d bytes", res.bytes)
		}
		t.Logf("flood cut after %d bytes: %v", res.bytes, res.err)
	} else if res.bytes != total || res.code != 0 {
		t.Fatalf("flood: got %d of %d bytes, exit %d", res.bytes, total, res.code)
	}
	peak := readCgroupInt(t, "memory", info.ID, "memory.max_usage_in_bytes")
	t.Logf("sandbox memory: %d MiB before, peak %d MiB while streaming 1 GiB", baseline>>20, peak>>20)
	if peak > 128<<20 {
		t.Fatalf("the sandbox's memory peaked at %d MiB streaming output: envd buffers it", peak>>20)
	}
	if logs, _ := m.Logs(ctx, info.ID, sandbox.LogQuery{Search: "out of memory"}); len(logs) != 0 {
		t.Fatalf("the flood caused OOM kills: %+v", logs)
	}
	mustWork(t, m, info)
}

func TestAttackFDExhaustion(t *testing.T) {
	_, m := attackManager(t)
	info := attackSandbox(t, m, 0)
	res := sh(m, info, `n=0; while exec {fd}</dev/null; do n=$((n+1)); done 2>/dev/null; echo "$n $(ulimit -n)"`, 2*time.Minute, nil)
	if res.err != nil {
		t.Fatalf("fd exhaustion: %+v", res)
	}
	var n, limit int
	if _, err := fmt.Sscan(res.out, &n, &limit); err != nil {
		t.Fatalf("output %q: %v", res.out, err)
	}
	t.Logf("opened %d fds under RLIMIT_NOFILE %d", n, limit)
	if limit <= 0 || n > limit || n < limit-100 {
		t.Fatalf("opened %d fds with RLIMIT_NOFILE %d", n, limit)
	}
	// The host still opens files (the limit is per process, not global).
	f, err := os.Open("/proc/sys/fs/file-nr")
	if err != nil {
		t.Fatalf("host open after the attack: %v", err)
	}
	f.Close()
	mustWork(t, m, info)
}

// TestAttackDiskQuotaSurvivesRestart: a restarted server adopts the mounted
// pool and the re-adopted sandbox keeps its limit; killing it then releases
// its subvolume.
func TestAttackDiskQuotaSurvivesRestart(t *testing.T) {
	r, second := attackManager(t)
	ctx := context.Background()
	pool, err := diskquota.Open(filepath.Join(r.dataDir, "sandboxes.img"), filepath.Join(r.dataDir, "sandboxes"), 0)
	if err != nil {
		t.Fatal(err)
	}
	first := newAttackManager(r, pool)
	info := attackSandbox(t, first, sandbox.MinDiskSizeMB)
	first.Close() // a server stopping without killing its sandboxes

	// A new server: it opens the pool again (adopting the mount) and recovers.
	if pool, err = diskquota.Open(filepath.Join(r.dataDir, "sandboxes.img"), filepath.Join(r.dataDir, "sandboxes"), 0); err != nil {
		t.Fatal(err)
	}
	second = newAttackManager(r, pool)
	t.Cleanup(func() {
		second.KillAll(context.Background())
		second.Close()
	})
	if err := second.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	second.Start()
	res := sh(second, info, `dd if=/dev/zero of=$HOME/fill bs=1M count=256 conv=fsync 2>&1; stat -c %s $HOME/fill`, time.Minute, nil)
	if res.err != nil || !strings.Contains(res.out, "Disk quota exceeded") {
		t.Fatalf("fill after restart: %+v", res)
	}
	dir := filepath.Join(r.dataDir, "sandboxes", info.ID)
	if _, limit, err := pool.Usage(dir); err != nil || limit != sandbox.MinDiskSizeMB<<20 {
		t.Fatalf("limit after restart: %d, %v", limit, err)
	}
	if err := second.Kill(ctx, info.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("subvolume survived the kill: %v", err)
	}
}
