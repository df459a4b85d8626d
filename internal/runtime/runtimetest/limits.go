package runtimetest

import (
	"math"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/runtime"
)

// limitsProbe reports, for each round, what the usual tools say about the
// sandbox's memory and CPUs. Round 2 starts when the host touches /out/again
// (after Harness.Rehome moved the sandbox's processes).
const limitsProbe = `
set +e
report() {
	d=/out/$1; mkdir -p $d
	awk '/^MemTotal:/{print $2}' /proc/meminfo > $d/meminfo_kb
	free -m | awk '/^Mem:/{print $2}' > $d/free_mb
	top -b -n 1 | awk '/MiB Mem/{print int($4)}' > $d/top_mb
	nproc > $d/nproc
	getconf _NPROCESSORS_ONLN > $d/getconf
	cat /sys/devices/system/cpu/online > $d/cpu_online
	grep -c '^processor' /proc/cpuinfo > $d/cpuinfo
	grep -c '^cpu[0-9]' /proc/stat > $d/stat_cpus
	python3 -c 'import os; print(os.cpu_count())' > $d/py_cpu_count
	python3 -c 'import os; print(len(os.sched_getaffinity(0)))' > $d/py_affinity
	python3 -c 'import os; print(os.sysconf("SC_NPROCESSORS_ONLN"))' > $d/py_nproc_onln
	awk '{print int($1)}' /proc/uptime > $d/uptime
	touch $d/done
}
report 1
while [ ! -e /out/again ]; do sleep 0.05; done
report 2
exec sleep 100000
`

// testOwnLimits: inside a sandbox of 512 MB and 1 CPU, free, top,
// /proc/meminfo, nproc, getconf, /proc/cpuinfo and /proc/stat, sysfs's
// cpu/online and Python's os.cpu_count, sched_getaffinity and sysconf report
// 512 MiB and 1 CPU, not the host's; and still do once the sandbox's processes
// sit in child cgroups of its own (Harness.Rehome). sysinfo(2) (glibc's
// SC_PHYS_PAGES) is checked by testEnvdSysinfo, in processes envd starts:
// on the linux backend it is envd that answers it.
func testOwnLimits(t *testing.T, h Harness) {
	r := h.New(t)
	spec, out := newSpec(t, h)
	spec.Init.Args = []string{"/bin/sh", "-c", limitsProbe}
	spec.Resources = runtime.Resources{CPUs: 1, MemoryMB: 512, PidsMax: 256}
	sb := create(t, r, spec)
	check := func(round string) {
		t.Helper()
		dir := filepath.Join(out, round)
		waitFile(t, filepath.Join(dir, "done"))
		memMB := func(name string, scale float64) {
			t.Helper()
			v, err := strconv.ParseFloat(read(t, dir, name), 64)
			if err != nil {
				t.Errorf("round %s: %s: %v", round, name, err)
				return
			}
			// free/top round; lxcfs and gVisor report the limit itself.
			if mb := v * scale; math.Abs(mb-512) > 2 {
				t.Errorf("round %s: %s says %.0f MiB of memory; the sandbox has 512", round, name, mb)
			}
		}
		memMB("meminfo_kb", 1.0/1024)
		memMB("free_mb", 1)
		memMB("top_mb", 1)
		for _, name := range []string{"nproc", "getconf", "cpuinfo", "stat_cpus", "py_cpu_count", "py_affinity", "py_nproc_onln"} {
			if got := read(t, dir, name); got != "1" {
				t.Errorf("round %s: %s says %q CPUs; the sandbox has 1", round, name, got)
			}
		}
		if got := read(t, dir, "cpu_online"); len(runtime.ParseCPUList(got)) != 1 {
			t.Errorf("round %s: /sys/devices/system/cpu/online = %q; want one CPU", round, got)
		}
		// A fresh sandbox's uptime, not the host's.
		if up, _ := strconv.Atoi(read(t, dir, "uptime")); up > 60 {
			t.Errorf("round %s: /proc/uptime says %d s; the sandbox is seconds old", round, up)
		}
	}
	check("1")
	if h.Rehome == nil {
		return
	}
	h.Rehome(t, sb)
	if err := os.WriteFile(filepath.Join(out, "again"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	check("2")
}
