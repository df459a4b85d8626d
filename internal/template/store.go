// Package template owns sandbox templates: their definitions (the built-ins are embedded
// from templates/), building them into read-only root filesystems, and the on-disk cache
// the sandbox manager mounts as the lower layer of every sandbox.
//
// On disk, under <dataDir>/templates/<name>/:
//
//	.lock                  flock(2) held while a process builds this template
//	<key>/rootfs/          the finished root filesystem (read-only by convention)
//	<key>/build.log        full raw output of the build
//	<key>/build.json       what was built, when, from which mirror, and its size
//	<key>.failed.log       raw output of the last failed build of <key>
//	.build-<key>-*/        a build in progress; renamed to <key> when complete
//	.old-<key>-*/          a superseded build being deleted
//
// <key> is Definition.Key: a new definition or builder version builds next to the old
// one, and a <key> directory exists only once its build has fully succeeded.
package template

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/templates"
)

var (
	// ErrNotFound: no template has this name, id or alias.
	ErrNotFound = errors.New("template not found")
	// ErrNotBuilt: the template is known but its current definition has no finished
	// build on this host yet.
	ErrNotBuilt = errors.New("template not built")
)

// Template is a template as sandboxes use it.
type Template struct {
	// ID is what clients send as templateID. Built-ins use their name ("base"), which is
	// what the E2B SDKs send by default.
	ID          string
	Name        string
	Alias       string
	Description string
	// Key identifies the build (see Definition.Key).
	Key string
	// Ready is true when RootFS holds a finished build. List also reports templates
	// that are not built yet; Get and Ensure return only ready ones.
	Ready     bool
	RootFS    string
	Settings  Settings
	BuiltAt   time.Time
	SizeBytes int64
}

// Options configure a Store.
type Options struct {
	// DataDir is Airlock's state directory; templates live in DataDir/templates.
	DataDir string
	// Mirror is the Debian mirror to build from; empty means DetectMirror().
	Mirror string
	// Definitions holds <name>/template.json files; nil means the built-ins.
	Definitions fs.FS
	// InUse reports whether a superseded rootfs is still the lower layer of some
	// sandbox. Superseded builds are deleted after a new build succeeds unless InUse
	// says so; nil means nothing is in use.
	InUse func(rootfs string) bool
}

// Store finds templates and builds them on demand. It is safe for concurrent use, and
// several processes may share one data directory.
type Store struct {
	dir     string // DataDir/templates, absolute
	defs    map[string]*Definition
	builder *builder
	inUse   func(string) bool

	mu     sync.Mutex
	builds map[string]*buildCall // by template name
}

// buildCall is one build shared by every Ensure that asks for it while it runs.
type buildCall struct {
	done    chan struct{}
	t       Template
	err     error
	waiters int
	cancel  context.CancelFunc
}

// buildMeta is build.json.
type buildMeta struct {
	Name           string      `json:"name"`
	Key            string      `json:"key"`
	BuilderVersion int         `json:"builderVersion"`
	BuiltAt        time.Time   `json:"builtAt"`
	BuildSeconds   float64     `json:"buildSeconds"`
	SizeBytes      int64       `json:"sizeBytes"`
	Mirror         string      `json:"mirror"`
	Definition     *Definition `json:"definition"`
}

// Open loads the template definitions. It doesn't touch the disk beyond reading: a
// process that only looks templates up must not need write access.
func Open(opts Options) (*Store, error) {
	if opts.DataDir == "" {
		return nil, errors.New("template store: data directory is required")
	}
	dataDir, err := filepath.Abs(opts.DataDir)
	if err != nil {
		return nil, fmt.Errorf("template store: %w", err)
	}
	// Mount points under the store are matched by path prefix, which needs the real path.
	if real, err := filepath.EvalSymlinks(dataDir); err == nil {
		dataDir = real
	}
	defsFS := opts.Definitions
	if defsFS == nil {
		defsFS = templates.FS
	}
	defs, err := loadDefinitions(defsFS)
	if err != nil {
		return nil, fmt.Errorf("template store: %w", err)
	}
	mirror := opts.Mirror
	if mirror == "" {
		mirror = DetectMirror()
	}
	return &Store{
		dir:     filepath.Join(dataDir, "templates"),
		defs:    defs,
		builder: &builder{mirror: mirror, steps: chrootRunner{}},
		inUse:   opts.InUse,
		builds:  map[string]*buildCall{},
	}, nil
}

// Mirror is the Debian mirror builds use.
func (s *Store) Mirror() string { return s.builder.mirror }

// Definition returns the definition of a known template.
func (s *Store) Definition(name string) (*Definition, error) {
	d, ok := s.defs[name]
	if !ok {
		return nil, fmt.Errorf("template %q: %w", name, ErrNotFound)
	}
	return d, nil
}

