//go:build amd64 || arm64

package sysinfo

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// paths are where the handler reads the sandbox's view; tests point them at
// files of their own.
type paths struct {
	// meminfo is only looked at to decide whether to trap at all (Enabled):
	// lxcfs's view of it is what sysinfo must agree with.
	meminfo string
	// memory is the sandbox's v1 memory hierarchy (the root of its cgroup
	// namespace); initCgroup is /proc/1/cgroup, which names the cgroup in it
	// that lxcfs computes /proc/meminfo for: pid 1's (envd's, which is the
	// root, unless something moved it).
	memory, initCgroup string
	// tasks is the sandbox cgroup's pids.current: every thread of the
	// sandbox, envd's included, as the kernel's procs counts every thread
	// of the system. procDir is counted (processes) when it is unreadable.
	tasks, procDir string
	// initStat is /proc/1/stat: lxcfs's uptime is the age of the
	// sandbox's pid 1.
	initStat string
}

// procPaths is the view inside a linux-runtime sandbox.
var procPaths = paths{
	meminfo:    "/proc/meminfo",
	memory:     "/sys/fs/cgroup/memory",
	initCgroup: "/proc/1/cgroup",
	tasks:      "/sys/fs/cgroup/pids/pids.current",
	procDir:    "/proc",
	initStat:   "/proc/1/stat",
}

// sysinfoSize is the size of struct sysinfo on 64-bit Linux (the kernel
// copies all of it, padding included).
const sysinfoSize = 112

var _ [sysinfoSize - unsafe.Sizeof(unix.Sysinfo_t{})]struct{}
var _ [unsafe.Sizeof(unix.Sysinfo_t{}) - sysinfoSize]struct{}

// readView builds the struct sysinfo the sandbox should see: the numbers
// lxcfs prints in its /proc/meminfo and /proc/uptime (what free, top and
// psutil read), computed the way lxcfs 5 computes them, from the same
// sources, without going through lxcfs:
//
//	totalram  MemTotal  the smallest limit of pid 1's memory cgroup and its
//	                    ancestors (at most the host's RAM)
//	freeram   MemFree   the limit minus memory.usage_in_bytes
//	sharedram Shmem     total_shmem of memory.stat
//	bufferram Buffers   0 (lxcfs prints 0)
//	totalswap SwapTotal memsw limit minus the memory limit, at most the host's swap
//	freeswap  SwapFree  that minus the swap in use (memsw usage minus usage)
//	uptime    /proc/uptime  the age of pid 1 (CLOCK_BOOTTIME minus its start time)
//	loads               the host's, as lxcfs passes /proc/loadavg through
//	procs               the sandbox's pids.current
//
// lxcfs is a FUSE daemon on the host: a read of its meminfo and uptime costs
// 0.75 ms when warm and 2-3 ms after a pause (host CPU, outside the sandbox's
// limits), and bash calls sysinfo once per process (glibc's qsort asks for
// _SC_PHYS_PAGES), so every command would pay that. These cgroup and proc
// files take microseconds. TestConformance/EnvdSysinfo checks that the two
// agree. mem_unit is 1 (64-bit fields hold any size in bytes).
//
// envd's own threads are not trapped (only spare threads, locked to their
// goroutine, carry the filter), so the kernel's sysinfo here is the host's.
func readView(p paths) (*unix.Sysinfo_t, error) {
	var host unix.Sysinfo_t
	if err := unix.Sysinfo(&host); err != nil {
		return nil, fmt.Errorf("sysinfo: the kernel's: %w", err)
	}
	unit := uint64(max(host.Unit, 1))
	cg, err := initMemoryCgroup(p)
	if err != nil {
		return nil, err
	}
	limit := uint64(math.MaxUint64)
	for d := cg; ; d = filepath.Dir(d) {
		l, err := readUint(filepath.Join(d, "memory.limit_in_bytes"))
		if err != nil {
			return nil, err
		}
		limit = min(limit, l)
		if d == p.memory {
			break
		}
	}
	usage, err := readUint(filepath.Join(cg, "memory.usage_in_bytes"))
	if err != nil {
		return nil, err
	}
	total := min(limit, host.Totalram*unit)
	si := &unix.Sysinfo_t{
		Totalram: total,
		Freeram:  total - min(usage, total),
		Loads:    host.Loads,
		Unit:     1,
	}
	if st, err := os.ReadFile(filepath.Join(cg, "memory.stat")); err == nil {
		si.Sharedram = statField(st, "total_shmem")
	}
	// No memsw files (swap accounting off): no swap, as lxcfs shows then.
	if swLimit, err := readUint(filepath.Join(cg, "memory.memsw.limit_in_bytes")); err == nil && swLimit > limit {
		si.Totalswap = min(swLimit-limit, host.Totalswap*unit)
		if swUsage, err := readUint(filepath.Join(cg, "memory.memsw.usage_in_bytes")); err == nil {
			si.Freeswap = si.Totalswap - min(swUsage-min(usage, swUsage), si.Totalswap)
		}
	}
	up, err := uptime(p.initStat)
	if err != nil {
		return nil, err
	}
	si.Uptime = up
	si.Procs = uint16(min(countTasks(p), math.MaxUint16))
	return si, nil
}

