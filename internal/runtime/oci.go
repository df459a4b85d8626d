package runtime

import specs "github.com/opencontainers/runtime-spec/specs-go"

// ApplyToOCI adds what every OCI-based backend takes from a Spec unchanged to
// an OCI runtime spec: the bind mounts (never setuid, never devices) and the
// cgroup limits (memory without swap, CFS quota, pids).
func ApplyToOCI(s *specs.Spec, spec Spec) {
	for _, m := range spec.Mounts {
		opts := []string{"rbind", "nosuid", "nodev"}
		if m.ReadOnly {
			opts = append(opts, "ro")
		}
		s.Mounts = append(s.Mounts, specs.Mount{Source: m.Source, Destination: m.Target, Type: "bind", Options: opts})
	}
	if s.Linux == nil {
		s.Linux = &specs.Linux{}
	}
	if s.Linux.Resources == nil {
		s.Linux.Resources = &specs.LinuxResources{}
	}
	res := spec.Resources
	if res.MemoryMB > 0 {
		limit := res.MemoryMB << 20
		s.Linux.Resources.Memory = &specs.LinuxMemory{Limit: &limit, Swap: &limit}
	}
	if res.CPUs > 0 {
		period := uint64(100000)
		quota := int64(res.CPUs * float64(period))
		s.Linux.Resources.CPU = &specs.LinuxCPU{Period: &period, Quota: &quota}
	}
	if res.PidsMax > 0 {
		pids := res.PidsMax
		s.Linux.Resources.Pids = &specs.LinuxPids{Limit: &pids}
	}
}
