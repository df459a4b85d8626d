// Package template owns sandbox templates: building them from a Dockerfile subset
// into layers (build.go), the built-ins shipped in templates/ (builtin.go), the
// tags naming a template's builds (tags.go), and the store the sandbox manager
// resolves names against.
//
// On disk, under the data dir:
//
//	templates/<name>/template.json          the template: its builds (top layer, image
//	                                        config, settings, source each) and its tags
//	templates/<name>/build-<buildID>.log    output of the kept build <buildID>
//	templates/.lock                         flock held to change any template.json
//	templates/.failed/<name>.log            output of the last failed build of <name>
//	layers/<key>/rootfs                     a layer's complete root filesystem (layers.go)
//	build/                                  the build sandbox's state (internal/buildbox)
//
// Tags: a template reference is "name[:tag]", and a name alone means the tag
// "default". A tag names one build; a name keeps every build some tag names and
// drops a build no tag names any more, in the same write that moved its last
// tag. Building "name:v2" gives the new build v2 (and any other requested tags),
// not "default" — except the first build of a name, which also gets "default"
// so that the name alone starts something after any first build (E2B would
// answer "no default tag" until a build without one). "default" can be moved
// (AssignTags) but not removed. Built-ins have only "default".
//
// Every change of a template.json (a build's commit, tag changes, removal) is
// read-change-write under templates/.lock, written to a temp file, synced and
// renamed, so concurrent changes (in this process or another) are serialized
// and a crash leaves the old record or the new one. The default build's fields
// are also written at the top level, where the one-build layout kept them, and
// a record of that layout reads as one build named by "default".
//
// A build is immutable once written: a rebuild records a new build that points
// at new layers, and sandboxes still running on a build whose tag moved keep its
// layers (garbage collection keeps every layer of every kept build, and skips
// layers any mount uses). Sandboxes mount a build's rootfs read-only as their
// overlay's lower layer; nothing is copied per sandbox.
package template

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/layout"
	"github.com/airlock-sandbox/airlock/internal/ociimage"
)

var (
	// ErrNotFound: no template has this name, id or alias.
	ErrNotFound = errors.New("template not found")
	// ErrNotBuilt: a built-in template that has not been built on this host yet.
	ErrNotBuilt = errors.New("template not built")
	// ErrInvalid: a bad Dockerfile, settings file, name or request.
	ErrInvalid = errors.New("invalid template")
	// ErrNameTaken: the name or alias belongs to another template.
	ErrNameTaken = errors.New("template name taken")
	// ErrInUse: sandboxes still run on the template.
	ErrInUse = errors.New("template in use")
	// ErrBuiltinTags: built-in templates have only the tag "default".
	ErrBuiltinTags = errors.New("built-in templates cannot be tagged")
)

// Template is a template as sandboxes and people see it.
type Template struct {
	// ID is what clients send as templateID; it is the template's name.
	ID          string
	Name        string
	Alias       string // = Name; E2B calls the human name an alias
	Aliases     []string
	Description string
	Builtin     bool
	// Ready is true when RootFS holds a finished build. List also reports built-ins
	// that are not built yet; Get returns only ready templates.
	Ready  bool
	Key    string // the top layer
	RootFS string
	// Config is the image config the Dockerfile left: env of every process, and the
	// USER and WORKDIR that Settings defaults fall back to.
	Config   ImageConfig
	Settings Settings
	Layers   []Layer
	Source   Source
	// CreatedAt is when the name was first built, BuiltAt when this build finished.
	CreatedAt    time.Time
	BuiltAt      time.Time
	BuildSeconds float64
	// SizeBytes is the allocated size of the template's root filesystem.
	SizeBytes int64
	// BuildLog is the path of the output of the build that made it.
	BuildLog string
	// BuildID names this build of the template; Tags are the tags naming it
	// (sorted), Tag the one it was looked up by ("default" for a name alone;
	// empty from List and Builds).
	BuildID string
	Tags    []string
	Tag     string
	// Access says who owns the template and who may use it (access.go).
	Access Access
}

// ImageConfig is what a Dockerfile's ENV, USER and WORKDIR leave behind.
type ImageConfig struct {
	Env     []string `json:"env,omitempty"`
	User    string   `json:"user,omitempty"`
	Workdir string   `json:"workdir,omitempty"`
}

// Layer describes one layer of a template, bottom first.
type Layer struct {
	Key          string  `json:"key"`
	Kind         string  `json:"kind"`
	Text         string  `json:"text"`
	DiffBytes    int64   `json:"diffBytes"`
	BuildSeconds float64 `json:"buildSeconds"`
	// Cached is true when this build reused the layer instead of making it.
	Cached bool `json:"cached"`
}

