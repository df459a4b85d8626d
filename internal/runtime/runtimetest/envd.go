package runtimetest

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/api/gen/process/processconnect"
	"github.com/airlock-sandbox/airlock/internal/envdapi"
	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// envdSandbox is a sandbox whose first process is envd, started as the
// sandbox manager starts it (config on stdin, its socket in a bound
// directory), so the suite can check what the processes envd starts see.
type envdSandbox struct {
	sb     runtime.Sandbox
	client processconnect.ProcessClient
	token  string
}

const envdToken = "conformance-token"

func newEnvdSandbox(t *testing.T, h Harness, res runtime.Resources) *envdSandbox {
	t.Helper()
	r := h.New(t)
	spec, _ := newSpec(t, h)
	runDir := filepath.Join(filepath.Dir(spec.Dir), "run")
	if err := os.Mkdir(runDir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg, err := json.Marshal(envdapi.Config{
		SandboxID:   spec.ID,
		AccessToken: envdToken,
		DefaultUser: "user",
		Listen:      []string{"unix:/run/airlock/envd.sock"},
		DiskPath:    "/",
	})
	if err != nil {
		t.Fatal(err)
	}
	spec.Mounts = append(spec.Mounts,
		runtime.Mount{Source: h.Envd, Target: "/usr/local/bin/envd", ReadOnly: true},
		runtime.Mount{Source: runDir, Target: "/run/airlock"})
	spec.Init.Args = []string{"/usr/local/bin/envd"}
	spec.Init.Stdin = cfg
	spec.Resources = res
	sb := create(t, r, spec)

	socket := filepath.Join(runDir, "envd.sock")
	// No keep-alive: every request's connection is closed when it ends, so
	// envd's descriptor count does not depend on an idle pool's whims.
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		DisableKeepAlives: true,
	}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr}
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := hc.Get("http://envd/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode < 300 {
				break
			}
			err = fmt.Errorf("health: %s", resp.Status)
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(spec.Init.LogPath)
			t.Fatalf("envd did not start: %v; log:\n%s", err, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return &envdSandbox{
		sb:     sb,
		client: processconnect.NewProcessClient(hc, "http://envd", connect.WithProtoJSON()),
		token:  envdToken,
	}
}

// run runs a bash script through envd as user and returns its stdout and
// stderr together and its exit code.
func (e *envdSandbox) run(t *testing.T, user, script string) (string, int32) {
	t.Helper()
	out, code, err := e.try(user, script)
	if err != nil {
		t.Fatal(err)
	}
	return out, code
}

// try is run for other goroutines than the test's: it returns what failed.
func (e *envdSandbox) try(user, script string) (string, int32, error) {
	return testenv.Exec(e.client, e.token, user, []string{"/bin/bash", "-c", script}, 60*time.Second)
}

// sysinfoProbe reports, as JSON, what a process sees of the sandbox's
// memory: glibc's sysconf (from sysinfo(2)), the raw sysinfo struct,
// /proc/meminfo and free; its own capabilities; and, for every envd process,
// its capabilities and whether this process may open its memory.
const sysinfoProbe = `
import ctypes, json, os, subprocess
r = {}
page = os.sysconf("SC_PAGE_SIZE")
r["phys_mb"] = os.sysconf("SC_PHYS_PAGES") * page >> 20
r["avphys_mb"] = os.sysconf("SC_AVPHYS_PAGES") * page >> 20
class SI(ctypes.Structure):
    _fields_ = [("uptime", ctypes.c_long), ("loads", ctypes.c_ulong * 3),
        ("totalram", ctypes.c_ulong), ("freeram", ctypes.c_ulong),
        ("sharedram", ctypes.c_ulong), ("bufferram", ctypes.c_ulong),
        ("totalswap", ctypes.c_ulong), ("freeswap", ctypes.c_ulong),
        ("procs", ctypes.c_ushort), ("pad", ctypes.c_ushort),
        ("totalhigh", ctypes.c_ulong), ("freehigh", ctypes.c_ulong),
        ("mem_unit", ctypes.c_uint), ("f", ctypes.c_char * 4)]
si = SI()
libc = ctypes.CDLL(None, use_errno=True)
# 8 MiB of shared memory (tmpfs), for sharedram and Shmem to show.
shm = "/dev/shm/sysinfo-probe-%d" % os.getpid()
with open(shm, "wb") as f:
    f.write(b"\1" * (8 << 20))
# The cgroup's shmem figure, which both views read, is flushed lazily by the
# kernel (every 2 s at most): wait until it counts the file, for up to 5 s.
import time
for _ in range(50):
    if any(l.startswith("Shmem:") and int(l.split()[1]) >= 8 << 10 for l in open("/proc/meminfo")):
        break
    time.sleep(0.1)
if libc.sysinfo(ctypes.byref(si)) != 0:
    r["sysinfo_err"] = os.strerror(ctypes.get_errno())
mem = {}
for line in open("/proc/meminfo"):
    k, v = line.split(":", 1)
    mem[k] = int(v.split()[0])
proc_uptime = float(open("/proc/uptime").read().split()[0])
os.unlink(shm)
r["total_bytes"] = si.totalram * si.mem_unit
r["free_bytes"] = si.freeram * si.mem_unit
r["shared_bytes"] = si.sharedram * si.mem_unit
r["uptime"] = si.uptime
r["procs"] = si.procs
r["meminfo_total_bytes"] = mem["MemTotal"] * 1024
r["meminfo_free_bytes"] = mem["MemFree"] * 1024
r["meminfo_shmem_bytes"] = mem["Shmem"] * 1024
r["proc_uptime"] = proc_uptime
r["free_mb"] = int(subprocess.run(["free", "-m"], capture_output=True, text=True).stdout.splitlines()[1].split()[1])
def caps(pid):
    out = {}
    for line in open("/proc/%s/status" % pid):
        k, _, v = line.partition(":")
        if k in ("Name", "CapInh", "CapPrm", "CapEff", "CapAmb"):
            out[k] = v.strip()
    return out
r["self"] = caps("self")
r["uid"] = os.getuid()
r["envd"] = {}
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    try:
        c = caps(pid)
        exe = open("/proc/%s/cmdline" % pid, "rb").read().split(b"\0")[0]
    except OSError:
        continue
    if os.path.basename(exe) != b"envd":
        continue
    try:
        open("/proc/%s/mem" % pid, "rb").close()
        c["mem"] = "readable"
    except OSError as e:
        c["mem"] = e.__class__.__name__
    r["envd"][pid] = c
print(json.dumps(r))
`

