package linux

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strconv"

	"github.com/opencontainers/runc/libcontainer"
)

// oomKills returns how many processes the kernel has killed because the
// sandbox's memory cgroup hit its limit. libcontainer's stats carry the
// cgroup's failcnt (how often the limit was reached, which reclaim usually
// absorbs) but not the kill count, so it is read from the cgroup v1 file
// memory.oom_control ("oom_kill N", kernel >= 4.13). Zero when unknown: a
// missing counter must not fail the whole Stats sample.
func oomKills(c *libcontainer.Container) int64 {
	st, err := c.State()
	if err != nil {
		return 0
	}
	dir, ok := st.CgroupPaths["memory"]
	if !ok {
		return 0
	}
	return readOOMKill(filepath.Join(dir, "memory.oom_control"))
}

func readOOMKill(path string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if v, ok := bytes.CutPrefix(sc.Bytes(), []byte("oom_kill ")); ok {
			n, err := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
			if err == nil {
				return n
			}
		}
	}
	return 0
}
