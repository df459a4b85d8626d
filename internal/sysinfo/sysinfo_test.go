//go:build amd64 || arm64

package sysinfo

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// fakeView writes a sandbox's memory cgroup, pids.current and pid 1 (started
// 42.1 s ago) into dir and returns their paths.
func fakeView(t *testing.T, dir string) paths {
	t.Helper()
	var now unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &now); err != nil {
		t.Fatal(err)
	}
	startTicks := (now.Nano() - int64(42100*time.Millisecond)) / int64(time.Second/userHZ)
	files := map[string]string{
		"memory/memory.limit_in_bytes":       "536870912\n",
		"memory/memory.usage_in_bytes":       "104857600\n",
		"memory/memory.memsw.limit_in_bytes": "536870912\n",
		"memory/memory.memsw.usage_in_bytes": "104857600\n",
		"memory/memory.stat":                 "cache 4096\nshmem 0\ntotal_cache 8192\ntotal_shmem 102400\ntotal_rss 1000\n",
		"pids.current":                       "7\n",
		// pid 1 in a child cgroup whose parent has the smaller limit.
		"cgroup":                                  "12:pids:/\n4:memory:/envd\n0::/\n",
		"memory/envd/memory.limit_in_bytes":       "9223372036854771712\n",
		"memory/envd/memory.usage_in_bytes":       "104857600\n",
		"memory/envd/memory.memsw.limit_in_bytes": "9223372036854771712\n",
		"memory/envd/memory.memsw.usage_in_bytes": "104857600\n",
		"memory/envd/memory.stat":                 "total_shmem 102400\n",
		// A command name with spaces and parentheses, as a process may pick.
		"stat": fmt.Sprintf("1 (en) vd) S 0 1 1 0 -1 4194560 1284 0 1 0 1 0 0 0 20 0 7 0 %d 1000 100\n", startTicks),
	}
	for name, body := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return paths{
		meminfo: "/proc/meminfo", memory: filepath.Join(dir, "memory"), initCgroup: filepath.Join(dir, "cgroup"),
		tasks: filepath.Join(dir, "pids.current"), procDir: "/proc", initStat: filepath.Join(dir, "stat"),
	}
}

// wantView is what fakeView's files mean as a struct sysinfo; loads are the
// host's, uptime is checked apart (at least 43: 42.1 s, rounded up).
var wantView = unix.Sysinfo_t{
	Totalram:  512 << 20,
	Freeram:   412 << 20,
	Sharedram: 100 << 10,
	Procs:     7,
	Unit:      1,
}

// checkView compares a view with wantView.
func checkView(t *testing.T, who string, got unix.Sysinfo_t) {
	t.Helper()
	if got.Uptime < 43 || got.Uptime > 43+600 {
		t.Errorf("%s: uptime %d, want 43 or a little more", who, got.Uptime)
	}
	want := wantView
	want.Uptime, want.Loads = got.Uptime, got.Loads
	if got != want {
		t.Errorf("%s got %+v\nwant %+v", who, got, want)
	}
	var host unix.Sysinfo_t
	if err := unix.Sysinfo(&host); err == nil && got.Loads[0] == 0 && host.Loads[0] != 0 {
		t.Errorf("%s: loads %v; the host's are %v", who, got.Loads, host.Loads)
	}
}

func TestReadView(t *testing.T) {
	p := fakeView(t, t.TempDir())
	got, err := readView(p)
	if err != nil {
		t.Fatal(err)
	}
	checkView(t, "readView", *got)
	// Without pids.current, the processes in /proc are counted.
	p.tasks = filepath.Join(t.TempDir(), "none")
	if got, err := readView(p); err != nil || got.Procs == 0 {
		t.Errorf("without pids.current: procs = %d, %v", got.Procs, err)
	}
	// Swap: the memsw limit above the memory limit, at most the host's.
	var host unix.Sysinfo_t
	if err := unix.Sysinfo(&host); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p.memory, "envd", "memory.memsw.limit_in_bytes"), []byte("1073741824\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := readView(p); err != nil || got.Totalswap != min(512<<20, host.Totalswap*uint64(host.Unit)) || got.Freeswap != got.Totalswap {
		t.Errorf("with a memsw limit: swap %d free %d (%v); the host has %d", got.Totalswap, got.Freeswap, err, host.Totalswap)
	}
	// No memory cgroup: an error, so the caller lets the real call run.
	p.memory = filepath.Join(t.TempDir(), "none")
	if _, err := readView(p); err == nil {
		t.Error("readView without a memory cgroup succeeded")
	}
}

