package linux

import (
	"path/filepath"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/airlock-sandbox/airlock/internal/lxcfs"
)

// A sandbox sees its own limits, not the host's:
//
//   - memory and the CPU count in /proc and sysfs come from lxcfs (package
//     lxcfs): its files are bound over /proc/meminfo, cpuinfo, stat, uptime,
//     swaps, diskstats and /sys/devices/system/cpu/online. lxcfs computes them
//     for the cgroup of the reader's pid-namespace init (envd) and takes the
//     smallest memory limit of that cgroup and its ancestors, so the view
//     holds when envd and the user's processes sit in child cgroups of the
//     sandbox's.
//   - the CPUs a process may run on (sched_getaffinity: GNU nproc, Python's
//     os.sched_getaffinity and len(os.sched_getaffinity(0)), Go's NumCPU,
//     Node's availableParallelism) cannot be virtualised by a filesystem; the
//     sandbox's cgroup gets a cpuset of ceil(CPUs) host CPUs (runtime.CPUPicker).
//     A cpuset is also what lxcfs counts when the reader's own cgroup has no
//     CFS quota (a child cgroup of the sandbox's), and a child cpuset can only
//     be a subset of its parent's, so the count holds there too.
//
//   - sysinfo(2) (glibc's _SC_PHYS_PAGES, `os.sysconf` of it, and /proc-less
//     tools like `busybox free`) cannot be virtualised by a filesystem either:
//     envd answers it for every process it starts, through a seccomp user
//     notification, with what lxcfs shows in /proc/meminfo and /proc/uptime,
//     computed from the same cgroup files (internal/sysinfo). That is why the
//     sandbox's root gets CAP_SYS_PTRACE (Capabilities), which envd's children
//     never keep. A process not descended from envd (a first process other
//     than envd, as in the conformance suite's probes) sees the host's.
//     gVisor's sentry answers sysinfo itself.

// viewMounts are the bind mounts of lxcfs's files into a sandbox.
func viewMounts(dir string) []specs.Mount {
	var ms []specs.Mount
	for _, f := range lxcfs.Files {
		ms = append(ms, specs.Mount{
			Source: filepath.Join(dir, f), Destination: "/" + f, Type: "bind",
			Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"},
		})
	}
	return ms
}