// initMemoryCgroup returns the directory of pid 1's v1 memory cgroup, from
// its "<id>:memory:/<path>" line in /proc/1/cgroup (relative to the cgroup
// namespace's root, which is where the hierarchy is mounted).
func initMemoryCgroup(p paths) (string, error) {
	b, err := os.ReadFile(p.initCgroup)
	if err != nil {
		return "", fmt.Errorf("sysinfo: %w", err)
	}
	for line := range bytes.SplitSeq(b, []byte("\n")) {
		f := bytes.SplitN(line, []byte(":"), 3)
		if len(f) != 3 {
			continue
		}
		for c := range bytes.SplitSeq(f[1], []byte(",")) {
			if string(c) == "memory" {
				rel := filepath.Clean("/" + string(f[2]))
				return filepath.Join(p.memory, rel), nil
			}
		}
	}
	return "", fmt.Errorf("sysinfo: no memory cgroup in %s", p.initCgroup)
}

// userHZ is the unit of /proc/<pid>/stat's start time: USER_HZ, 100 on every
// architecture Linux runs Go on (sysconf(_SC_CLK_TCK)).
const userHZ = 100

var initStart struct {
	sync.Mutex
	path  string
	ticks uint64
}

// uptime is the sandbox's uptime in whole seconds, rounded up as the kernel
// does: the time since its pid 1 started, which is what lxcfs's /proc/uptime
// says. pid 1 never changes, so its start time is read once.
func uptime(initStat string) (int64, error) {
	initStart.Lock()
	defer initStart.Unlock()
	if initStart.path != initStat {
		b, err := os.ReadFile(initStat)
		if err != nil {
			return 0, fmt.Errorf("sysinfo: %w", err)
		}
		// The fields after the command name, which may hold spaces and
		// parentheses: starttime is the 22nd field, the 20th after it.
		i := bytes.LastIndexByte(b, ')')
		f := bytes.Fields(b[i+1:])
		if i < 0 || len(f) < 20 {
			return 0, fmt.Errorf("sysinfo: %s: no start time", initStat)
		}
		ticks, err := strconv.ParseUint(string(f[19]), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("sysinfo: %s: %w", initStat, err)
		}
		initStart.path, initStart.ticks = initStat, ticks
	}
	var now unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &now); err != nil {
		return 0, fmt.Errorf("sysinfo: CLOCK_BOOTTIME: %w", err)
	}
	age := time.Duration(now.Nano()) - time.Duration(initStart.ticks)*(time.Second/userHZ)
	return int64(math.Ceil(max(age, 0).Seconds())), nil
}

func readUint(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("sysinfo: %w", err)
	}
	n, err := strconv.ParseUint(string(bytes.TrimSpace(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("sysinfo: %s: %w", path, err)
	}
	return n, nil
}

// statField returns a field of a memory.stat file (0 if absent).
func statField(st []byte, name string) uint64 {
	for line := range bytes.SplitSeq(st, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte(name+" ")); ok {
			n, _ := strconv.ParseUint(string(bytes.TrimSpace(v)), 10, 64)
			return n
		}
	}
	return 0
}

// countTasks returns the sandbox's threads (pids.current), or, where that is
// unreadable, its processes.
func countTasks(p paths) uint64 {
	if n, err := readUint(p.tasks); err == nil {
		return n
	}
	entries, err := os.ReadDir(p.procDir)
	if err != nil {
		return 0
	}
	var n uint64
	for _, e := range entries {
		if name := e.Name(); name[0] >= '0' && name[0] <= '9' {
			n++
		}
	}
	return n
}

// bytesOf is the struct sysinfo as the caller's memory must hold it (the
// architectures with a filter are little-endian LP64, which is Go's layout of
// unix.Sysinfo_t there).
func bytesOf(si *unix.Sysinfo_t) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(si)), sysinfoSize)
}

// fuseMagic is statfs's f_type of a FUSE file system (lxcfs).
const fuseMagic = 0x65735546

// viewDiffers reports whether the sandbox's /proc is a view of its own that
// sysinfo must follow: /proc/meminfo is served by lxcfs (FUSE), and the
// cgroup files the view is computed from are readable. Asking the file
// system, not comparing numbers, also covers a sandbox whose memory limit is
// the host's size, where uptime and task counts still differ.
func viewDiffers(p paths) bool {
	var st unix.Statfs_t
	if unix.Statfs(p.meminfo, &st) != nil || st.Type != fuseMagic {
		return false
	}
	_, err := readView(p)
	return err == nil
}