// helperEnv makes the test binary a child that calls sysinfo and reports what
// it got (TestHelperProcess).
const helperEnv = "AIRLOCK_SYSINFO_HELPER"

type helperReport struct {
	Info       unix.Sysinfo_t
	Err        string
	NullErrno  int // sysinfo(NULL): the kernel answers EFAULT
	Uid        int
	CapPrm     string
	Grandchild *helperReport `json:",omitempty"`
}

// TestHelperProcess is not a test: it is the child the other tests fork.
func TestHelperProcess(t *testing.T) {
	mode := os.Getenv(helperEnv)
	if mode == "" {
		t.Skip("helper process only")
	}
	if mode == "ask" {
		// Call only when told to (a line on stdin).
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	}
	var r helperReport
	if err := unix.Sysinfo(&r.Info); err != nil {
		r.Err = err.Error()
	}
	_, _, errno := unix.Syscall(unix.SYS_SYSINFO, 0, 0, 0)
	r.NullErrno = int(errno)
	r.Uid = os.Getuid()
	st, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(st), "\n") {
		if v, ok := strings.CutPrefix(l, "CapPrm:"); ok {
			r.CapPrm = strings.TrimSpace(v)
		}
	}
	if mode == "fork" {
		// A grandchild inherits the filter from its parent, not from envd.
		out, err := helperCmd("leaf", nil).Output()
		if err != nil {
			r.Err = fmt.Sprintf("grandchild: %v", err)
		} else {
			r.Grandchild = &helperReport{}
			_ = json.Unmarshal(out, r.Grandchild)
		}
	}
	_ = json.NewEncoder(os.Stdout).Encode(r)
	os.Exit(0)
}

// The main goroutine keeps the main thread: a goroutine that exits locked to
// the main thread parks it forever instead of ending it, and onThread's
// threads must end (the main thread would keep its filter, and its
// listener would never hang up).
func init() { runtime.LockOSThread() }

// helperBin is this test binary where any uid can run it (go test's own
// directory is private to root).
var helperBin = os.Args[0]

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "" && os.Geteuid() == 0 {
		dir, err := os.MkdirTemp("", "sysinfo-test-")
		if err == nil {
			defer os.RemoveAll(dir)
			_ = os.Chmod(dir, 0o755)
			if b, err := os.ReadFile(os.Args[0]); err == nil && os.WriteFile(filepath.Join(dir, "helper"), b, 0o755) == nil {
				helperBin = filepath.Join(dir, "helper")
			}
		}
		code := m.Run()
		os.RemoveAll(dir)
		os.Exit(code)
	}
	os.Exit(m.Run())
}

func helperCmd(mode string, cred *syscall.Credential) *exec.Cmd {
	cmd := exec.Command(helperBin, "-test.run=^TestHelperProcess$")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	return cmd
}

// onThread runs fn on a fresh OS thread that ends afterwards, as
// internal/usercgroup's spare threads do, with no_new_privs set on it as in a
// sandbox.
func onThread(t *testing.T, fn func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with its filter and capabilities
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			done <- err
			return
		}
		done <- fn()
	}()
	return <-done
}