type sysinfoReport struct {
	PhysMB            int64   `json:"phys_mb"`
	AvphysMB          int64   `json:"avphys_mb"`
	SysinfoErr        string  `json:"sysinfo_err"`
	TotalBytes        uint64  `json:"total_bytes"`
	Uptime            int64   `json:"uptime"`
	Procs             int64   `json:"procs"`
	MeminfoTotalBytes uint64  `json:"meminfo_total_bytes"`
	FreeBytes         int64   `json:"free_bytes"`
	SharedBytes       int64   `json:"shared_bytes"`
	MeminfoFreeBytes  int64   `json:"meminfo_free_bytes"`
	MeminfoShmemBytes int64   `json:"meminfo_shmem_bytes"`
	ProcUptime        float64 `json:"proc_uptime"`
	FreeMB            int64   `json:"free_mb"`
	Self              map[string]string
	UID               int
	Envd              map[string]map[string]string
}

// capSysPtrace is CAP_SYS_PTRACE's bit.
const capSysPtrace = 19

func hasCap(t *testing.T, mask string, bit int) bool {
	t.Helper()
	v, err := strconv.ParseUint(mask, 16, 64)
	if err != nil {
		t.Fatalf("capability mask %q: %v", mask, err)
	}
	return v&(1<<bit) != 0
}