// Get returns a ready template by name, id or alias (the same string for built-ins).
// It never builds: creating a sandbox must not wait minutes behind a debootstrap.
func (s *Store) Get(name string) (Template, error) {
	d, err := s.Definition(name)
	if err != nil {
		return Template{}, err
	}
	t, err := s.ready(d)
	if errors.Is(err, ErrNotBuilt) {
		s.mu.Lock()
		_, building := s.builds[d.Name]
		s.mu.Unlock()
		if building {
			return Template{}, fmt.Errorf("template %s is still being built: %w", d.Name, ErrNotBuilt)
		}
		return Template{}, fmt.Errorf("template %s is not built yet (run `airlock template build %s`): %w", d.Name, d.Name, ErrNotBuilt)
	}
	return t, err
}

// List returns every known template by name, built or not.
func (s *Store) List() ([]Template, error) {
	names := make([]string, 0, len(s.defs))
	for n := range s.defs {
		names = append(names, n)
	}
	sort.Strings(names)
	out := make([]Template, 0, len(names))
	for _, n := range names {
		d := s.defs[n]
		t, err := s.ready(d)
		if errors.Is(err, ErrNotBuilt) {
			t = newTemplate(d)
		} else if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}

// Ensure returns the template, building it first if its current definition has no
// finished build. Progress goes to progress (nil discards it): one redrawn line on a
// terminal, one line per phase otherwise.
//
// Concurrent calls for one template share a single build, whose progress goes to the
// first caller's writer; other processes wait on the template's lock file. A caller
// whose ctx ends stops waiting; the build itself is cancelled when no caller waits for
// it any more, and the last caller returns only after its cleanup.
func (s *Store) Ensure(ctx context.Context, name string, progress io.Writer) (Template, error) {
	d, err := s.Definition(name)
	if err != nil {
		return Template{}, err
	}
	if t, err := s.ready(d); err == nil || !errors.Is(err, ErrNotBuilt) {
		return t, err
	}

	s.mu.Lock()
	c := s.builds[d.Name]
	if c == nil {
		bctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		c = &buildCall{done: make(chan struct{}), cancel: cancel}
		s.builds[d.Name] = c
		go func() {
			defer cancel()
			c.t, c.err = s.build(bctx, d, progress)
			s.mu.Lock()
			if s.builds[d.Name] == c {
				delete(s.builds, d.Name)
			}
			s.mu.Unlock()
			close(c.done)
		}()
	} else if progress != nil {
		fmt.Fprintf(progress, "%s: waiting for the build already running in this process\n", d.Name)
	}
	c.waiters++
	s.mu.Unlock()

	select {
	case <-c.done:
		return c.t, c.err
	case <-ctx.Done():
	}
	s.mu.Lock()
	c.waiters--
	last := c.waiters == 0
	if last {
		c.cancel()
		// A new Ensure must start afresh rather than join a build that is being torn down.
		if s.builds[d.Name] == c {
			delete(s.builds, d.Name)
		}
	}
	s.mu.Unlock()
	if last {
		<-c.done
		if c.err == nil {
			return c.t, nil // it finished before the cancellation reached it
		}
	}
	return Template{}, fmt.Errorf("template %s: %w", d.Name, ctx.Err())
}

func newTemplate(d *Definition) Template {
	return Template{
		ID:          d.Name,
		Name:        d.Name,
		Alias:       d.Name,
		Description: d.Description,
		Key:         d.Key(),
		Settings:    d.Settings,
	}
}

// ready returns the finished build of d's current key, or an error wrapping ErrNotBuilt.
// build.json is written last inside the build directory, and the directory is renamed
// into place only after that, so its presence means the build is complete.
func (s *Store) ready(d *Definition) (Template, error) {
	t := newTemplate(d)
	keyDir := filepath.Join(s.dir, d.Name, t.Key)
	data, err := os.ReadFile(filepath.Join(keyDir, "build.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return Template{}, fmt.Errorf("template %s: %w", d.Name, ErrNotBuilt)
	}
	if err != nil {
		return Template{}, fmt.Errorf("template %s: %w", d.Name, err)
	}
	var m buildMeta
	if err := json.Unmarshal(data, &m); err != nil {
		return Template{}, fmt.Errorf("template %s: read %s/build.json: %w", d.Name, keyDir, err)
	}
	t.Ready, t.RootFS, t.BuiltAt, t.SizeBytes = true, filepath.Join(keyDir, "rootfs"), m.BuiltAt, m.SizeBytes
	return t, nil
}

// BuildError is a failed build. Its message carries the end of the build's output,
// because "exit status 1" alone sends people digging for the log.
type BuildError struct {
	Name string
	Key  string
	// Log is the full output of the failed build, kept after the build is removed.
	Log  string
	Tail []string
	Err  error
}

func (e *BuildError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "build template %s: %v", e.Name, e.Err)
	if len(e.Tail) > 0 && !errors.Is(e.Err, context.Canceled) && !errors.Is(e.Err, context.DeadlineExceeded) {
		fmt.Fprintf(&b, "\nlast %d lines of output", len(e.Tail))
		if e.Log != "" {
			fmt.Fprintf(&b, " (full log: %s)", e.Log)
		}
		b.WriteString(":")
		for _, l := range e.Tail {
			b.WriteString("\n  ")
			b.WriteString(l)
		}
	}
	return b.String()
}

func (e *BuildError) Unwrap() error { return e.Err }

// build runs under the template's lock file: it re-checks for a finished build (another
// process may have made it while we waited), then builds into a temporary directory and
// renames it into place.
func (s *Store) build(ctx context.Context, d *Definition, out io.Writer) (Template, error) {
	p := newProgress(out, d.Name)
	p.run()
	defer p.close()

	nameDir := filepath.Join(s.dir, d.Name)
	if err := os.MkdirAll(nameDir, 0o755); err != nil {
		return Template{}, fmt.Errorf("template %s: %w", d.Name, err)
	}
	unlock, err := lockDir(ctx, nameDir, p)
	if err != nil {
		return Template{}, fmt.Errorf("template %s: %w", d.Name, err)
	}
	defer unlock()

	if t, err := s.ready(d); err == nil {
		p.finish("built by another process")
		return t, nil
	}
	// Leftovers of builds that crashed or were killed: nobody else can be using them,
	// since we hold the lock.
	cleanStale(nameDir, p)

	key := d.Key()
	// A key directory without build.json was damaged by hand; it would block the rename.
	if _, err := os.Lstat(filepath.Join(nameDir, key)); err == nil {
		if err := discard(nameDir, key); err != nil {
			return Template{}, fmt.Errorf("template %s: remove incomplete build: %w", d.Name, err)
		}
	}
	tmp, err := os.MkdirTemp(nameDir, ".build-"+key+"-")
	if err != nil {
		return Template{}, fmt.Errorf("template %s: %w", d.Name, err)
	}
	start := time.Now()
	err = s.buildInto(ctx, d, tmp, start, p)
	if err != nil {
		failed := &BuildError{Name: d.Name, Key: key, Tail: p.Tail(), Err: err}
		// Keep the log of a real failure for whoever debugs it; a cancelled build has
		// nothing to debug.
		logPath := filepath.Join(nameDir, key+".failed.log")
		if ctx.Err() == nil && os.Rename(filepath.Join(tmp, "build.log"), logPath) == nil {
			failed.Log = logPath
		}
		if rerr := removeTree(tmp, true); rerr != nil {
			failed.Err = errors.Join(err, fmt.Errorf("clean up failed build: %w", rerr))
		}
		p.close()
		return Template{}, failed
	}
	_ = os.Remove(filepath.Join(nameDir, key+".failed.log"))
	t, err := s.ready(d)
	if err != nil {
		return Template{}, err
	}
	p.finish(fmt.Sprintf("ready in %s (%s, key %s)", formatDuration(time.Since(start)), formatSize(t.SizeBytes), key))
	s.removeSuperseded(nameDir, key, p)
	return t, nil
}

// buildInto builds d into tmp and, when everything succeeded, renames tmp to its key.
func (s *Store) buildInto(ctx context.Context, d *Definition, tmp string, start time.Time, p *progress) error {
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	logf, err := os.OpenFile(filepath.Join(tmp, "build.log"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer func() {
		p.setLog(nil)
		logf.Close()
	}()
	p.setLog(logf)
	p.note("airlock: building template %s (key %s, builder %d) from %s at %s", d.Name, d.Key(), builderVersion, s.builder.mirror, start.UTC().Format(time.RFC3339))

	rootfs := filepath.Join(tmp, "rootfs")
	if err := s.builder.build(ctx, d, rootfs, p); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}

	p.setPhase(phaseFinish)
	size, err := diskUsage(rootfs)
	if err != nil {
		return err
	}
	meta, err := json.MarshalIndent(buildMeta{
		Name: d.Name, Key: d.Key(), BuilderVersion: builderVersion,
		BuiltAt: time.Now().UTC(), BuildSeconds: time.Since(start).Seconds(),
		SizeBytes: size, Mirror: s.builder.mirror, Definition: d,
	}, "", "  ")
	if err != nil {
		return err
	}
	p.note("airlock: build finished in %s, rootfs %s", formatDuration(time.Since(start)), formatSize(size))
	p.setLog(nil)
	if err := logf.Close(); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(tmp, "build.json"), append(meta, '\n'), 0o644); err != nil {
		return err
	}
	// The rename is the commit point; the rootfs must be on disk before it, or a crash
	// could leave a "complete" build with empty files.
	if err := syncFS(tmp); err != nil {
		return err
	}
	final := filepath.Join(filepath.Dir(tmp), d.Key())
	if err := os.Rename(tmp, final); err != nil {
		return fmt.Errorf("move build into place: %w", err)
	}
	return syncDir(filepath.Dir(tmp))
}

// removeSuperseded deletes the builds of older keys that no sandbox uses. Failures only
// waste disk, so they are reported and not returned.
func (s *Store) removeSuperseded(nameDir, key string, p *progress) {
	entries, err := os.ReadDir(nameDir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !e.IsDir() || e.Name() == key || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		dir := filepath.Join(nameDir, e.Name())
		if s.inUse != nil && s.inUse(filepath.Join(dir, "rootfs")) {
			continue
		}
		if used, err := mountedFrom(dir); err != nil || used {
			continue
		}
		if err := discard(nameDir, e.Name()); err != nil {
			p.printf("could not remove superseded build %s: %v", e.Name(), err)
		}
	}
}

// mountedFrom reports whether any mount in our namespace uses the build directory dir:
// something mounted inside it, a bind or idmapped mount of its rootfs (mountinfo's root
// field), or an overlay with it as a lower layer. Deleting files under a live overlay is
// undefined behaviour, so this guards sandboxes even when no InUse hook is given.
func mountedFrom(dir string) (bool, error) {
	mounts, err := mountinfo.GetMounts(nil)
	if err != nil {
		return false, fmt.Errorf("list mounts: %w", err)
	}
	// The key directory name is a 64-bit hash, so this suffix names one build even when
	// the data directory sits on its own filesystem and roots are relative to it.
	rootfs := "/" + filepath.Base(dir) + "/rootfs"
	for _, m := range mounts {
		if m.Mountpoint == dir || strings.HasPrefix(m.Mountpoint, dir+"/") ||
			strings.Contains(m.Root+"/", rootfs+"/") || strings.Contains(m.VFSOptions, rootfs) {
			return true, nil
		}
	}
	return false, nil
}

// discard deletes the build directory nameDir/key. It renames it first so Get never
// sees a half-deleted build under a valid key, and a crash mid-way leaves only an .old-
// directory that the next build cleans up.
func discard(nameDir, key string) error {
	old, err := os.MkdirTemp(nameDir, ".old-"+key+"-")
	if err != nil {
		return err
	}
	if err := os.Rename(filepath.Join(nameDir, key), filepath.Join(old, "build")); err != nil {
		_ = os.Remove(old)
		return err
	}
	return removeTree(old, false)
}

// cleanStale removes temporary directories left by builds that did not finish.
func cleanStale(nameDir string, p *progress) {
	entries, err := os.ReadDir(nameDir)
	if err != nil {
		return
	}
	for _, e := range entries {
		n := e.Name()
		if !e.IsDir() || !(strings.HasPrefix(n, ".build-") || strings.HasPrefix(n, ".old-")) {
			continue
		}
		if err := removeTree(filepath.Join(nameDir, n), true); err != nil {
			p.note("airlock: could not remove stale %s: %v", n, err)
		}
	}
}

// removeTree deletes dir. A debootstrap killed mid-way may have left proc or sysfs
// mounted inside the target if it ran without its private mount namespace; RemoveAll
// would then descend into the host's /proc or /sys. So mounts below dir are detached
// first when unmount is set, and otherwise make the removal fail.
func removeTree(dir string, unmount bool) error {
	mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		return fmt.Errorf("list mounts under %s: %w", dir, err)
	}
	if len(mounts) > 0 && !unmount {
		return fmt.Errorf("%s has %d mounts inside", dir, len(mounts))
	}
	// Deepest first, so a parent is never detached from under a child we still see.
	sort.Slice(mounts, func(i, j int) bool { return len(mounts[i].Mountpoint) > len(mounts[j].Mountpoint) })
	for _, m := range mounts {
		if err := unix.Unmount(m.Mountpoint, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("unmount %s: %w", m.Mountpoint, err)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	return nil
}

// lockDir takes an exclusive flock on dir/.lock, polling so ctx can interrupt the wait.
// The kernel drops the lock if the process dies, so a crashed build never blocks others.
func lockDir(ctx context.Context, dir string, p *progress) (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open lock file: %w", err)
	}
	waiting := false
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
		}
		if !waiting {
			waiting = true
			p.setPhase("waiting for another build of this template to finish")
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return func() {
		_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
		f.Close()
	}, nil
}

// syncFS flushes the filesystem holding dir: one syncfs is far cheaper than fsyncing
// each of the tens of thousands of files in a rootfs.
func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("syncfs %s: %w", dir, err)
	}
	return nil
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", dir, err)
	}
	return nil
}

func formatSize(n int64) string {
	return fmt.Sprintf("%d MB", (n+500_000)/1_000_000)
}
