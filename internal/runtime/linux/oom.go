package linux

import (
	"io/fs"
	"path/filepath"
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
			n += cgroupKey(filepath.Join(path, "memory.oom_control"), "oom_kill")
		}
		return nil
	})
	return n
}
