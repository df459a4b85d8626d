package linux

import (
	"bufio"
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
)

// oomKillsUnder returns how many processes the kernel has killed because the
// sandbox's memory cgroup hit its limit. libcontainer's stats carry the
// cgroup's failcnt (how often the limit was reached, which reclaim usually
// absorbs) but not the kill count, so it is read from the cgroup v1 file
// memory.oom_control ("oom_kill N", kernel >= 4.13). Zero when unknown: a
// missing counter must not fail the whole Stats sample. dir is the
// sandbox's memory cgroup.
func oomKillsUnder(dir string) int64 {
	// v1 counts a kill only in the cgroup whose limit was hit: the users'
	// processes live in descendants with limits of their own
	// (makeUserCgroups), so the whole subtree is summed.
	var n int64
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			n += readOOMKill(filepath.Join(path, "memory.oom_control"))
		}
		return nil
	})
	return n
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