func openFDs(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

// TestHandlerAnswers: a process forked from a thread with the filter gets the
// view, written into its memory by the handler, as root, as another uid (no
// ptrace rights but ours) and in a grandchild; sysinfo(NULL) fails with
// EFAULT as in the kernel; the forked processes lack CAP_SYS_PTRACE; and the
// listener is closed once they are gone.
func TestHandlerAnswers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: writes another uid's memory and sets credentials")
	}
	p := fakeView(t, t.TempDir())
	before := openFDs(t)
	for _, tc := range []struct {
		name string
		cred *syscall.Credential
		mode string
	}{
		{"root", nil, "leaf"},
		{"nobody", &syscall.Credential{Uid: 65534, Gid: 65534}, "leaf"},
		{"grandchild", &syscall.Credential{Uid: 65534, Gid: 65534}, "fork"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out []byte
			err := onThread(t, func() error {
				if err := DropPtrace(); err != nil {
					return err
				}
				if err := attach(p); err != nil {
					return err
				}
				var err error
				out, err = helperCmd(tc.mode, tc.cred).Output()
				return err
			})
			if err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			var r helperReport
			if err := json.Unmarshal(out, &r); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			reports := []helperReport{r}
			if tc.mode == "fork" {
				if r.Grandchild == nil {
					t.Fatalf("no grandchild report: %s", r.Err)
				}
				reports = append(reports, *r.Grandchild)
			}
			for _, r := range reports {
				if r.Err != "" {
					t.Errorf("sysinfo: %s", r.Err)
				}
				checkView(t, fmt.Sprintf("uid %d", r.Uid), r.Info)
				if r.NullErrno != int(unix.EFAULT) {
					t.Errorf("sysinfo(NULL) errno = %d, want EFAULT", r.NullErrno)
				}
				if prm, err := strconv.ParseUint(r.CapPrm, 16, 64); err != nil || prm&(1<<capSysPtrace) != 0 {
					t.Errorf("uid %d has CapPrm %s: CAP_SYS_PTRACE must be dropped (%v)", r.Uid, r.CapPrm, err)
				}
			}
		})
	}
	// Every listener hangs up once its thread and processes are gone.
	deadline := time.Now().Add(10 * time.Second)
	for openFDs(t) > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := openFDs(t); n > before {
		ents, _ := os.ReadDir("/proc/self/fd")
		for _, e := range ents {
			l, _ := os.Readlink("/proc/self/fd/" + e.Name())
			t.Log(e.Name(), l)
		}

		t.Errorf("%d descriptors open after the processes ended, %d before: listeners leak", n, before)
	}
}

// TestFallbackContinues: when the view cannot be read, the real system call
// runs (the kernel's numbers) rather than failing or hanging.
func TestFallbackContinues(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	p := fakeView(t, t.TempDir())
	p.memory = filepath.Join(t.TempDir(), "missing")
	var out []byte
	err := onThread(t, func() error {
		if err := attach(p); err != nil {
			return err
		}
		var err error
		out, err = helperCmd("leaf", nil).Output()
		return err
	})
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	var r helperReport
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	var kern unix.Sysinfo_t
	if err := unix.Sysinfo(&kern); err != nil {
		t.Fatal(err)
	}
	if r.Err != "" || r.Info.Totalram != kern.Totalram {
		t.Errorf("fallback: totalram %d (%s), want the kernel's %d", r.Info.Totalram, r.Err, kern.Totalram)
	}
}

// TestFilterProgram runs the filter program on sample inputs in x/net/bpf's
// VM. The VM loads words big-endian, the kernel's seccomp native-endian, so
// the sample struct seccomp_data is written big-endian here to read the same.
func TestFilterProgram(t *testing.T) {
	vm, err := bpf.NewVM(program)
	if err != nil {
		t.Fatal(err)
	}
	const auditArchI386 = 0x40000003
	for _, tc := range []struct {
		name     string
		arch, nr uint32
		want     uint32
	}{
		{"native sysinfo", auditArch, unix.SYS_SYSINFO, unix.SECCOMP_RET_USER_NOTIF},
		{"native getpid", auditArch, unix.SYS_GETPID, unix.SECCOMP_RET_ALLOW},
		// x32's numbers carry bit 30 (__X32_SYSCALL_BIT).
		{"x32 sysinfo", auditArch, 0x40000000 | unix.SYS_SYSINFO, unix.SECCOMP_RET_ALLOW},
		// i386's sysinfo is 116; the container's own profile refuses compat calls.
		{"i386 sysinfo", auditArchI386, 116, unix.SECCOMP_RET_ALLOW},
		{"i386 with the native number", auditArchI386, unix.SYS_SYSINFO, unix.SECCOMP_RET_ALLOW},
	} {
		data := make([]byte, 64)
		binary.BigEndian.PutUint32(data[offNr:], tc.nr)
		binary.BigEndian.PutUint32(data[offArch:], tc.arch)
		got, err := vm.Run(data)
		if err != nil {
			t.Fatal(err)
		}
		if uint32(got) != tc.want {
			t.Errorf("%s: filter answers %#x, want %#x", tc.name, got, tc.want)
		}
	}
}

