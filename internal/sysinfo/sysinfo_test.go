//go:build amd64 || arm64

package sysinfo

import (
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

// fakeView writes a sandbox view into dir and returns its paths.
func fakeView(t *testing.T, dir string) paths {
	t.Helper()
	files := map[string]string{
		"meminfo": "MemTotal:         524288 kB\nMemFree:          400000 kB\nMemAvailable:     450000 kB\nBuffers:               12 kB\nCached:             1000 kB\nShmem:               100 kB\nSwapTotal:             0 kB\nSwapFree:              0 kB\n",
		"uptime":  "42.10 80.00\n",
		"loadavg": "0.50 1.00 2.25 1/100 4242\n",
		"tasks":   "7\n",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return paths{
		meminfo: filepath.Join(dir, "meminfo"), uptime: filepath.Join(dir, "uptime"),
		loadavg: filepath.Join(dir, "loadavg"), tasks: filepath.Join(dir, "tasks"), procDir: "/proc",
	}
}

// wantView is what fakeView's files mean as a struct sysinfo.
var wantView = unix.Sysinfo_t{
	Uptime:    43,
	Loads:     [3]uint64{1 << 15, 1 << 16, 9 << 14},
	Totalram:  512 << 20,
	Freeram:   400000 << 10,
	Sharedram: 100 << 10,
	Bufferram: 12 << 10,
	Procs:     7,
	Unit:      1,
}

func TestReadView(t *testing.T) {
	p := fakeView(t, t.TempDir())
	got, err := readView(p)
	if err != nil {
		t.Fatal(err)
	}
	if *got != wantView {
		t.Errorf("readView = %+v\nwant       %+v", *got, wantView)
	}
	// Without pids.current, the processes in /proc are counted.
	p.tasks = filepath.Join(t.TempDir(), "none")
	if got, err := readView(p); err != nil || got.Procs == 0 {
		t.Errorf("without pids.current: procs = %d, %v", got.Procs, err)
	}
	// No usable meminfo: an error, so the caller lets the real call run.
	if err := os.WriteFile(p.meminfo, []byte("nothing\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readView(p); err == nil {
		t.Error("readView accepted a meminfo without MemTotal")
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
				if r.Info != wantView {
					t.Errorf("uid %d got %+v\nwant %+v", r.Uid, r.Info, wantView)
				}
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
	p.meminfo = filepath.Join(t.TempDir(), "missing")
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