// checkSysinfo asserts what a sysinfoProbe report must say inside a sandbox of
// memMB MiB and pidsMax tasks, about a process started by envd (guestKernel:
// Harness.GuestKernel).
func checkSysinfo(t *testing.T, where string, out string, memMB, pidsMax int64, guestKernel bool) sysinfoReport {
	t.Helper()
	var r sysinfoReport
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &r); err != nil {
		t.Fatalf("%s: probe output %q: %v", where, out, err)
	}
	if r.SysinfoErr != "" {
		t.Errorf("%s: sysinfo failed: %s", where, r.SysinfoErr)
	}
	if r.PhysMB != memMB {
		t.Errorf("%s: os.sysconf('SC_PHYS_PAGES') says %d MiB; the sandbox has %d", where, r.PhysMB, memMB)
	}
	if r.AvphysMB <= 0 || r.AvphysMB > memMB {
		t.Errorf("%s: os.sysconf('SC_AVPHYS_PAGES') says %d MiB free of the sandbox's %d", where, r.AvphysMB, memMB)
	}
	// sysinfo and /proc/meminfo (and so free) tell the same total.
	if r.TotalBytes != r.MeminfoTotalBytes || r.FreeMB != memMB {
		t.Errorf("%s: sysinfo totalram %d B, /proc/meminfo MemTotal %d B, free %d MiB: they must agree on %d MiB",
			where, r.TotalBytes, r.MeminfoTotalBytes, r.FreeMB, memMB)
	}
	// Free and shared memory as /proc/meminfo says, read just after (free
	// memory moves a little in between); the probe holds 8 MiB in /dev/shm.
	if d := r.FreeBytes - r.MeminfoFreeBytes; d > 16<<20 || d < -16<<20 {
		t.Errorf("%s: sysinfo freeram %d B, /proc/meminfo MemFree %d B", where, r.FreeBytes, r.MeminfoFreeBytes)
	}
	if d := r.SharedBytes - r.MeminfoShmemBytes; r.MeminfoShmemBytes < 8<<20 || d > 1<<20 || d < -1<<20 {
		if guestKernel {
			// gVisor's sentry leaves sysinfo's sharedram at 0.
			t.Logf("%s: known gap of the guest kernel: sysinfo sharedram %d B, /proc/meminfo Shmem %d B", where, r.SharedBytes, r.MeminfoShmemBytes)
		} else {
			t.Errorf("%s: sysinfo sharedram %d B, /proc/meminfo Shmem %d B, with 8 MiB in /dev/shm", where, r.SharedBytes, r.MeminfoShmemBytes)
		}
	}
	// gVisor rounds a partial second down, Linux up.
	if r.Uptime < 0 || r.Uptime > 300 || math.Abs(float64(r.Uptime)-r.ProcUptime) > 1.5 {
		t.Errorf("%s: sysinfo uptime %d s, /proc/uptime %.2f s; the sandbox is seconds old", where, r.Uptime, r.ProcUptime)
	}
	if r.Procs < 1 || r.Procs > pidsMax {
		t.Errorf("%s: sysinfo procs %d; the sandbox holds at most %d tasks", where, r.Procs, pidsMax)
	}
	// No process envd starts holds CAP_SYS_PTRACE, root's included.
	for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapAmb"} {
		if hasCap(t, r.Self[k], capSysPtrace) {
			t.Errorf("%s: uid %d has CAP_SYS_PTRACE in %s (%s)", where, r.UID, k, r.Self[k])
		}
	}
	if len(r.Envd) == 0 {
		t.Errorf("%s: no envd process found in /proc", where)
	}
	for pid, c := range r.Envd {
		// envd keeps a capability (CAP_SYS_PTRACE on the linux backend)
		// that its children lack: then none of them, root's included, may
		// read its memory.
		if hasCap(t, c["CapPrm"], capSysPtrace) && c["mem"] == "readable" {
			t.Errorf("%s: uid %d opened envd's (pid %s) /proc/<pid>/mem although envd holds CAP_SYS_PTRACE and it does not", where, r.UID, pid)
		}
	}
	return r
}

