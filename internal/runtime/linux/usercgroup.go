package linux

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/usercgroup"
)

// cgroupRoot is where the host's cgroup v1 hierarchies are mounted.
const cgroupRoot = "/sys/fs/cgroup"

// makeUserCgroups creates the "user" child of a sandbox's cgroup in every
// controller of usercgroup.Controllers, before the sandbox starts: the
// sandbox's total limits stay on /airlock/<id> (libcontainer writes them),
// and "user" gets them minus envd's reserve, so that no workload of the
// sandbox's users can take the pids or memory envd needs to keep serving.
// The directory and its tasks and cgroup.procs files are given to the
// sandbox's root (the host uid of its mapped root): envd creates a leaf per
// process tree under it (internal/usercgroup). The limit files stay the
// host's, so nothing in the sandbox can raise "user" past its share, and
// nothing in the sandbox can write to /airlock/<id> itself.
func makeUserCgroups(id string, res runtime.Resources, owner int) error {
	for _, ctrl := range usercgroup.Controllers {
		dir := filepath.Join(cgroupRoot, ctrl, CgroupParent, id, usercgroup.Name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("linux runtime: user cgroup: %w", err)
		}
		var file string
		var value int64
		switch ctrl {
		case "pids":
			if res.PidsMax > 0 {
				file, value = "pids.max", usercgroup.UserPids(res.PidsMax)
			}
		case "memory":
			if res.MemoryMB > 0 {
				file, value = "memory.limit_in_bytes", usercgroup.UserMemory(res.MemoryMB<<20)
			}
		case "cpu":
			file, value = "cpu.shares", usercgroup.UserCPUShares
		}
		if file != "" {
			if err := os.WriteFile(filepath.Join(dir, file), []byte(strconv.FormatInt(value, 10)), 0); err != nil {
				return fmt.Errorf("linux runtime: user cgroup %s: %w", file, err)
			}
		}
		for _, p := range []string{dir, filepath.Join(dir, "tasks"), filepath.Join(dir, "cgroup.procs")} {
			if err := os.Chown(p, owner, owner); err != nil {
				return fmt.Errorf("linux runtime: user cgroup: %w", err)
			}
		}
	}
	return nil
}
