package runtime

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// CPUPicker spreads sandboxes over the host's CPUs: a sandbox of n < all CPUs
// gets the n CPUs that the fewest other sandboxes have, so 1-CPU sandboxes are
// not all pinned to CPU 0. Their CFS quota still bounds them; the cpuset only
// makes the count they see true and keeps their threads (sized by that count)
// from spreading over CPUs they cannot use. A sandbox that asks for at least
// all CPUs gets no cpuset of its own.
//
// A backend makes one per cgroup parent (the parent of its sandboxes' cgroups).
type CPUPicker struct {
	// Parent is the cgroup path under which the sandboxes' cgroups are
	// ("/airlock").
	Parent string

	mu sync.Mutex
	// users counts, per host CPU, the sandboxes of this runtime pinned to it;
	// seeded from the cgroups of sandboxes found at the first pick (they may
	// have been made by an earlier server).
	users  map[int]int
	byID   map[string][]int
	seeded bool
}

// cpusetRoots are where a sandbox's cpuset cgroup can be: cgroup v1's cpuset
// hierarchy, or the unified one.
var cpusetRoots = []string{"/sys/fs/cgroup/cpuset", "/sys/fs/cgroup"}

// onlineCPUs are the CPUs sandboxes may use: those of Airlock's cgroup parent
// when it has a cpuset (an operator may restrict it), else this process's.
func (p *CPUPicker) onlineCPUs() []int {
	for _, root := range cpusetRoots {
		for _, f := range []string{"cpuset.cpus.effective", "cpuset.cpus"} {
			if b, err := os.ReadFile(filepath.Join(root, p.Parent, f)); err == nil {
				if cpus := ParseCPUList(string(b)); len(cpus) > 0 {
					return cpus
				}
			}
		}
	}
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil
	}
	var cpus []int
	for i := 0; i < len(set)*64; i++ {
		if set.IsSet(i) {
			cpus = append(cpus, i)
		}
	}
	return cpus
}

// Pick returns the cpuset ("0,3") for a sandbox of id with the CPU quota
// cpus, or "" for no cpuset of its own.
func (p *CPUPicker) Pick(id string, cpus float64) string {
	online := p.onlineCPUs()
	n := int(math.Ceil(cpus))
	if cpus <= 0 || len(online) == 0 || n >= len(online) {
		return ""
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.seeded {
		p.seed()
	}
	order := slices.Clone(online)
	// Fewest users first; ties to the lower CPU number (stable sort).
	slices.SortStableFunc(order, func(a, b int) int { return p.users[a] - p.users[b] })
	chosen := order[:n]
	slices.Sort(chosen)
	for _, c := range chosen {
		p.users[c]++
	}
	p.byID[id] = chosen
	strs := make([]string, len(chosen))
	for i, c := range chosen {
		strs[i] = strconv.Itoa(c)
	}
	return strings.Join(strs, ",")
}

// Release forgets id's CPUs (Destroy).
func (p *CPUPicker) Release(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.byID[id] {
		p.users[c]--
	}
	delete(p.byID, id)
}

// seed counts the cpusets of the sandbox cgroups that exist now.
func (p *CPUPicker) seed() {
	p.users, p.byID, p.seeded = map[int]int{}, map[string][]int{}, true
	all := len(p.onlineCPUs())
	for _, root := range cpusetRoots {
		entries, err := os.ReadDir(filepath.Join(root, p.Parent))
		if err != nil {
			continue
		}
		for _, e := range entries {
			if !e.IsDir() {
				continue
			}
			b, err := os.ReadFile(filepath.Join(root, p.Parent, e.Name(), "cpuset.cpus"))
			if err != nil {
				continue
			}
			cpus := ParseCPUList(string(b))
			if len(cpus) == 0 || len(cpus) >= all {
				continue
			}
			for _, c := range cpus {
				p.users[c]++
			}
			p.byID[e.Name()] = cpus
		}
		return
	}
}

// ParseCPUList parses the kernel's CPU list format ("0-2,5"; "0-0" is CPU 0);
// nil when malformed.
func ParseCPUList(s string) []int {
	var out []int
	for _, part := range strings.Split(strings.TrimSpace(s), ",") {
		if part == "" {
			continue
		}
		lo, hi, found := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return nil
		}
		b := a
		if found {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil
			}
		}
		for c := a; c <= b; c++ {
			out = append(out, c)
		}
	}
	return out
}
