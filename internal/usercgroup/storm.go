package usercgroup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// A fork storm is a process tree that keeps trying to create tasks at its
// leaf's task limit: an os.fork() loop whose processes die on each refused
// fork and are replaced by the survivors' next forks, a fork bomb, a thread
// loop that retries at once. On the linux runtime a storm held at its limit
// is harmless: the host scheduler gives envd's threads the CPU first (the
// users' cpu.shares are low). In a gVisor sandbox nothing can: the sentry runs
// every task's system calls and faults as goroutines on as many Go
// processors as the sandbox has CPUs (one for a 1-CPU sandbox), first come
// first served, with no priority for envd or for the command it starts.
// Measured with the os.fork() loop of the workload test at the leaf limit
// (96 tasks): about 50 goroutines wait for that one processor at any time,
// each system call or fault of envd or its command waits 13 ms (median,
// 38 ms p90) for its turn, and `echo ok` (a few hundred such turns: envd's
// request, the fork, bash's start) took 1-2.5 s on an idle host and 3-5 s on
// a loaded one. A refused fork is not cheap either: the sentry charges the
// pids controller after it has copied the address space (Task.Clone forks
// the MM before NewTask), and each dying Python process unmaps and
// finalizes. Lower task limits only shorten the queue in proportion, and host
// CPU weights cannot tell the command envd starts from the attackers (both
// are user processes whose systrap stubs come from the same pool).
//
// So on cgroup v2 (gVisor) envd's pid 1 runs GuardStorms: a leaf whose
// refused task creations (its pids.events "max" count) grow by stormHits or
// more within stormWindow is killed with cgroup.kill, as the OOM killer ends
// a process that exhausts memory. Legitimate programs that reach the limit
// fail a few creations and stop or back off (bash retries a refused fork
// after 1, 2, 4 and 8 s, then gives up; Python raises); only a loop that
// retries at once, or a crowd of retrying processes (a fork bomb), reaches
// stormHits. Measured: after the kill, `echo ok` answers in 20-80 ms again.
const (
	// stormPoll is how often the guard reads the users' pids.events; a read
	// is three system calls of pid 1.
	stormPoll = 250 * time.Millisecond
	// stormWindow and stormHits: a leaf whose refused task creations grow by
	// stormHits within stormWindow storms. One generation of the os.fork()
	// loop (every process refused once at a 96-task leaf) is about 95
	// refusals within a second; the fork bomb's first wave of retrying bashes
	// 68-96 within 2 s, the next wave a second later. A 2 s window was too
	// close to that: in one of five test runs the fork bomb's `echo ok`
	// needed a second try.
	stormWindow = 5 * time.Second
	stormHits   = 64
)

// StormKill describes a leaf GuardStorms killed.
type StormKill struct {
	Leaf    string // the leaf's name under the "user" cgroup
	Refused int64  // refused task creations within Window
	Window  time.Duration
	Err     error // the write to cgroup.kill failed: the tree may live on
}

// GuardStorms kills the user leaves under the v2 "user" cgroup (SetupV2) that
// storm (see stormHits), calling report for each, until ctx is done. It
// returns at once with an error where there is no v2 "user" cgroup.
func GuardStorms(ctx context.Context, report func(StormKill)) error {
	user := filepath.Join(root, Name)
	if !isV2(root) {
		return fmt.Errorf("usercgroup: no cgroup v2 hierarchy at %s", root)
	}
	g := &stormGuard{user: user, hist: map[string][]count{}, prev: time.Now()}
	if _, err := g.total(); err != nil {
		return err
	}
	t := time.NewTicker(stormPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			for _, k := range g.tick(now) {
				report(k)
			}
		}
	}
}

// stormGuard keeps, per leaf, the refused task creations it has read over
// the last stormWindow.
type stormGuard struct {
	user  string
	last  int64              // the users' hierarchical count at the last poll
	seen  bool               // last is set
	hist  map[string][]count // leaf name -> its counts, oldest first
	known map[string]int64   // leaf name -> its count at the last scan
	prev  time.Time          // the last poll
}

// count is a leaf's refusal count at a time.
type count struct {
	at time.Time
	n  int64
}

// total reads the users' hierarchical refusal count: every refusal in any
// leaf counts there too (gVisor's and Linux's pids.events count a refusal in
// the cgroup whose limit refused it and in all its ancestors).
func (g *stormGuard) total() (int64, error) {
	return readMaxEvents(filepath.Join(g.user, "pids.events"))
}

// tick polls once, at now, and kills the leaves that storm. The leaves are
// read only when the users' count moved: a refusal in a leaf moves it too, so
// an unmoved count means every leaf's count is still the one last read.
func (g *stormGuard) tick(now time.Time) []StormKill {
	total, err := g.total()
	if err != nil {
		return nil
	}
	moved := !g.seen || total != g.last
	g.last, g.seen = total, true
	if moved {
		g.scan()
	}
	var kills []StormKill
	for leaf, n := range g.known {
		h := g.hist[leaf]
		if h == nil {
			// A leaf first seen now was made since the last poll (the guard
			// starts before any leaf), with no refusals then.
			h = []count{{at: g.prev, n: 0}}
		}
		h = append(h, count{at: now, n: n})
		// The oldest count kept is the first one read within the last
		// stormWindow: the window is measured in time, so that polls delayed
		// by a loaded sandbox do not stretch it (and a late poll shortens it
		// rather than count refusals from before it).
		for len(h) > 1 && !h[0].at.After(now.Add(-stormWindow)) {
			h = h[1:]
		}
		g.hist[leaf] = h
		if n-h[0].n < stormHits {
			continue
		}
		k := StormKill{Leaf: leaf, Refused: n - h[0].n, Window: stormWindow}
		if err := os.WriteFile(filepath.Join(g.user, leaf, "cgroup.kill"), []byte("1"), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
			k.Err = fmt.Errorf("usercgroup: kill %s: %w", leaf, err)
		}
		// The leaf's refusals so far are dealt with; it starts over.
		g.hist[leaf] = []count{{at: now, n: n}}
		kills = append(kills, k)
	}
	for leaf := range g.hist {
		if _, ok := g.known[leaf]; !ok {
			delete(g.hist, leaf)
		}
	}
	g.prev = now
	return kills
}

// scan reads every leaf's refusal count into g.known.
func (g *stormGuard) scan() {
	entries, err := os.ReadDir(g.user)
	if err != nil {
		return
	}
	known := make(map[string]int64, len(entries))
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		n, err := readMaxEvents(filepath.Join(g.user, e.Name(), "pids.events"))
		if err != nil {
			continue // removed meanwhile
		}
		known[e.Name()] = n
	}
	g.known = known
}

// readMaxEvents reads the "max" count of a pids.events file.
func readMaxEvents(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("usercgroup: %w", err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "max "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("usercgroup: %s: %w", path, err)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("usercgroup: %s: no max count", path)
}