// TestFilterTrapsOnlySysinfo installs the filter for real.
func TestFilterTrapsOnlySysinfo(t *testing.T) {
	// A thread with the filter but no listener: sysinfo fails with ENOSYS
	// (what a trapped call does when nobody listens), everything else runs.
	err := onThread(t, func() error {
		prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
		if _, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&prog))); errno != 0 {
			return errno
		}
		var si unix.Sysinfo_t
		if err := unix.Sysinfo(&si); !errors.Is(err, unix.ENOSYS) {
			return fmt.Errorf("sysinfo under the filter without a listener: %v, want ENOSYS", err)
		}
		if unix.Getpid() <= 0 {
			return errors.New("getpid failed")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestSecondListenerRefused pins the documented side effect: under a filter
// with a listener, installing another with a listener fails with EBUSY (the
// kernel allows one per filter chain); one without a listener still works.
func TestSecondListenerRefused(t *testing.T) {
	err := onThread(t, func() error {
		if err := attach(fakeView(t, t.TempDir())); err != nil {
			return err
		}
		prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
		_, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_NEW_LISTENER, uintptr(unsafe.Pointer(&prog)))
		if errno != unix.EBUSY {
			return fmt.Errorf("a second listener: %v, want EBUSY", errno)
		}
		if _, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&prog))); errno != 0 {
			return fmt.Errorf("a second filter without a listener: %v", errno)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// seccompFDs counts this process's seccomp notification descriptors.
func seccompFDs(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && l == "anon_inode:seccomp notify" {
			n++
		}
	}
	return n
}

// TestCloseListeners: CloseListeners closes every listener (none is left
// open when it returns), and a process whose tree's listener it closed gets
// ENOSYS from sysinfo, the kernel's answer for a filter without a listener
// (what a process started before a checkpoint sees after it).
func TestCloseListeners(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: writes another process's memory")
	}
	p := fakeView(t, t.TempDir())
	// The listeners of the tests before hang up once their threads and
	// processes are gone, which their serve goroutines notice a moment
	// later (make test once found one still open).
	deadline := time.Now().Add(10 * time.Second)
	for seccompFDs(t) != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := seccompFDs(t); n != 0 {
		t.Fatalf("%d seccomp listeners of earlier tests still open after 10 s", n)
	}
	cmd := helperCmd("ask", nil)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	cmd.Stdout = &out
	err = onThread(t, func() error {
		if err := DropPtrace(); err != nil {
			return err
		}
		if err := attach(p); err != nil {
			return err
		}
		return cmd.Start()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	if n := seccompFDs(t); n != 1 {
		t.Fatalf("%d seccomp listeners with one tree", n)
	}
	if n := CloseListeners(); n != 1 {
		t.Errorf("CloseListeners closed %d, want 1", n)
	}
	if n := seccompFDs(t); n != 0 {
		t.Fatalf("%d seccomp listeners open after CloseListeners returned", n)
	}
	if n := CloseListeners(); n != 0 {
		t.Errorf("a second CloseListeners closed %d", n)
	}
	if _, err := stdin.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("helper: %v: %s", err, out.String())
	}
	var r helperReport
	if err := json.Unmarshal([]byte(out.String()), &r); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if r.Err != unix.ENOSYS.Error() || r.NullErrno != int(unix.ENOSYS) {
		t.Fatalf("sysinfo after the listener closed: %q, sysinfo(NULL) errno %d; want ENOSYS", r.Err, r.NullErrno)
	}
}