// Source says what a template was built from.
type Source struct {
	// Dockerfile is the absolute path of the Dockerfile, or "builtin:<name>".
	Dockerfile string `json:"dockerfile"`
	Context    string `json:"context,omitempty"`
	From       string `json:"from"`
	// Digest identifies a built-in's definition (all its files), so serve rebuilds
	// a built-in only when the repo's definition changed.
	Digest string `json:"digest,omitempty"`
}

// record is template.json: the template's builds and tags. The default
// build's fields are also written at the top level, where the first layout
// (one build per name) kept them, so readers of that layout (an older
// airlock after a downgrade, scripts reading "key") still find the build a
// name alone starts.
type record struct {
	Name      string    `json:"name"`
	Builtin   bool      `json:"builtin,omitempty"`
	CreatedAt time.Time `json:"createdAt"`
	buildRecord
	// Tags map each tag to the build it names; "default" is always there.
	Tags map[string]tagRecord `json:"tags,omitempty"`
	// Builds are the builds some tag names, in the order they were made.
	Builds []buildRecord `json:"builds,omitempty"`
}

// buildRecord is one build of a template.
type buildRecord struct {
	BuildID      string      `json:"buildID,omitempty"`
	Key          string      `json:"key"`
	Config       ImageConfig `json:"config"`
	Settings     Settings    `json:"settings"`
	Layers       []Layer     `json:"layers"`
	Source       Source      `json:"source"`
	BuiltAt      time.Time   `json:"builtAt"`
	BuildSeconds float64     `json:"buildSeconds"`
	SizeBytes    int64       `json:"sizeBytes"`
	// Log is the file in the template's directory with the build's output.
	Log string `json:"log,omitempty"`
}

// tagRecord is where a tag points.
type tagRecord struct {
	BuildID   string    `json:"buildID"`
	CreatedAt time.Time `json:"createdAt"`
}

// Options configure a Store.
type Options struct {
	// DataDir is Airlock's state directory.
	DataDir string
	// Mirror is the Debian mirror debootstrap uses; empty means DetectMirror().
	Mirror string
	// EnvdPath is the static envd binary the build sandbox runs steps with. Only
	// builds with RUN steps need it.
	EnvdPath string
	// NoEgress keeps build steps off the internet (they still run, isolated).
	NoEgress bool
	// DNSUpstreams for build steps; default the host's resolv.conf.
	DNSUpstreams []string
	// AllowPrivate are the private ranges an API key's build steps may reach
	// (serve --allow-private, as for sandboxes); the operator's own builds
	// reach every private range (BuildRequest.Untrusted).
	AllowPrivate []netip.Prefix
	// AllowRegistries are registries ("host:port") at private addresses an
	// API key's build may pull from (serve --allow-registry).
	AllowRegistries []string
	// RegistryMirrors redirect image pulls (FROM an image) from a registry to a
	// mirror; see ociimage.Mirror.
	RegistryMirrors []ociimage.Mirror
	// ImageTransport, when set, carries every registry request of an image
	// pull (tests: to keep a pull with no mirror off the network).
	ImageTransport http.RoundTripper
	// Builtins holds the built-in definitions (<name>/Dockerfile and airlock.toml);
	// nil means the ones embedded from the repo's templates/ directory.
	Builtins fs.FS
	Logger   *slog.Logger
}

// Store finds, builds and removes templates. It is safe for concurrent use, and
// several processes may share one data directory.
type Store struct {
	opts     Options
	dir      string // <data>/templates
	layers   *layerStore
	builtins map[string]*builtin
	log      *slog.Logger

	// buildSlot serialises builds in this process (see acquireBuild); a channel
	// rather than a mutex so a waiting build can be cancelled and can say whose
	// build it waits for.
	buildSlot chan struct{}
	mu        sync.Mutex
	ensures   map[string]*ensureCall
	// states are the templates this process builds or has queued, for lookups
	// meanwhile; current is the one holding buildSlot.
	states  map[string]*buildState
	current string

	// accessMu serialises claims and visibility changes (access.go).
	accessMu sync.Mutex
}

