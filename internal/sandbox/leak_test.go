package sandbox_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/mountutil"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// resources counts what a sandbox can leave behind on the host. Other tests
// and programs may run beside this one, so everything counted is attributable
// to this test: mounts under its data dir, cgroups and processes of the
// sandboxes it created, network namespaces held by processes of its own
// process tree, and sandbox dirs in its data dir.
type resources struct {
	mounts, cgroups, netns, procs, dirs int
}

func count(t *testing.T, dataDir string, ids []string) resources {
	t.Helper()
	var r resources
	r.mounts = len(mountutil.MountedUnder(dataDir))
	cgroupDirs, _ := filepath.Glob("/sys/fs/cgroup/*/airlock/*")
	for _, d := range cgroupDirs {
		for _, id := range ids {
			if filepath.Base(d) == id {
				r.cgroups++
			}
		}
	}
	netns := map[string]bool{}
	me := strconv.Itoa(os.Getpid())
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		if _, err := strconv.Atoi(p.Name()); err != nil {
			continue
		}
		cg, _ := os.ReadFile(filepath.Join("/proc", p.Name(), "cgroup"))
		stat, _ := os.ReadFile(filepath.Join("/proc", p.Name(), "stat"))
		ours := isChildOf(string(stat), me)
		for _, id := range ids {
			ours = ours || strings.Contains(string(cg), "/airlock/"+id+"\n")
		}
		if !ours {
			continue
		}
		r.procs++
		if ns, err := os.Readlink(filepath.Join("/proc", p.Name(), "ns", "net")); err == nil {
			netns[ns] = true
		}
	}
	r.netns = len(netns)
	entries, _ := os.ReadDir(filepath.Join(dataDir, "sandboxes"))
	for _, e := range entries {
		if e.IsDir() {
			r.dirs++
		}
	}
	return r
}

// isChildOf reports whether a /proc/<pid>/stat line has parent pid ppid. The
// command name field may contain spaces, so parse after its closing paren.
func isChildOf(stat, ppid string) bool {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return false
	}
	f := strings.Fields(stat[i+1:])
	return len(f) > 1 && f[1] == ppid
}

// TestNoLeaksAfter50Cycles creates and kills 50 sandboxes and checks that the
// host is back where it started: no mounts, cgroups, network namespaces,
// processes or upper dirs left.
func TestNoLeaksAfter50Cycles(t *testing.T) {
	r := newRig(t)
	m := r.manager(t, 0)
	ctx := context.Background()
	before := count(t, r.dataDir, nil)
	var ids []string
	for i := 0; i < 50; i++ {
		info := create(t, m, time.Minute)
		ids = append(ids, info.ID)
		if i%10 == 0 {
			// Some cycles do work that spawns processes, so teardown has more
			// to do than kill an idle envd.
			run(t, m, info, "sleep 1000 & echo started")
		}
		during := count(t, r.dataDir, []string{info.ID})
		if during.cgroups == 0 || during.mounts == 0 || during.procs == 0 {
			t.Fatalf("counting is blind: a live sandbox shows %+v", during)
		}
		if err := m.Kill(ctx, info.ID); err != nil {
			t.Fatal(err)
		}
	}
	after := count(t, r.dataDir, ids)
	if after != before {
		t.Fatalf("after 50 create/kill cycles the host holds %+v, before %+v", after, before)
	}
	if list, _ := m.List(ctx, sandbox.ListFilter{}); len(list) != 0 {
		t.Fatalf("manager still lists %d sandboxes", len(list))
	}
}
