package envd

import (
	"bufio"
	"bytes"
	"math"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Metrics is the body of GET /metrics; the host serves it as the sandbox's
// metrics (docs/E2B-WIRE.md §3.7.4).
type Metrics struct {
	Timestamp   int64   `json:"ts"`
	CPUCount    int     `json:"cpu_count"`
	CPUUsedPct  float64 `json:"cpu_used_pct"`
	MemTotal    uint64  `json:"mem_total"`
	MemUsed     uint64  `json:"mem_used"`
	MemCache    uint64  `json:"mem_cache"`
	MemTotalMiB uint64  `json:"mem_total_mib"`
	MemUsedMiB  uint64  `json:"mem_used_mib"`
	DiskUsed    uint64  `json:"disk_used"`
	DiskTotal   uint64  `json:"disk_total"`
}

// cpuSampler turns cumulative CPU counters into a utilisation percentage between
// consecutive /metrics calls, so envd needs no background sampling goroutine.
type cpuSampler struct {
	mu      sync.Mutex
	have    bool
	at      time.Time
	busy    float64 // cumulative busy time in the counter's unit
	total   float64 // cumulative wall-ish capacity in the same unit
	lastPct float64
}

// cgroupRoot is where the sandbox's own cgroup appears (cgroup namespace).
const cgroupRoot = "/sys/fs/cgroup"

func readFileString(path string) (string, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", false
	}
	return strings.TrimSpace(string(b)), true
}

// cpuLimit is the CPU count granted by cgroup cpu.max, or 0 when unlimited.
func cpuLimit() float64 {
	v, ok := readFileString(cgroupRoot + "/cpu.max")
	if !ok {
		return 0
	}
	f := strings.Fields(v)
	if len(f) != 2 || f[0] == "max" {
		return 0
	}
	quota, err1 := strconv.ParseFloat(f[0], 64)
	period, err2 := strconv.ParseFloat(f[1], 64)
	if err1 != nil || err2 != nil || period <= 0 {
		return 0
	}
	return quota / period
}

// cpuCounters returns cumulative busy and capacity. Inside a cgroup it uses the
// cgroup's usage against its CPU allowance; otherwise /proc/stat.
func cpuCounters(now time.Time, ncpu float64) (busy, total float64, ok bool) {
	if v, found := readFileString(cgroupRoot + "/cpu.stat"); found && cpuLimit() > 0 {
		for _, line := range strings.Split(v, "\n") {
			if rest, ok := strings.CutPrefix(line, "usage_usec "); ok {
				if usec, err := strconv.ParseFloat(rest, 64); err == nil {
					return usec, float64(now.UnixMicro()) * ncpu, true
				}
			}
		}
	}
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, false
	}
	line, _, _ := bytes.Cut(data, []byte{'\n'})
	f := strings.Fields(string(line))
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0, false
	}
	var sum, idle float64
	for i, s := range f[1:] {
		if i >= 8 { // guest time is already counted in user time
			break
		}
		v, _ := strconv.ParseFloat(s, 64)
		sum += v
		if i == 3 || i == 4 { // idle, iowait
			idle += v
		}
	}
	return sum - idle, sum, true
}

func (c *cpuSampler) sample(ncpu float64) float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	busy, total, ok := cpuCounters(now, ncpu)
	if !ok {
		return 0
	}
	if !c.have {
		// First call: measure over a short window instead of since boot.
		c.have, c.at, c.busy, c.total = true, now, busy, total
		c.mu.Unlock()
		time.Sleep(100 * time.Millisecond)
		c.mu.Lock()
		now = time.Now()
		if busy, total, ok = cpuCounters(now, ncpu); !ok {
			return 0
		}
	} else if now.Sub(c.at) < 50*time.Millisecond {
		return c.lastPct
	}
	db, dt := busy-c.busy, total-c.total
	pct := 0.0
	if dt > 0 {
		pct = math.Max(0, math.Min(100, 100*db/dt))
	}
	c.at, c.busy, c.total, c.lastPct = now, busy, total, pct
	return pct
}

// memory returns total, used and cache bytes, from the sandbox's cgroup when it
// has a memory limit (what the sandbox can actually use), else from /proc/meminfo.
func memory() (total, used, cache uint64) {
	if v, ok := readFileString(cgroupRoot + "/memory.max"); ok && v != "max" {
		if limit, err := strconv.ParseUint(v, 10, 64); err == nil {
			cur := uint64(0)
			if c, ok := readFileString(cgroupRoot + "/memory.current"); ok {
				cur, _ = strconv.ParseUint(c, 10, 64)
			}
			var inactive, file uint64
			if st, ok := readFileString(cgroupRoot + "/memory.stat"); ok {
				for _, line := range strings.Split(st, "\n") {
					k, val, _ := strings.Cut(line, " ")
					n, _ := strconv.ParseUint(val, 10, 64)
					switch k {
					case "inactive_file":
						inactive = n
					case "file":
						file = n
					}
				}
			}
			used := cur
			if inactive < used {
				used -= inactive
			}
			return limit, used, file
		}
	}
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, 0, 0
	}
	defer f.Close()
	vals := map[string]uint64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		n, _ := strconv.ParseUint(fields[0], 10, 64)
		vals[k] = n * 1024
	}
	total = vals["MemTotal"]
	avail, ok := vals["MemAvailable"]
	if !ok {
		avail = vals["MemFree"] + vals["Buffers"] + vals["Cached"]
	}
	if avail < total {
		used = total - avail
	}
	return total, used, vals["Cached"] + vals["Buffers"]
}

func (s *Server) collectMetrics() Metrics {
	ncpu := float64(runtime.NumCPU())
	if lim := cpuLimit(); lim > 0 && lim < ncpu {
		ncpu = lim
	}
	m := Metrics{Timestamp: time.Now().Unix(), CPUCount: int(math.Ceil(ncpu))}
	m.CPUUsedPct = math.Round(s.metrics.sample(ncpu)*100) / 100
	m.MemTotal, m.MemUsed, m.MemCache = memory()
	m.MemTotalMiB, m.MemUsedMiB = m.MemTotal>>20, m.MemUsed>>20
	disk := s.cfg.DiskPath
	if disk == "" {
		disk = "/"
	}
	var st unix.Statfs_t
	if err := unix.Statfs(disk, &st); err == nil {
		bs := uint64(st.Bsize)
		m.DiskTotal = st.Blocks * bs
		m.DiskUsed = (st.Blocks - st.Bfree) * bs
	}
	return m
}

func (s *Server) handleMetrics(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		writeJSONError(w, http.StatusMethodNotAllowed, "method not allowed")
		return
	}
	writeJSON(w, http.StatusOK, s.collectMetrics())
}
