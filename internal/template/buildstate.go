package template

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ErrBuilding: the template is not ready yet because this process is building it, or
// will build it soon (serve's background builds). Lookups return a *BuildingError,
// which matches ErrBuilding and ErrNotBuilt.
var ErrBuilding = errors.New("template is being built")

// BuildingError says how far the build of a template that is not ready yet has got,
// so a client can tell a person what to expect and when to retry.
type BuildingError struct {
	Name string
	// Status is where the build is: "queued behind python3", "step 2/3: RUN apt-get
	// install ...", "waiting for the layer lock held by pid 123 (...)".
	Status string
	// Since is when the build entered Status; Started when it began (zero while queued).
	Since, Started time.Time
}

func (e *BuildingError) Error() string {
	now := time.Now()
	s := fmt.Sprintf("template %s is still being built: %s (for %s", e.Name, e.Status, FormatDuration(now.Sub(e.Since)))
	if !e.Started.IsZero() {
		s += fmt.Sprintf("; build started %s ago", FormatDuration(now.Sub(e.Started)))
	}
	return s + "); retry in a few seconds"
}

// Is makes a BuildingError match ErrBuilding and, for callers that only know
// "not built", ErrNotBuilt.
func (e *BuildingError) Is(target error) bool { return target == ErrBuilding || target == ErrNotBuilt }

// RetryAfter is how long a client should wait before asking again: long enough not
// to poll a minutes-long build every second, short enough to notice the end soon.
func (e *BuildingError) RetryAfter() time.Duration { return 5 * time.Second }

// buildState is a template this process builds or is going to build.
type buildState struct {
	queued    time.Time
	started   time.Time // zero while queued
	prog      *progress // nil until the build proper starts
	waiting   string    // what the build waits for; "" when it is not waiting
	waitSince time.Time
}

// Queue records that this process will build these built-ins soon (serve builds
// them one after another in the background), so looking one up meanwhile says
// "queued" instead of "not built". A build that then fails or never runs is
// forgotten by Dequeue.
func (s *Store) Queue(names ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for _, name := range names {
		if n, err := s.resolveName(name); err == nil {
			name = n
		}
		if s.states[name] == nil {
			s.states[name] = &buildState{queued: now}
		}
	}
}

// Dequeue forgets queued builds that did not start (serve stopping, say).
func (s *Store) Dequeue(names ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, name := range names {
		if n, err := s.resolveName(name); err == nil {
			name = n
		}
		if st := s.states[name]; st != nil && st.started.IsZero() {
			delete(s.states, name)
		}
	}
}

// buildingError describes the state of a template this process builds, or nil.
func (s *Store) buildingError(name string) *BuildingError {
	s.mu.Lock()
	st := s.states[name]
	var e *BuildingError
	if st != nil {
		e = &BuildingError{Name: name, Started: st.started}
		switch {
		case st.waiting != "":
			e.Status, e.Since = "waiting for "+st.waiting, st.waitSince
		case st.prog != nil:
			// Read below, outside s.mu: the progress has a lock of its own.
		case st.started.IsZero():
			e.Status, e.Since = "queued", st.queued
			if s.current != "" {
				e.Status = "queued behind the build of " + s.current
			}
		default:
			e.Status, e.Since = "starting", st.started
		}
	}
	prog := (*progress)(nil)
	if st != nil && st.waiting == "" {
		prog = st.prog
	}
	s.mu.Unlock()
	if prog != nil {
		e.Status, e.Since = prog.snapshot()
	}
	return e
}

// beginBuild registers a build of name and returns its state; end forgets it.
func (s *Store) beginBuild(name string) (st *buildState, end func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st = s.states[name]
	if st == nil {
		st = &buildState{queued: time.Now()}
		s.states[name] = st
	}
	st.started = time.Now()
	return st, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.states[name] == st {
			delete(s.states, name)
		}
	}
}

func (s *Store) setProgress(st *buildState, p *progress) {
	s.mu.Lock()
	st.prog = p
	s.mu.Unlock()
}

// waitReport is how often a build that waits for something says so again.
var waitReport = 30 * time.Second

// waitFor marks the build as waiting for what and prints it at once, then again
// every waitReport with the time waited, until done is called: a build blocked on a
// lock must never look like a hang.
func (s *Store) waitFor(st *buildState, out *progress, what string) (done func()) {
	since := time.Now()
	s.mu.Lock()
	if st != nil {
		st.waiting, st.waitSince = what, since
	}
	s.mu.Unlock()
	out.printf("waiting for %s (since %s)", what, since.Format("15:04:05"))
	stop := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(waitReport)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				out.printf("still waiting for %s (since %s, %s)", what, since.Format("15:04:05"), FormatDuration(time.Since(since)))
			}
		}
	}()
	return func() {
		close(stop)
		<-finished
		s.mu.Lock()
		if st != nil && st.waiting == what {
			st.waiting = ""
		}
		s.mu.Unlock()
		if d := time.Since(since); d >= time.Second {
			out.printf("waited %s for %s", FormatDuration(d), what)
		}
	}
}

// waitForLock is waitFor for a file lock: what names the lock, and the message
// adds its path and whoever holds it.
func (s *Store) waitForLock(st *buildState, out *progress, what, path string) (done func()) {
	what += " " + path
	if h := lockHolders(path); h != "" {
		what += " held by " + h
	}
	return s.waitFor(st, out, what)
}

// acquireBuild takes this process's build slot (builds share the build sandbox's
// network; two cores gain nothing from running apt twice at once), saying whose
// build it waits for when the slot is taken.
func (s *Store) acquireBuild(ctx context.Context, st *buildState, name string, out *progress) (release func(), err error) {
	take := func() func() {
		s.mu.Lock()
		s.current = name
		s.mu.Unlock()
		return func() {
			s.mu.Lock()
			s.current = ""
			s.mu.Unlock()
			<-s.buildSlot
		}
	}
	select {
	case s.buildSlot <- struct{}{}:
		return take(), nil
	default:
	}
	s.mu.Lock()
	holder := s.current
	s.mu.Unlock()
	what := "the build of " + holder + " in this process to finish"
	if holder == "" {
		what = "another build in this process to finish"
	}
	done := s.waitFor(st, out, what)
	defer done()
	select {
	case s.buildSlot <- struct{}{}:
		return take(), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// lockHolders describes the processes holding a lock on path, from /proc/locks
// ("pid 123 (airlock template build python3)"), for messages about waiting. It is
// best effort: an empty string when it cannot tell.
func lockHolders(path string) string {
	fi, err := os.Stat(path)
	if err != nil {
		return ""
	}
	sys, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return ""
	}
	dev := fmt.Sprintf("%02x:%02x:%d", unix.Major(sys.Dev), unix.Minor(sys.Dev), sys.Ino)
	f, err := os.Open("/proc/locks")
	if err != nil {
		return ""
	}
	defer f.Close()
	var who []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// "1: FLOCK  ADVISORY  WRITE 1234 00:2a:5678 0 EOF"; waiters are "1: -> FLOCK ...".
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || fields[1] == "->" || fields[5] != dev {
			continue
		}
		pid, err := strconv.Atoi(fields[4])
		if err != nil || pid == os.Getpid() {
			continue
		}
		desc := "pid " + fields[4]
		if cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && len(cmd) > 0 {
			desc += " (" + shorten(strings.ReplaceAll(strings.TrimRight(string(cmd), "\x00"), "\x00", " "), 80) + ")"
		}
		who = append(who, desc)
	}
	return strings.Join(who, ", ")
}