// Open reads the built-in definitions. It writes nothing: a process that only looks
// templates up needs no write access.
func Open(opts Options) (*Store, error) {
	if opts.DataDir == "" {
		return nil, errors.New("template store: data directory is required")
	}
	dataDir, err := filepath.Abs(opts.DataDir)
	if err != nil {
		return nil, fmt.Errorf("template store: %w", err)
	}
	// Mounts under the store are matched by path, which needs the real path.
	if real, err := filepath.EvalSymlinks(dataDir); err == nil {
		dataDir = real
	}
	opts.DataDir = dataDir
	if opts.Mirror == "" {
		opts.Mirror = DetectMirror()
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if err := ociimage.ValidateMirrors(opts.RegistryMirrors); err != nil {
		return nil, fmt.Errorf("template store: %w", err)
	}
	builtins, err := loadBuiltins(opts.Builtins)
	if err != nil {
		return nil, fmt.Errorf("template store: %w", err)
	}
	return &Store{
		opts:     opts,
		dir:      layout.DataDir{Root: dataDir}.Templates(),
		layers:   &layerStore{dir: layout.DataDir{Root: dataDir}.Layers()},
		builtins: builtins,
		log:      opts.Logger,
		ensures:  map[string]*ensureCall{},

		buildSlot: make(chan struct{}, 1),
		states:    map[string]*buildState{},
	}, nil
}

// Mirror is the Debian mirror builds use.
func (s *Store) Mirror() string { return s.opts.Mirror }

// ImageOptions are the ociimage options every image pull of this store uses
// (its registry mirrors): code that opens an image for a build passes them to
// ociimage.Open, so the operator's mirrors apply to it too.
func (s *Store) ImageOptions() ociimage.Options {
	return ociimage.Options{Mirrors: s.opts.RegistryMirrors, Transport: s.opts.ImageTransport, Logger: s.log}
}

// Builtins lists the names of the built-in templates.
func (s *Store) Builtins() []string {
	names := make([]string, 0, len(s.builtins))
	for n := range s.builtins {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func (s *Store) recordPath(name string) string {
	return filepath.Join(s.dir, name, "template.json")
}

func (s *Store) readRecord(name string) (*record, error) {
	data, err := os.ReadFile(s.recordPath(name))
	if err != nil {
		return nil, err
	}
	var r record
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("template %s: read %s: %w", name, s.recordPath(name), err)
	}
	if r.Name != name {
		return nil, fmt.Errorf("template %s: %s names %q", name, s.recordPath(name), r.Name)
	}
	if err := r.normalize(); err != nil {
		return nil, fmt.Errorf("template %s: read %s: %w", name, s.recordPath(name), err)
	}
	return &r, nil
}

// writeRecord replaces template.json atomically: readers see the old or the new
// template, never half of one.
func (s *Store) writeRecord(r *record) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(s.recordPath(r.Name), append(data, '\n'), 0o644)
}

// toTemplate describes build b of r. Aliases and the description are the
// template's (its default build's settings), the rest is b's own.
func (s *Store) toTemplate(r *record, b buildRecord) Template {
	settings := b.Settings
	settings.Aliases, settings.Description = r.Settings.Aliases, r.Settings.Description
	t := Template{
		ID: r.Name, Name: r.Name, Alias: r.Name, Aliases: r.Settings.Aliases,
		Description: r.Settings.Description, Builtin: r.Builtin, Ready: true,
		Key: b.Key, RootFS: s.layers.rootfs(b.Key), Config: b.Config, Settings: settings,
		Layers: b.Layers, Source: b.Source, CreatedAt: r.CreatedAt, BuiltAt: b.BuiltAt,
		BuildSeconds: b.BuildSeconds, SizeBytes: b.SizeBytes,
		BuildID: b.BuildID, Tags: r.tagsOf(b.BuildID),
	}
	if b.Log != "" {
		t.BuildLog = filepath.Join(s.dir, r.Name, b.Log)
	}
	if a, _, err := s.readAccess(r.Name); err != nil {
		// Unreadable: nobody's, so no key sees it rather than every key.
		s.log.Warn("template store: unreadable access file", "name", r.Name, "err", err)
		t.Access = Access{Owner: "(unreadable)"}
	} else {
		t.Access = a
	}
	return t
}

// names lists the templates with a record on disk.
func (s *Store) names() ([]string, error) {
	entries, err := os.ReadDir(s.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list templates: %w", err)
	}
	var out []string
	for _, e := range entries {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if _, err := os.Stat(s.recordPath(e.Name())); err == nil {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// resolveName maps an id or alias to the template's name.
func (s *Store) resolveName(idOrAlias string) (string, error) {
	if _, err := os.Stat(s.recordPath(idOrAlias)); err == nil {
		return idOrAlias, nil
	}
	if ValidName(idOrAlias) == nil {
		names, err := s.names()
		if err != nil {
			return "", err
		}
		for _, n := range names {
			r, err := s.readRecord(n)
			if err != nil {
				continue
			}
			for _, a := range r.Settings.Aliases {
				if a == idOrAlias {
					return n, nil
				}
			}
		}
		for name, b := range s.builtins {
			if name == idOrAlias || b.hasAlias(idOrAlias) {
				return name, nil
			}
		}
	}
	return "", fmt.Errorf("template %q: %w", idOrAlias, ErrNotFound)
}

// Get returns a ready template by name, id or alias, with an optional
// ":tag" (the build that tag names; without one, the "default" tag's). It
// never builds: creating a sandbox must not wait minutes behind a build.
func (s *Store) Get(ref string) (Template, error) {
	idOrAlias, tag, err := SplitRef(ref)
	if err != nil {
		return Template{}, err
	}
	name, err := s.resolveName(idOrAlias)
	if err != nil {
		return Template{}, err
	}
	r, err := s.readRecord(name)
	if errors.Is(err, fs.ErrNotExist) {
		if be := s.buildingError(name); be != nil {
			return Template{}, be
		}
		s.mu.Lock()
		_, building := s.ensures[name]
		s.mu.Unlock()
		if building {
			return Template{}, &BuildingError{Name: name, Status: "starting", Since: time.Now()}
		}
		return Template{}, fmt.Errorf("template %s is not built yet (run `airlock template build %s`): %w", name, name, ErrNotBuilt)
	}
	if err != nil {
		return Template{}, err
	}
	b, err := r.byTag(tag)
	if err != nil {
		return Template{}, err
	}
	t := s.toTemplate(r, b)
	t.Tag = tag
	return t, nil
}

// List returns every template, built or not (built-ins appear before their first
// build with Ready false), by name.
func (s *Store) List() ([]Template, error) {
	names, err := s.names()
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []Template
	for _, n := range names {
		r, err := s.readRecord(n)
		if err != nil {
			s.log.Warn("template store: skipping unreadable template", "name", n, "err", err)
			continue
		}
		seen[n] = true
		out = append(out, s.toTemplate(r, r.buildRecord))
	}
	for name, b := range s.builtins {
		if !seen[name] {
			out = append(out, Template{
				ID: name, Name: name, Alias: name, Aliases: b.settings.Aliases,
				Description: b.settings.Description, Builtin: true, Settings: b.settings.withDefaults(),
				Source: Source{Dockerfile: "builtin:" + name, Digest: b.digest},
			})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// DiskUsage is what all layers take on disk together (shared files counted once).
func (s *Store) DiskUsage() (int64, error) { return s.layers.usage() }

// Remove deletes a template with all its builds and tags, refusing while
// inUse reports sandboxes on it (or any mount still uses the top layer of one
// of its builds), then collects layers no other template needs. inUse may be
// nil when the caller knows of no sandboxes.
func (s *Store) Remove(ctx context.Context, idOrAlias string, inUse func(Template) (int, error)) error {
	if strings.Contains(idOrAlias, ":") {
		return fmt.Errorf("%w: template %q: a template is removed with all its tags; name it without one (tags are removed with RemoveTags)", ErrInvalid, idOrAlias)
	}
	name, err := s.resolveName(idOrAlias)
	if err != nil {
		return err
	}
	// The tag lock keeps a build of this name from being recorded (or a tag
	// moved) between the checks and the rename.
	unlock, err := s.lockTags(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	r, err := s.readRecord(name)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("template %q is not built: %w", name, ErrNotFound)
	}
	if err != nil {
		return err
	}
	if inUse != nil {
		n, err := inUse(s.toTemplate(r, r.buildRecord))
		if err != nil {
			return fmt.Errorf("template %s: count its sandboxes: %w", name, err)
		}
		if n > 0 {
			return fmt.Errorf("%w: template %s is used by %d sandbox(es); kill them first", ErrInUse, name, n)
		}
	}
	for _, b := range r.Builds {
		// A mount of a build's top layer means a sandbox runs on it, unless
		// another template has the same top layer (FROM base with only ENV
		// lines): then the mount may be theirs, and inUse is the judge.
		shared, err := s.layerShared(name, b.Key)
		if err != nil {
			return err
		}
		if used, err := mountedFrom(filepath.Join(s.layers.dir, b.Key)); err != nil {
			return err
		} else if used && !shared {
			return fmt.Errorf("%w: template %s (build %s) is mounted by a running sandbox (a warm pool, or a server on this data dir); kill its sandboxes or stop the server first", ErrInUse, name, b.BuildID)
		}
	}
	old := filepath.Join(s.dir, "."+name+".removed")
	_ = os.RemoveAll(old)
	if err := os.Rename(filepath.Join(s.dir, name), old); err != nil {
		return fmt.Errorf("remove template %s: %w", name, err)
	}
	if err := os.RemoveAll(old); err != nil {
		return fmt.Errorf("remove template %s: %w", name, err)
	}
	if _, err := s.collect(); err != nil {
		s.log.Warn("template store: collecting unused layers", "err", err)
	}
	return nil
}

// layerShared reports whether a build of a template other than name lists
// layer key.
func (s *Store) layerShared(name, key string) (bool, error) {
	names, err := s.names()
	if err != nil {
		return false, err
	}
	for _, n := range names {
		if n == name {
			continue
		}
		r, err := s.readRecord(n)
		if err != nil {
			return false, err
		}
		for _, b := range r.Builds {
			for _, l := range b.Layers {
				if l.Key == key {
					return true, nil
				}
			}
		}
	}
	return false, nil
}

// collect deletes layers that no kept build's chain includes: every build a
// tag names keeps all its layers.
func (s *Store) collect() (int, error) {
	names, err := s.names()
	if err != nil {
		return 0, err
	}
	keep := map[string]bool{}
	for _, n := range names {
		r, err := s.readRecord(n)
		if err != nil {
			// An unreadable record must not cost its layers.
			return 0, err
		}
		for _, b := range r.Builds {
			keep[b.Key] = true
			for _, l := range b.Layers {
				keep[l.Key] = true
			}
		}
		s.removeLegacyBuilds(n)
	}
	return s.layers.collect(keep)
}

// legacyBuild matches the build directories of builder version 1, which kept a
// template's rootfs in templates/<name>/<16 hex digits>/.
var legacyBuild = regexp.MustCompile(`^[0-9a-f]{16}$`)

// removeLegacyBuilds deletes a template's version-1 builds that no mount uses:
// its template.json now points at layers instead.
func (s *Store) removeLegacyBuilds(name string) {
	dir := filepath.Join(s.dir, name)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !e.IsDir() || !legacyBuild.MatchString(e.Name()) {
			continue
		}
		if used, err := mountedFrom(filepath.Join(dir, e.Name())); err != nil || used {
			continue
		}
		if err := discard(dir, e.Name()); err != nil {
			s.log.Warn("template store: removing a build of the old layout", "template", name, "dir", e.Name(), "err", err)
		}
	}
}

// ensureCall is one Ensure of a built-in, shared by concurrent callers.
type ensureCall struct {
	done    chan struct{}
	t       Template
	err     error
	waiters int
	cancel  context.CancelFunc
}

// Ensure returns a built-in template, building it first when it has never been
// built or its definition in the repo changed. Concurrent calls share one build,
// whose progress goes to the first caller's writer; the build is cancelled when no
// caller waits for it any more, and the last caller returns after its cleanup.
func (s *Store) Ensure(ctx context.Context, name string, progress io.Writer) (Template, error) {
	n, err := s.resolveName(name)
	if err != nil {
		return Template{}, err
	}
	b, ok := s.builtins[n]
	if !ok {
		// A user template is what it is; Ensure only builds built-ins.
		return s.Get(n)
	}
	if r, err := s.readRecord(n); err == nil && r.Builtin && r.Source.Digest == b.digest {
		return s.toTemplate(r, r.buildRecord), nil
	}
	s.mu.Lock()
	c := s.ensures[n]
	if c == nil {
		bctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		c = &ensureCall{done: make(chan struct{}), cancel: cancel}
		s.ensures[n] = c
		go func() {
			defer cancel()
			c.t, c.err = s.buildBuiltin(bctx, b, progress)
			s.mu.Lock()
			if s.ensures[n] == c {
				delete(s.ensures, n)
			}
			s.mu.Unlock()
			close(c.done)
		}()
	} else if progress != nil {
		fmt.Fprintf(progress, "%s: waiting for the build of %s already running in this process (since %s)\n", n, n, time.Now().Format("15:04:05"))
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
		if s.ensures[n] == c {
			delete(s.ensures, n)
		}
	}
	s.mu.Unlock()
	if last {
		<-c.done
		if c.err == nil {
			return c.t, nil
		}
	}
	return Template{}, fmt.Errorf("template %s: %w", n, ctx.Err())
}
