// Package lxcfs gives sandboxes of the linux runtime their own view of /proc:
// lxcfs (Debian's `lxcfs`, a FUSE filesystem) serves meminfo, cpuinfo, stat,
// uptime, swaps and diskstats, and /sys/devices/system/cpu/online, computed for
// the cgroup of the reader's pid-namespace init, and the runtime binds those
// files over the sandbox's own. `free`, `top`, `nproc`-like tools that read
// /proc or sysfs (glibc's _SC_NPROCESSORS_ONLN, Python's os.cpu_count) then
// report the sandbox's memory limit and CPUs, not the host's.
//
// One lxcfs serves every sandbox of the machine, at Debian's own mount point
// (/var/lib/lxcfs), so an lxcfs started by systemd's lxcfs.service is used as
// it is. Where none runs (no systemd: `sudo make run`, CI), Ensure starts one,
// detached from the caller: sandboxes outlive `airlock serve`, and their bound
// /proc files would read ENOTCONN the moment their lxcfs exited. Nothing stops
// it; a later Ensure (every sandbox create) finds a dead one, lazily unmounts it
// and starts a new one, so later sandboxes are served again. Sandboxes created
// while the old one ran keep failing reads of those files until they end:
// a bind mount cannot be moved onto the new FUSE connection.
package lxcfs

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultDir is Debian's lxcfs mount point (lxcfs.service mounts there).
const DefaultDir = "/var/lib/lxcfs"

// Files are the paths lxcfs serves that a sandbox gets, relative to the mount
// point; each is bound at "/"+path inside. Left out: proc/loadavg (only
// virtualised with `lxcfs -l`, a thread walking every cgroup every few
// seconds; without it lxcfs passes the host's through) and proc/slabinfo
// (root-only, and nothing sizes itself from it).
var Files = []string{
	"proc/meminfo", "proc/cpuinfo", "proc/stat", "proc/uptime", "proc/swaps", "proc/diskstats",
	"sys/devices/system/cpu/online",
}

// fuseMagic is statfs's f_type of a FUSE mount.
const fuseMagic = 0x65735546

// Service is one lxcfs mount point, started by Ensure if needed.
type Service struct {
	Dir string
	// Bin is the lxcfs executable; empty means "lxcfs" on PATH.
	Bin string
	// PidFile is where a started lxcfs writes its pid (lxcfs locks it, so
	// each mount point needs its own); empty means /run/airlock-lxcfs.pid for
	// DefaultDir, else /run/airlock-lxcfs-<hash of Dir>.pid.
	PidFile string
	Log     *slog.Logger

	mu sync.Mutex
}

// Ensure makes sure a live lxcfs serves s.Dir, starting one if needed. It is
// cheap when one does (a statfs and a stat through FUSE), so callers run it
// before every sandbox they create.
func (s *Service) Ensure() error {
	if s.live() == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// Several processes (a server, a template build, tests) may get here at
	// once; one starts lxcfs, the others then find it live.
	lock, err := os.OpenFile("/run/airlock-lxcfs.lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("lxcfs: lock: %w", err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("lxcfs: lock: %w", err)
	}
	if s.live() == nil {
		return nil
	}
	return s.start()
}

// live reports why s.Dir is not a working lxcfs mount, or nil.
func (s *Service) live() error {
	var st unix.Statfs_t
	if err := unix.Statfs(s.Dir, &st); err != nil {
		return fmt.Errorf("lxcfs: %s: %w", s.Dir, err)
	}
	if st.Type != fuseMagic {
		return fmt.Errorf("lxcfs: nothing is mounted on %s", s.Dir)
	}
	// A mount whose daemon died answers ENOTCONN to everything.
	if _, err := os.Stat(filepath.Join(s.Dir, "proc", "meminfo")); err != nil {
		return fmt.Errorf("lxcfs: %s does not answer: %w", s.Dir, err)
	}
	return nil
}

func (s *Service) start() error {
	bin := s.Bin
	if bin == "" {
		bin = "lxcfs"
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return fmt.Errorf("lxcfs: %w (install Debian's lxcfs: scripts/setup.sh)", err)
	}
	// A dead daemon leaves its mount behind: ENOTCONN for every access, and
	// lxcfs refuses to mount over it. MNT_DETACH, because sandboxes may still
	// hold files of it bound.
	var st unix.Statfs_t
	if err := unix.Statfs(s.Dir, &st); errors.Is(err, syscall.ENOTCONN) || (err == nil && st.Type == fuseMagic) {
		if err := unix.Unmount(s.Dir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("lxcfs: unmount the dead mount on %s: %w", s.Dir, err)
		}
		if s.Log != nil {
			s.Log.Warn("lxcfs: the mount's daemon was gone; starting a new one (older sandboxes keep the dead views)", "dir", s.Dir)
		}
	}
	if err := os.MkdirAll(s.Dir, 0o755); err != nil {
		return fmt.Errorf("lxcfs: %w", err)
	}
	// --enable-cfs: the CPU count (cpuinfo, stat, cpu/online) follows the CFS
	// quota as well as the cpuset, and /proc/stat shows the cgroup's own CPU
	// time. lxcfs always runs in the foreground (it passes -f to FUSE), so it
	// is started, not run; Setsid keeps it out of our session (a ^C to
	// `airlock serve` does not reach it) and nothing ties its life to ours.
	// Its output goes to a file beside the pid file, not a pipe that would
	// break when we exit.
	logf, err := os.OpenFile(strings.TrimSuffix(s.pidFile(), ".pid")+".log", os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("lxcfs: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(path, "--enable-cfs", "--pidfile", s.pidFile(), s.Dir)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("lxcfs: %s: %w", cmd, err)
	}
	exited := make(chan error, 1)
	// Reaped by us while we live, by the host's init after.
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := s.live()
		if err == nil {
			if s.Log != nil {
				s.Log.Info("lxcfs: started", "dir", s.Dir, "pid", cmd.Process.Pid)
			}
			return nil
		}
		select {
		case werr := <-exited:
			out, _ := os.ReadFile(logf.Name())
			return fmt.Errorf("lxcfs: %s exited: %v: %s", cmd, werr, tail(out))
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			out, _ := os.ReadFile(logf.Name())
			return fmt.Errorf("%w (5 s after starting %s: %s)", err, cmd, tail(out))
		}
	}
}

func (s *Service) pidFile() string {
	if s.PidFile != "" {
		return s.PidFile
	}
	if filepath.Clean(s.Dir) == DefaultDir {
		return "/run/airlock-lxcfs.pid"
	}
	h := sha256.Sum256([]byte(filepath.Clean(s.Dir)))
	return "/run/airlock-lxcfs-" + hex.EncodeToString(h[:6]) + ".pid"
}

// Pid returns the pid of the lxcfs this service started (or an earlier one
// with the same pid file), or 0.
func (s *Service) Pid() int {
	b, err := os.ReadFile(s.pidFile())
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

func tail(b []byte) string {
	const n = 2000
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
