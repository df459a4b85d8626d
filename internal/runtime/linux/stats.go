package linux

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/airlock-sandbox/airlock/internal/runtime"
)

// Stats reads what the manager samples: CPU time, memory, pids and OOM kills
// from the sandbox's cgroups, and the writable layer's size by walking it.
func (s *sandbox) Stats() (runtime.Stats, error) {
	out, err := s.ResourceStats()
	if err != nil {
		return out, err
	}
	out.WritableBytes = runtime.DiskUsage(s.upperDir())
	return out, nil
}

// ResourceStats is Stats without the writable layer's size
// (runtime.ResourceStatter). It reads six small cgroup files directly:
// libcontainer's Stats reads every statistic of every controller (some forty
// files here), and the manager samples every live sandbox, so at a thousand
// sandboxes that was a share of the host's CPU that grew with their number.
func (s *sandbox) ResourceStats() (runtime.Stats, error) {
	if s.c == nil {
		return runtime.Stats{}, fmt.Errorf("linux runtime: stats: sandbox %s is released", s.id)
	}
	dir := func(ctrl string) string { return filepath.Join(cgroupRoot, ctrl, CgroupParent, s.id) }
	out := runtime.Stats{Time: time.Now()}
	cpu, err := readCgroupInt(filepath.Join(dir("cpuacct"), "cpuacct.usage"))
	if err != nil {
		return runtime.Stats{}, fmt.Errorf("linux runtime: stats: %w", err)
	}
	out.CPUUsage = time.Duration(cpu)
	mem := dir("memory")
	usage, err := readCgroupInt(filepath.Join(mem, "memory.usage_in_bytes"))
	if err != nil {
		return runtime.Stats{}, fmt.Errorf("linux runtime: stats: %w", err)
	}
	if out.MemoryLimit, err = readCgroupInt(filepath.Join(mem, "memory.limit_in_bytes")); err != nil {
		return runtime.Stats{}, fmt.Errorf("linux runtime: stats: %w", err)
	}
	// The usage counts the "user" child's pages too (use_hierarchy), so the
	// cache is the subtree's: total_cache.
	out.MemoryCache = cgroupKey(filepath.Join(mem, "memory.stat"), "total_cache")
	out.MemoryUsed = usage - out.MemoryCache
	if out.MemoryUsed < 0 {
		out.MemoryUsed = usage
	}
	if out.Pids, err = readCgroupInt(filepath.Join(dir("pids"), "pids.current")); err != nil {
		return runtime.Stats{}, fmt.Errorf("linux runtime: stats: %w", err)
	}
	out.OOMKills = oomKillsUnder(mem)
	return out, nil
}

func readCgroupInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return v, nil
}

// cgroupKey is the value of key in a cgroup file of "key value" lines
// (memory.stat, memory.oom_control); 0 when absent or unreadable: a missing
// counter must not fail a whole sample.
func cgroupKey(path, key string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := bytes.Cut(sc.Bytes(), []byte(" "))
		if !ok || string(k) != key {
			continue
		}
		if n, err := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64); err == nil {
			return n
		}
	}
	return 0
}
