package runtime

import (
	"slices"
	"testing"
)

func TestParseCPUList(t *testing.T) {
	for in, want := range map[string][]int{
		"0": {0}, "0-0": {0}, "0-2,5\n": {0, 1, 2, 5}, "": nil, "x": nil, "3-1": nil,
	} {
		if got := ParseCPUList(in); !slices.Equal(got, want) {
			t.Errorf("ParseCPUList(%q) = %v, want %v", in, got, want)
		}
	}
}

// TestCPUPickerSpreads: 1-CPU sandboxes go to the least used CPUs, not all to
// CPU 0; a released CPU is reused; a sandbox of all CPUs gets no cpuset.
func TestCPUPickerSpreads(t *testing.T) {
	// A parent with no cgroup: the CPUs are this process's.
	p := &CPUPicker{Parent: "/airlock-picker-test-none"}
	n := len(p.onlineCPUs())
	if n < 2 {
		t.Skipf("%d CPU(s): nothing to spread over", n)
	}
	a, b := p.Pick("a", 1), p.Pick("b", 0.5)
	if a == "" || b == "" || a == b {
		t.Fatalf("two 1-CPU sandboxes got cpusets %q and %q; want two different CPUs", a, b)
	}
	p.Release("a")
	if c := p.Pick("c", 1); c != a {
		t.Errorf("after a released %s, c got %q", a, c)
	}
	if all := p.Pick("d", float64(n)); all != "" {
		t.Errorf("a sandbox of all %d CPUs got cpuset %q; want none", n, all)
	}
	if none := p.Pick("e", 0); none != "" {
		t.Errorf("a sandbox without a CPU limit got cpuset %q", none)
	}
}
