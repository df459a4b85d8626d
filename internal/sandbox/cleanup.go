package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/runtime"
)

// undo is a sandbox's cleanup stack. Every step that acquires something for
// the sandbox pushes the named closer that gives it back, and teardown replays
// the stack newest first. Kill, a create that fails at any step, a pooled
// sandbox that is dropped and Recover (for a sandbox that did not survive the
// restart) all replay the same stack, so there is one teardown, and a step
// added to create cannot be forgotten by one of them.
//
// It belongs to whoever holds the entry exclusively: its creator before the
// entry is published, then the holder of entry.op.
type undo struct {
	steps []closer
}

type closer struct {
	name string
	fn   func(context.Context) error
}

// Names of the closers, for logs and for callers that treat one apart.
const (
	stepRecord  = "record"  // the store's record (and its events)
	stepDir     = "dir"     // the sandbox dir and its disk-quota subvolume
	stepNetwork = "network" // netns, veth, firewall state, resolv.conf
	stepLog     = "log"     // envd's log file
	stepRuntime = "runtime" // processes, mounts, cgroups, namespaces (runtime.Sandbox.Destroy)
	stepPaused  = "paused"  // a paused sandbox's checkpoint image (<data>/paused/<id>)
)

func (u *undo) push(name string, fn func(context.Context) error) {
	u.steps = append(u.steps, closer{name: name, fn: fn})
}

// drop removes the closers named name without running them: what they
// would release is gone already (a paused sandbox's runtime sandbox).
func (u *undo) drop(name string) {
	kept := u.steps[:0]
	for _, c := range u.steps {
		if c.name != name {
			kept = append(kept, c)
		}
	}
	u.steps = kept
}

// runAbove pops and runs the closers pushed after the first mark ones,
// newest first, except those named keep, which stay on the stack: a failed
// resume gives back what it acquired and keeps what was there before.
func (u *undo) runAbove(ctx context.Context, mark int, keep string) error {
	if mark > len(u.steps) {
		mark = len(u.steps)
	}
	above := u.steps[mark:]
	u.steps = u.steps[:mark:mark]
	var kept []closer
	var errs []error
	for i := len(above) - 1; i >= 0; i-- {
		c := above[i]
		if c.name == keep {
			kept = append([]closer{c}, kept...)
			continue
		}
		if err := c.fn(ctx); err != nil {
			errs = append(errs, &stepError{step: c.name, err: err})
		}
	}
	u.steps = append(u.steps, kept...)
	return errors.Join(errs...)
}

// run pops and runs every closer, newest first, going on after one fails
// (what a later closer releases does not depend on an earlier one having
// worked). The stack is empty afterwards, so a second run does nothing. The
// error joins one *stepError per closer that failed.
func (u *undo) run(ctx context.Context) error {
	var errs []error
	for len(u.steps) > 0 {
		c := u.steps[len(u.steps)-1]
		u.steps = u.steps[:len(u.steps)-1]
		if err := c.fn(ctx); err != nil {
			errs = append(errs, &stepError{step: c.name, err: err})
		}
	}
	return errors.Join(errs...)
}

// stepError is the failure of one closer.
type stepError struct {
	step string
	err  error
}

func (e *stepError) Error() string { return e.step + ": " + e.err.Error() }
func (e *stepError) Unwrap() error { return e.err }

// stepFailed reports whether err, from undo.run, says that the closer named
// step failed.
func stepFailed(err error, step string) bool {
	j, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return false
	}
	for _, e := range j.Unwrap() {
		var se *stepError
		if errors.As(e, &se) && se.step == step {
			return true
		}
	}
	return false
}

// The closers every path pushes, one per thing a sandbox holds.

func (m *Manager) pushRecord(e *entry) {
	id := e.id
	e.undo.push(stepRecord, func(ctx context.Context) error {
		return m.opts.Store.Delete(ctx, id)
	})
}

// pushDir is pushed before the dir is made: making it may fail half-way (a
// subvolume without its run dir), and releasing what does not exist is a
// no-op.
func (m *Manager) pushDir(e *entry) {
	dir := e.dir
	e.undo.push(stepDir, func(context.Context) error {
		var err error
		// The runtime's Destroy removes the dir; it is still there when
		// create failed before the runtime sandbox existed, or when the
		// runtime lost its state.
		if _, statErr := os.Lstat(dir); statErr == nil {
			err = removeSandboxDir(dir)
		}
		if m.opts.Disk != nil {
			err = errors.Join(err, m.opts.Disk.Remove(dir))
		}
		return err
	})
}

func (m *Manager) pushNetwork(e *entry) {
	id := e.id
	e.undo.push(stepNetwork, func(context.Context) error {
		// In the background, and logged there: see netTeardown. It runs
		// after the runtime closer (pushed later), so no process holds the
		// netns any more.
		m.netTeardown(id)
		return nil
	})
}

// pushLog is pushed before the runtime is asked for the sandbox, which
// creates the log even when it fails.
func (m *Manager) pushLog(e *entry) {
	path := m.logPath(e.id)
	e.undo.push(stepLog, func(context.Context) error {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	})
}

// pushPaused is pushed when a sandbox is paused with its memory (or found
// so by Recover): its image goes with it when it is killed.
func (m *Manager) pushPaused(e *entry) {
	dir := m.layout().Paused(e.id)
	e.undo.drop(stepPaused)
	e.undo.push(stepPaused, func(context.Context) error { return os.RemoveAll(dir) })
}

func (m *Manager) pushRuntime(e *entry, rt runtime.Sandbox) {
	e.undo.push(stepRuntime, func(ctx context.Context) error {
		// Busy connections too: a stream through the proxy (a download, a
		// command's output) ends when the sandbox is killed, not whenever
		// its envd's socket goes (once, on a loaded host, a download read
		// on after the kill got the whole 256 MiB file).
		m.quiesce(e)
		return rt.Destroy(ctx)
	})
}

// destroy replays e's cleanup stack. Errors are logged, since there is
// mostly no one left to tell; the returned error says which closers failed.
// The caller holds e exclusively (e.op, or an entry no one else can reach).
func (m *Manager) destroy(ctx context.Context, e *entry) error {
	err := e.undo.run(ctx)
	if err != nil {
		m.log.Error("sandbox teardown", "id", e.id, "err", err)
	}
	return err
}

// discardPrefix names what discard set aside, beside where it was: sandbox
// ids and snapshot ids never start with a dot.
const discardPrefix = ".discard-"

// discard removes dir off the caller's path: a spent checkpoint image is
// hundreds of MiB, whose unlink alone took 200 ms of a 1 GiB resume. It is
// renamed first, so that its name means nothing any more at once (a stale
// image must never look like a sandbox's), then removed in the background;
// Recover removes what a stopped server left (sweepDiscarded).
func (m *Manager) discard(dir string) error {
	aside := filepath.Join(filepath.Dir(dir), discardPrefix+filepath.Base(dir)+"-"+newID())
	if err := os.Rename(dir, aside); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	m.background(func() {
		if err := os.RemoveAll(aside); err != nil {
			m.log.Warn("remove a discarded directory", "dir", aside, "err", err)
		}
	})
	return nil
}

// sweepDiscarded removes what discard set aside in each of dirs.
func sweepDiscarded(dirs ...string) {
	for _, dir := range dirs {
		entries, _ := os.ReadDir(dir)
		for _, de := range entries {
			if strings.HasPrefix(de.Name(), discardPrefix) {
				_ = os.RemoveAll(filepath.Join(dir, de.Name()))
			}
		}
	}
}
