//go:build amd64 || arm64

package sysinfo

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"strconv"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// paths are where the handler reads the sandbox's view; tests point them at
// files of their own.
type paths struct {
	meminfo, uptime, loadavg string
	// tasks is the sandbox cgroup's pids.current: every thread of the
	// sandbox, envd's included, as the kernel's procs counts every thread
	// of the system. procDir is counted (processes) when it is unreadable.
	tasks, procDir string
}

// procPaths is the view inside a linux-runtime sandbox: lxcfs's files bound
// over /proc, and the sandbox's own cgroup, which is the root of its cgroup
// namespace.
var procPaths = paths{
	meminfo: "/proc/meminfo",
	uptime:  "/proc/uptime",
	loadavg: "/proc/loadavg",
	tasks:   "/sys/fs/cgroup/pids/pids.current",
	procDir: "/proc",
}

// sysinfoSize is the size of struct sysinfo on 64-bit Linux (the kernel
// copies all of it, padding included).
const sysinfoSize = 112

var _ [sysinfoSize - unsafe.Sizeof(unix.Sysinfo_t{})]struct{}
var _ [unsafe.Sizeof(unix.Sysinfo_t{}) - sysinfoSize]struct{}

// readView builds the struct sysinfo the sandbox should see. Memory comes
// from the same /proc/meminfo that free, top and Python's psutil read (lxcfs
// computes it from the sandbox's memory cgroup), so that sysinfo and free
// cannot disagree; the kernel fills totalram, freeram, sharedram and
// bufferram from the very counters meminfo prints as MemTotal, MemFree,
// Shmem and Buffers. mem_unit is 1 (64-bit fields hold any size in bytes).
func readView(p paths) (*unix.Sysinfo_t, error) {
	mem, err := os.ReadFile(p.meminfo)
	if err != nil {
		return nil, fmt.Errorf("sysinfo: %w", err)
	}
	fields := map[string]uint64{}
	for line := range bytes.SplitSeq(mem, []byte("\n")) {
		name, rest, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		f := bytes.Fields(rest)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseUint(string(f[0]), 10, 64)
		if err != nil {
			continue
		}
		if len(f) > 1 && string(f[1]) == "kB" {
			v <<= 10
		}
		fields[string(name)] = v
	}
	total, ok := fields["MemTotal"]
	if !ok || total == 0 {
		return nil, fmt.Errorf("sysinfo: no MemTotal in %s", p.meminfo)
	}
	si := &unix.Sysinfo_t{
		Totalram:  total,
		Freeram:   fields["MemFree"],
		Sharedram: fields["Shmem"],
		Bufferram: fields["Buffers"],
		Totalswap: fields["SwapTotal"],
		Freeswap:  fields["SwapFree"],
		Unit:      1,
	}

	up, err := os.ReadFile(p.uptime)
	if err != nil {
		return nil, fmt.Errorf("sysinfo: %w", err)
	}
	f := bytes.Fields(up)
	if len(f) == 0 {
		return nil, fmt.Errorf("sysinfo: empty %s", p.uptime)
	}
	secs, err := strconv.ParseFloat(string(f[0]), 64)
	if err != nil {
		return nil, fmt.Errorf("sysinfo: %s: %w", p.uptime, err)
	}
	// The kernel rounds a partial second up.
	si.Uptime = int64(math.Ceil(secs))

	// loadavg is the host's (lxcfs only virtualises it with -l), exactly what
	// the kernel's sysinfo would say; read from /proc all the same, so that
	// the two follow each other if that changes. Fixed point, 16 bits of
	// fraction (SI_LOAD_SHIFT).
	if la, err := os.ReadFile(p.loadavg); err == nil {
		for i, s := range bytes.Fields(la) {
			if i == len(si.Loads) {
				break
			}
			if v, err := strconv.ParseFloat(string(s), 64); err == nil && v >= 0 {
				si.Loads[i] = uint64(math.Round(v * (1 << 16)))
			}
		}
	}
	si.Procs = uint16(min(countTasks(p), math.MaxUint16))
	return si, nil
}

// countTasks returns the sandbox's threads (pids.current), or, where that is
// unreadable, its processes.
func countTasks(p paths) uint64 {
	if b, err := os.ReadFile(p.tasks); err == nil {
		if n, err := strconv.ParseUint(string(bytes.TrimSpace(b)), 10, 64); err == nil {
			return n
		}
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

// viewMaxAge is how long one reading of the view answers every sysinfo
// call. Reading it takes two lxcfs files (about 0.75 ms here, host CPU in
// lxcfs), so a program calling sysinfo in a loop would otherwise cost that
// per call; memory and task counts this young are as good as fresh for what
// sysinfo is used for (sizing), and uptime is whole seconds.
const viewMaxAge = 100 * time.Millisecond

// viewCache is the last view read and when (monotonic), shared by every
// listener: they all read the same files.
var viewCache struct {
	sync.Mutex
	si   unix.Sysinfo_t
	p    paths
	read time.Time
}

// cachedView returns a view no older than viewMaxAge.
func cachedView(p paths) (*unix.Sysinfo_t, error) {
	viewCache.Lock()
	defer viewCache.Unlock()
	if viewCache.p == p && !viewCache.read.IsZero() && time.Since(viewCache.read) < viewMaxAge {
		si := viewCache.si
		return &si, nil
	}
	si, err := readView(p)
	if err != nil {
		return nil, err
	}
	viewCache.si, viewCache.p, viewCache.read = *si, p, time.Now()
	return si, nil
}

// viewDiffers reports whether the sandbox's /proc is a view of its own that
// sysinfo must follow: /proc/meminfo is served by lxcfs (FUSE) and readable.
// Asking the file system, not comparing numbers, also covers a sandbox whose
// memory limit is the host's size, where uptime and task counts still differ.
func viewDiffers(p paths) bool {
	var st unix.Statfs_t
	if unix.Statfs(p.meminfo, &st) != nil || st.Type != fuseMagic {
		return false
	}
	_, err := readView(p)
	return err == nil
}