// testEnvdSysinfo: in a sandbox of 512 MiB whose first process is envd,
// sysinfo(2) (glibc's SC_PHYS_PAGES) reports 512 MiB and agrees with
// /proc/meminfo and free, for a command run as user and as root, for a
// process started by a background process after its command ended, in 8
// concurrent trees calling it 500 times each, and still after 50 more
// commands; they leave no descriptor behind in envd, nor more than a few
// threads. No process envd starts holds CAP_SYS_PTRACE, and where envd
// holds it, root cannot open envd's memory.
func testEnvdSysinfo(t *testing.T, h Harness) {
	if h.Envd == "" {
		t.Fatal("Harness.Envd not set: the suite needs an envd binary (testenv.EnvdBinary)")
	}
	const memMB, pidsMax = 512, 256
	e := newEnvdSandbox(t, h, runtime.Resources{CPUs: 1, MemoryMB: memMB, PidsMax: pidsMax})
	probe := "python3 -c '" + strings.ReplaceAll(sysinfoProbe, "'", `'"'"'`) + "'"

	for _, user := range []string{"user", "root"} {
		out, code := e.run(t, user, probe)
		if code != 0 {
			t.Fatalf("probe as %s: exit %d: %s", user, code, out)
		}
		r := checkSysinfo(t, "as "+user, out, memMB, pidsMax, h.GuestKernel)
		if user == "root" && slices.Contains(h.Caps, "CAP_SYS_PTRACE") {
			n := 0
			for _, c := range r.Envd {
				if hasCap(t, c["CapPrm"], capSysPtrace) {
					n++
				}
			}
			if n == 0 {
				t.Errorf("envd does not hold CAP_SYS_PTRACE (%v); sysinfo needs it", r.Envd)
			}
		}
	}

	// A process started by a background process, after the command that
	// started it returned: the filter is inherited, and its listener
	// outlives the command.
	out, code := e.run(t, "user", "(sleep 1; "+probe+" > /tmp/bg.json 2>&1; mv /tmp/bg.json /tmp/bg.done) > /dev/null 2>&1 &")
	if code != 0 {
		t.Fatalf("background start: exit %d: %s", code, out)
	}
	out, code = e.run(t, "user", "for i in $(seq 200); do [ -e /tmp/bg.done ] && break; sleep 0.1; done; cat /tmp/bg.done")
	if code != 0 {
		t.Fatalf("background probe: exit %d: %s", code, out)
	}
	checkSysinfo(t, "in a background process's child", out, memMB, pidsMax, h.GuestKernel)

	// No listener, goroutine or thread is left behind by ended commands, and
	// a flood of sysinfo calls from concurrent trees does not multiply envd's
	// threads (each one comes out of the sandbox's small pids reserve).
	fds, threads := e.envdFDs(t), e.envdThreads(t)
	const trees, calls = 8, 500
	errs := make(chan string, trees)
	for i := 0; i < trees; i++ {
		go func() {
			out, code, err := e.try("user", fmt.Sprintf(`python3 -c 'import os
for i in range(%d):
    assert os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") >> 20 == %d'`, calls, memMB))
			switch {
			case err != nil:
				errs <- err.Error()
			case code != 0:
				errs <- fmt.Sprintf("exit %d: %s", code, out)
			default:
				errs <- ""
			}
		}()
	}
	for i := 0; i < trees; i++ {
		if err := <-errs; err != "" {
			t.Errorf("%d sysinfo calls in each of %d concurrent trees: %s", calls, trees, err)
		}
	}
	t.Logf("envd: %d threads before the flood, %d after", threads, e.envdThreads(t))
	for i := 0; i < 50; i++ {
		if out, code := e.run(t, "user", "python3 -c 'import os; os.sysconf(\"SC_PHYS_PAGES\")'"); code != 0 {
			t.Fatalf("command %d: exit %d: %s", i, code, out)
		}
	}
	// A listener closes when its tree's last process is reaped, just after
	// the command's end event: allow a moment, then expect the count back.
	// A leak would show as about 50 more.
	var afterFDs, afterThreads int
	deadline := time.Now().Add(10 * time.Second)
	for {
		afterFDs, afterThreads = e.envdFDs(t), e.envdThreads(t)
		if afterFDs <= fds+2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if afterFDs > fds+2 {
		t.Errorf("envd has %d descriptors open after 50 commands, %d before: listeners leak", afterFDs, fds)
	}
	// Go keeps the threads it made. envd already holds one per running
	// command (each waits in wait4), so the flood may leave up to one per
	// tree, plus the two that answer notifications and a couple for the
	// requests; not one per listener or per call.
	if afterThreads > threads+trees+4 {
		t.Errorf("envd has %d threads after the flood and 50 commands, %d before", afterThreads, threads)
	}
	out, code = e.run(t, "user", probe)
	if code != 0 {
		t.Fatalf("probe after 50 commands: exit %d: %s", code, out)
	}
	checkSysinfo(t, "after 50 commands", out, memMB, pidsMax, h.GuestKernel)
}

// envdServerPid is the pid, inside, of envd's server: the child of envd's
// pid 1 (the reaper).
func (e *envdSandbox) envdServerPid(t *testing.T) string {
	t.Helper()
	// The server is envd re-executed through /proc/self/exe: its name is
	// "exe", its command line envd's.
	out, code := e.run(t, "user", `for d in /proc/[0-9]*; do [ "$(awk '/^PPid:/{print $2}' $d/status 2>/dev/null)" = 1 ] && [ "$(tr '\0' ' ' < $d/cmdline 2>/dev/null | cut -d' ' -f1)" = /usr/local/bin/envd ] && echo $d; done; true`)
	if code != 0 {
		t.Fatalf("finding envd's server: exit %d: %s", code, out)
	}
	f := strings.Fields(out)
	if len(f) != 1 {
		t.Fatalf("finding envd's server: %q", out)
	}
	return strings.TrimPrefix(f[0], "/proc/")
}

// envdFDs counts envd server's open descriptors, as root: listing
// /proc/<pid>/fd takes only the directory's permissions, while reading the
// links would take ptrace rights over envd, which no process envd starts has
// on the linux backend.
func (e *envdSandbox) envdFDs(t *testing.T) int {
	t.Helper()
	out, code := e.run(t, "root", "ls /proc/"+e.envdServerPid(t)+"/fd | wc -l")
	n, err := strconv.Atoi(strings.TrimSpace(out))
	if code != 0 || err != nil {
		t.Fatalf("counting envd's descriptors: exit %d: %s", code, out)
	}
	return n
}

// envdThreads counts envd server's threads (its status is world-readable).
func (e *envdSandbox) envdThreads(t *testing.T) int {
	t.Helper()
	out, code := e.run(t, "user", "awk '/^Threads:/{print $2}' /proc/"+e.envdServerPid(t)+"/status")
	n, err := strconv.Atoi(strings.TrimSpace(out))
	if code != 0 || err != nil {
		t.Fatalf("counting envd's threads: exit %d: %s", code, out)
	}
	return n
}
