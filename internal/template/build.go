package template

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	securejoin "github.com/cyphar/filepath-securejoin"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/moby/sys/user"

	"github.com/airlock-sandbox/airlock/internal/buildbox"
	"github.com/airlock-sandbox/airlock/internal/buildcontext"
	"github.com/airlock-sandbox/airlock/internal/dockerfile"
	"github.com/airlock-sandbox/airlock/internal/layer"
	"github.com/airlock-sandbox/airlock/internal/netpolicy"
)

// BuildRequest asks for a template built from a Dockerfile.
type BuildRequest struct {
	Name       string
	Dockerfile []byte
	// DockerfilePath is where the Dockerfile lives (absolute); a name already
	// built from another Dockerfile is refused unless Replace is set.
	DockerfilePath string
	// ContextDir is the directory COPY and ADD read from; empty allows neither.
	ContextDir string
	// Settings are airlock.toml merged with build flags; Settings.BuildArgs are
	// the ARG values.
	Settings Settings
	Replace  bool
	// Output, when set, also gets the build's full output as it is written
	// to the build log (the steps' output and the builder's notes), for
	// clients that show it live (the E2B API's build logs).
	Output io.Writer
	// NoCacheFromLine, when > 0, rebuilds every step on that Dockerfile line
	// or later instead of taking it from the layer cache (the E2B SDK's
	// skipCache() and step force). Those steps' layer keys get a nonce of
	// this build mixed in, so they miss the cache and the layers they make
	// are new ones (an older template keeps its own); the steps after them
	// miss too, as their parent changed.
	NoCacheFromLine int
	// BuildID names the build (the E2B API's build id); empty means a new
	// one is made up.
	BuildID string
	// Tags the build gets (see the package doc); empty means "default". The
	// first build of a name also gets "default", whatever its tags.
	Tags []string
	// Untrusted marks a build an API key asked for (the E2B build API), not
	// the operator: its RUN steps reach the internet as a sandbox does, but
	// no private address (a company's internal services) beyond the ones
	// the operator opened for sandboxes (Options.AllowPrivate).
	Untrusted bool
	// Keychain, when set, gives the credentials for pulling the FROM image
	// (the E2B SDK's fromImage(image, {username, password})) in place of
	// the store's default (the docker config file). It is not part of any
	// layer key: an image is keyed by its manifest digest.
	Keychain authn.Keychain
}

// buildOrigin says who asks: a built-in build may use its reserved name.
type buildOrigin struct {
	builtin *builtin
}

// StepError is a build step that failed: which one, where in the Dockerfile, and
// how (a non-zero exit code, or the error that kept it from running).
type StepError struct {
	Step, Steps int
	Line        int
	Text        string
	// ExitCode is the step's exit status (128+signal when killed); -1 when the step
	// did not run to an exit.
	ExitCode int
	Err      error
}

func (e *StepError) Error() string {
	head := fmt.Sprintf("step %d/%d (Dockerfile line %d) %s", e.Step, e.Steps, e.Line, shorten(e.Text, 120))
	if e.ExitCode >= 0 {
		return fmt.Sprintf("%s: exited with code %d", head, e.ExitCode)
	}
	return fmt.Sprintf("%s: %v", head, e.Err)
}

func (e *StepError) Unwrap() error { return e.Err }

// BuildError is a failed build. Its message carries the end of the build's output,
// because "exit code 1" alone sends people digging for the log.
type BuildError struct {
	Name string
	// Log is the full output of the failed build, kept after the build is gone.
	Log  string
	Tail []string
	Err  error
}

func (e *BuildError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "build template %s: %v", e.Name, e.Err)
	if len(e.Tail) > 0 && !errors.Is(e.Err, context.Canceled) && !errors.Is(e.Err, context.DeadlineExceeded) && !errors.Is(e.Err, ErrInvalid) {
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

// Build builds a user's template from a Dockerfile and records it under its name.
// Every step yields a layer cached by content, so an unchanged rebuild only checks
// the cache and a changed one rebuilds from the first changed step. Progress goes to
// progress (nil discards it): one redrawn status line on a terminal, a line per step
// otherwise; the full output is kept with the template.
func (s *Store) Build(ctx context.Context, req BuildRequest, progress io.Writer) (Template, error) {
	return s.build(ctx, req, buildOrigin{}, progress)
}

func (s *Store) build(ctx context.Context, req BuildRequest, origin buildOrigin, out io.Writer) (Template, error) {
	if req.Name == "" {
		req.Name = req.Settings.Name
	}
	if err := s.checkName(req, origin); err != nil {
		return Template{}, err
	}
	tags, err := NormalizeTags(req.Tags)
	if err != nil {
		return Template{}, err
	}
	if len(tags) == 0 {
		tags = []string{DefaultTag}
	}
	if origin.builtin != nil && !slices.Equal(tags, []string{DefaultTag}) {
		return Template{}, fmt.Errorf("%w: %s is a built-in template: it has only the tag %q", ErrBuiltinTags, req.Name, DefaultTag)
	}
	req.Tags = tags
	if req.BuildID == "" {
		req.BuildID = newBuildID()
	} else if !validBuildID.MatchString(req.BuildID) {
		return Template{}, fmt.Errorf("%w: build id %q: use lower-case letters, digits and '-'", ErrInvalid, req.BuildID)
	}
	st, end := s.beginBuild(req.Name)
	defer end()
	p := newProgress(out, req.Name)
	p.raw = req.Output
	p.run()
	defer p.close()
	s.setProgress(st, p)
	// A built-in parent (FROM python3) is built first, outside the build slot:
	// building it from inside would wait for the slot this build holds.
	if err := s.ensureParent(ctx, req, st, p); err != nil {
		return Template{}, &BuildError{Name: req.Name, Err: err}
	}
	release, err := s.acquireBuild(ctx, st, req.Name, p)
	if err != nil {
		return Template{}, &BuildError{Name: req.Name, Err: err}
	}
	defer release()
	logf, err := s.openBuildLog(req.Name)
	if err != nil {
		return Template{}, err
	}
	p.setLog(logf)
	start := time.Now()
	t, err := s.buildSteps(ctx, req, origin, st, p)
	p.setLog(nil)
	logf.Close()
	if err != nil {
		failed := &BuildError{Name: req.Name, Tail: p.Tail(), Err: err}
		if ctx.Err() == nil {
			dst := filepath.Join(s.dir, ".failed", req.Name+".log")
			if os.MkdirAll(filepath.Dir(dst), 0o755) == nil && os.Rename(logf.Name(), dst) == nil {
				failed.Log = dst
			}
		}
		_ = os.Remove(logf.Name())
		p.close()
		return Template{}, failed
	}
	if err := os.Rename(logf.Name(), filepath.Join(s.dir, req.Name, buildLogName(req.BuildID))); err != nil {
		s.log.Warn("template store: keeping the build log", "err", err)
	}
	_ = os.Remove(filepath.Join(s.dir, ".failed", req.Name+".log"))
	cached := 0
	for _, l := range t.Layers {
		if l.Cached {
			cached++
		}
	}
	p.finish(fmt.Sprintf("ready in %s (%s, %d layers, %d from cache)", FormatDuration(time.Since(start)), formatSize(t.SizeBytes), len(t.Layers), cached))
	if n, err := s.collect(); err != nil {
		s.log.Warn("template store: collecting unused layers", "err", err)
	} else if n > 0 {
		s.log.Debug("template store: removed unused layers", "count", n)
	}
	return t, nil
}

// ensureParent builds the built-in template a Dockerfile's FROM names when it is
// not ready, before the build takes the build slot. Errors in the Dockerfile are
// left for the build proper to report.
func (s *Store) ensureParent(ctx context.Context, req BuildRequest, st *buildState, p *progress) error {
	file, err := dockerfile.Parse(bytes.NewReader(req.Dockerfile))
	if err != nil {
		return nil
	}
	ref, _, err := file.FromRef(req.Settings.BuildArgs)
	if err != nil || ref == req.Name || ValidName(ref) != nil || !s.IsBuiltin(ref) {
		return nil
	}
	name, err := s.resolveName(ref)
	if err != nil {
		return nil
	}
	if r, err := s.readRecord(name); err == nil && r.Builtin && r.Source.Digest == s.builtins[name].digest {
		return nil
	}
	done := s.waitFor(st, p, "its FROM template "+name+" to build")
	defer done()
	if _, err := s.Ensure(ctx, name, p.out); err != nil {
		return fmt.Errorf("FROM %s: %w", ref, err)
	}
	return nil
}

// checkName refuses invalid names and names that belong to another template.
func (s *Store) checkName(req BuildRequest, origin buildOrigin) error {
	if req.Name == "" {
		return fmt.Errorf("%w: the template needs a name (--name, or template_name in %s)", ErrInvalid, SettingsFile)
	}
	if err := ValidName(req.Name); err != nil {
		return err
	}
	if err := req.Settings.validate(); err != nil {
		return err
	}
	if origin.builtin == nil && s.IsBuiltin(req.Name) {
		return fmt.Errorf("%w: %q is a built-in template's name; choose another", ErrNameTaken, req.Name)
	}
	for _, a := range req.Settings.Aliases {
		if a == req.Name {
			continue
		}
		if origin.builtin == nil && s.IsBuiltin(a) {
			return fmt.Errorf("%w: alias %q is a built-in template's name", ErrNameTaken, a)
		}
		if owner, err := s.resolveName(a); err == nil && owner != req.Name {
			return fmt.Errorf("%w: alias %q already names template %s", ErrNameTaken, a, owner)
		}
	}
	if owner, err := s.resolveName(req.Name); err == nil && owner != req.Name {
		return fmt.Errorf("%w: %q is an alias of template %s", ErrNameTaken, req.Name, owner)
	}
	r, err := s.readRecord(req.Name)
	if err != nil {
		return nil // no template of that name yet
	}
	if origin.builtin == nil && !req.Replace && r.Source.Dockerfile != req.DockerfilePath {
		return fmt.Errorf("%w: template %s exists, built from %s; pass --replace to replace it, or choose another name", ErrNameTaken, req.Name, r.Source.Dockerfile)
	}
	return nil
}

func (s *Store) openBuildLog(name string) (*os.File, error) {
	dir := filepath.Join(s.dir, ".logs")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	f, err := os.CreateTemp(dir, name+"-*.log")
	if err != nil {
		return nil, err
	}
	return f, os.Chmod(f.Name(), 0o644)
}

// buildSteps does the build proper; build wraps it with logging and error reporting.
func (s *Store) buildSteps(ctx context.Context, req BuildRequest, origin buildOrigin, st *buildState, p *progress) (Template, error) {
	src := "Dockerfile"
	if req.DockerfilePath != "" {
		src = req.DockerfilePath
	} else if origin.builtin != nil {
		src = "builtin:" + origin.builtin.name
	}
	p.note("airlock: building template %s from %s (builder %d) at %s", req.Name, src, builderVersion, time.Now().UTC().Format(time.RFC3339))
	file, err := dockerfile.Parse(bytes.NewReader(req.Dockerfile))
	if err != nil {
		return Template{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	args := req.Settings.BuildArgs
	ref, line, err := file.FromRef(args)
	if err != nil {
		return Template{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	from, err := s.resolveFrom(ctx, ref, line, req.Keychain, req.Untrusted, p)
	if err != nil {
		return Template{}, err
	}
	steps, final, err := file.Plan(dockerfile.Config{Env: from.config.Env, User: from.config.User, Workdir: from.config.Workdir}, args)
	if err != nil {
		return Template{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	var bctx *buildcontext.Context
	for _, st := range steps {
		if st.Kind == dockerfile.StepCopy && bctx == nil {
			if req.ContextDir == "" {
				return Template{}, fmt.Errorf("%w: Dockerfile line %d: %s needs a build context directory", ErrInvalid, st.Line, firstWord(st.Text))
			}
			if bctx, err = buildcontext.Open(req.ContextDir); err != nil {
				return Template{}, fmt.Errorf("%w: build context: %w", ErrInvalid, err)
			}
			defer bctx.Close()
		}
	}

	// Builds share the layer lock, so garbage collection never takes a layer made
	// here before the template that needs it is recorded.
	unlock, _, err := s.layers.lock(ctx, false, func(path string) func() {
		return s.waitForLock(st, p, "the layer lock", path)
	})
	if err != nil {
		return Template{}, err
	}
	defer unlock()

	var chain []Layer
	var box *buildbox.Box
	nonce := rand.Text()
	defer func() {
		if box != nil {
			if err := box.Close(); err != nil {
				s.log.Warn("template build: closing the build sandbox", "err", err)
			}
		}
	}()
	openBox := func() (*buildbox.Box, error) {
		if box != nil {
			return box, nil
		}
		if s.opts.EnvdPath == "" {
			return nil, errors.New("RUN steps need the envd binary (template.Options.EnvdPath)")
		}
		p.setPhase("starting the build sandbox")
		b, err := buildbox.Open(ctx, buildbox.Options{
			DataDir: s.opts.DataDir, EnvdPath: s.opts.EnvdPath, Egress: !s.opts.NoEgress,
			DNSUpstreams: s.opts.DNSUpstreams, Logger: s.log,
			Waiting: func(lock string) func() {
				return s.waitForLock(st, p, "the build sandbox lock", lock)
			},
		})
		if err != nil {
			return nil, fmt.Errorf("build sandbox: %w", err)
		}
		box = b
		return box, nil
	}

	// The first layer: the FROM source.
	parent := from.key
	if from.parent != nil {
		for _, l := range from.parent.Layers {
			l.Cached = true // reused from the parent template, not made here
			chain = append(chain, l)
		}
		p.printf("FROM %s: template %s (layer %s)", ref, from.parent.Name, from.key)
	} else if m, ok := s.layers.get(from.key); ok {
		chain = append(chain, Layer{Key: m.Key, Kind: m.Kind, Text: m.Text, DiffBytes: m.DiffBytes, BuildSeconds: m.BuildSeconds, Cached: true})
		p.printf("FROM %s: cached", ref)
	} else {
		p.printf("FROM %s: building the first layer", ref)
		m, err := s.layers.create(ctx, layerMeta{Key: from.key, Kind: from.kind, Text: "FROM " + ref}, func(tmp string) (int64, error) {
			rootfs := filepath.Join(tmp, "rootfs")
			if err := from.make(ctx, rootfs, p); err != nil {
				return 0, err
			}
			if err := addMountPoints(rootfs); err != nil {
				return 0, err
			}
			p.setPhase(phaseFinish)
			return diskUsage(rootfs)
		})
		if err != nil {
			return Template{}, fmt.Errorf("FROM %s: %w", ref, err)
		}
		chain = append(chain, Layer{Key: m.Key, Kind: m.Kind, Text: m.Text, DiffBytes: m.DiffBytes, BuildSeconds: m.BuildSeconds})
	}

	for i, st := range steps {
		n := i + 1
		stepErr := func(code int, err error) error {
			return &StepError{Step: n, Steps: len(steps), Line: st.Line, Text: st.Text, ExitCode: code, Err: err}
		}
		parts := []string{parent, st.CacheText}
		if req.NoCacheFromLine > 0 && st.Line >= req.NoCacheFromLine {
			parts = append(parts, "no-cache:"+nonce)
		}
		if st.Kind == dockerfile.StepCopy {
			digest, err := bctx.Digest(st.Sources)
			if err != nil {
				return Template{}, fmt.Errorf("%w: %w", ErrInvalid, stepErr(-1, err))
			}
			parts = append(parts, digest)
		}
		key := layerKey(parts...)
		p.setStep(n, len(steps), shorten(st.Text, 60))
		if m, ok := s.layers.get(key); ok {
			p.printf("step %d/%d %s: cached", n, len(steps), shorten(st.Text, 60))
			chain = append(chain, Layer{Key: key, Kind: m.Kind, Text: m.Text, DiffBytes: m.DiffBytes, BuildSeconds: m.BuildSeconds, Cached: true})
			parent = key
			continue
		}
		lower := s.layers.rootfs(parent)
		if st.Kind == dockerfile.StepWorkdir {
			if isDir(lower, st.Dest) {
				// Nothing to make: the directory is there. Config changes ride on
				// the next steps' keys.
				continue
			}
		}
		p.note("+ step %d/%d (line %d): %s", n, len(steps), st.Line, st.Text)
		t0 := time.Now()
		exit := -1
		kind := map[dockerfile.StepKind]string{dockerfile.StepRun: "run", dockerfile.StepCopy: "copy", dockerfile.StepWorkdir: "workdir"}[st.Kind]
		m, err := s.layers.create(ctx, layerMeta{Key: key, Parent: parent, Kind: kind, Text: st.Text}, func(tmp string) (int64, error) {
			upper := filepath.Join(tmp, "upper")
			// The upper's own root becomes the layer's root: it starts as the
			// parent's, as overlayfs's upper root would look.
			rootSt, err := os.Lstat(lower)
			if err != nil {
				return 0, err
			}
			if err := copyDirAttrs(lower, upper, rootSt); err != nil {
				return 0, err
			}
			switch st.Kind {
			case dockerfile.StepRun:
				b, err := openBox()
				if err != nil {
					return 0, err
				}
				p.setStep(n, len(steps), shorten(st.Text, 60))
				exit, err = b.Run(ctx, buildbox.Step{
					Lower: lower, Upper: upper, Args: st.Args, Env: st.Config.Env,
					Cwd: or(st.Config.Workdir, "/"), User: or(st.Config.User, "root"),
					Network: s.stepNetwork(req),
				}, p)
				if err != nil {
					exit = -1
					return 0, err
				}
				if exit != 0 {
					return 0, fmt.Errorf("exit code %d", exit)
				}
			case dockerfile.StepCopy:
				if err := bctx.CopyInto(ctx, st, lower, upper); err != nil {
					return 0, err
				}
			case dockerfile.StepWorkdir:
				if err := makeWorkdir(lower, upper, st.Dest, st.Config.User); err != nil {
					return 0, err
				}
			}
			diff, err := diskUsage(upper)
			if err != nil {
				return 0, err
			}
			if err := layer.Apply(lower, upper, filepath.Join(tmp, "rootfs")); err != nil {
				return 0, fmt.Errorf("apply the layer: %w", err)
			}
			return diff, removeTree(upper, true)
		})
		if err != nil {
			if exit > 0 {
				return Template{}, stepErr(exit, nil)
			}
			return Template{}, stepErr(-1, err)
		}
		p.printf("step %d/%d %s: done in %s (%s)", n, len(steps), shorten(st.Text, 60), FormatDuration(time.Since(t0)), formatSize(m.DiffBytes))
		chain = append(chain, Layer{Key: key, Kind: m.Kind, Text: m.Text, DiffBytes: m.DiffBytes, BuildSeconds: m.BuildSeconds})
		parent = key
	}

	p.setPhase(phaseFinish)
	// The planner reports "/" when nothing set a WORKDIR (where RUN steps ran);
	// as a sandbox default that would replace E2B's "the user's home".
	workdirSet := from.config.Workdir != ""
	for _, st := range steps {
		workdirSet = workdirSet || st.Kind == dockerfile.StepWorkdir
	}
	if !workdirSet {
		final.Workdir = ""
	}
	rootfs := s.layers.rootfs(parent)
	set := req.Settings.withDefaults()
	if set.DefaultUser == "" {
		set.DefaultUser = defaultUser(rootfs, final.User)
	}
	if set.DefaultWorkdir == "" {
		set.DefaultWorkdir = final.Workdir
	}
	b := buildRecord{
		BuildID: req.BuildID, Key: parent,
		Config:   ImageConfig{Env: final.Env, User: final.User, Workdir: final.Workdir},
		Settings: set, Layers: chain,
		Source:  Source{Dockerfile: req.DockerfilePath, Context: req.ContextDir, From: ref},
		BuiltAt: time.Now().UTC(),
		Log:     buildLogName(req.BuildID),
	}
	if origin.builtin != nil {
		b.Source = Source{Dockerfile: "builtin:" + origin.builtin.name, From: ref, Digest: origin.builtin.digest}
	}
	if old, err := s.readRecord(req.Name); err == nil {
		for _, ob := range old.Builds {
			if ob.Key == b.Key && ob.SizeBytes > 0 {
				b.SizeBytes = ob.SizeBytes
			}
		}
	}
	if b.SizeBytes == 0 {
		if b.SizeBytes, err = diskUsage(rootfs); err != nil {
			return Template{}, err
		}
	}
	for _, l := range chain {
		b.BuildSeconds += l.BuildSeconds
	}
	if err := ctx.Err(); err != nil {
		return Template{}, err
	}
	r, err := s.update(ctx, req.Name, func(r *record) (*record, error) {
		if r == nil {
			r = &record{Name: req.Name, CreatedAt: b.BuiltAt, Tags: map[string]tagRecord{}}
		}
		r.Builtin = origin.builtin != nil
		r.Builds = slices.DeleteFunc(r.Builds, func(o buildRecord) bool { return o.BuildID == b.BuildID })
		r.Builds = append(r.Builds, b)
		for _, t := range req.Tags {
			r.Tags[t] = tagRecord{BuildID: b.BuildID, CreatedAt: b.BuiltAt}
		}
		// A name's first build is its default too, so that the name alone
		// starts something after any first build (E2B would answer "no
		// default tag" until a build without a tag).
		if _, ok := r.Tags[DefaultTag]; !ok {
			r.Tags[DefaultTag] = tagRecord{BuildID: b.BuildID, CreatedAt: b.BuiltAt}
		}
		return r, nil
	})
	if err != nil {
		return Template{}, err
	}
	return s.toTemplate(r, b), nil
}

// buildLogName is the file in the template's directory that keeps a build's
// output.
func buildLogName(buildID string) string { return "build-" + buildID + ".log" }

// defaultUser is who runs a sandbox's commands when the settings name nobody: the
// Dockerfile's last USER, else E2B's "user" when the image has one, else root.
func defaultUser(rootfs, configUser string) string {
	if configUser != "" {
		u, _, _ := strings.Cut(configUser, ":")
		return u
	}
	if _, err := lookupUser(rootfs, "user"); err == nil {
		return "user"
	}
	return "root"
}

// lookupUser resolves a USER spec (name, uid, name:group, uid:gid) against the
// rootfs's own passwd and group files, read inside rootfs only.
func lookupUser(rootfs, spec string) (*user.ExecUser, error) {
	passwd, err := securejoin.SecureJoin(rootfs, "/etc/passwd")
	if err != nil {
		return nil, err
	}
	group, err := securejoin.SecureJoin(rootfs, "/etc/group")
	if err != nil {
		return nil, err
	}
	return user.GetExecUserPath(spec, &user.ExecUser{}, passwd, group)
}

// isDir reports whether path, resolved inside rootfs, is a directory there.
func isDir(rootfs, path string) bool {
	p, err := securejoin.SecureJoin(rootfs, path)
	if err != nil {
		return false
	}
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}

// makeWorkdir creates a WORKDIR that the parent lacks, in upper, owned by the USER
// in effect (as BuildKit does). Directories on the way that exist in lower are
// copied up with their attributes, as overlayfs would, so applying the layer keeps
// them as they were.
func makeWorkdir(lower, upper, dir, userSpec string) error {
	uid, gid := 0, 0
	if userSpec != "" {
		u, err := lookupUser(lower, userSpec)
		if err != nil {
			return fmt.Errorf("WORKDIR %s: user %q: %w", dir, userSpec, err)
		}
		uid, gid = u.Uid, u.Gid
	}
	resolved, err := securejoin.SecureJoin(lower, dir)
	if err != nil {
		return fmt.Errorf("WORKDIR %s: %w", dir, err)
	}
	rel, err := filepath.Rel(lower, resolved)
	if err != nil || strings.HasPrefix(rel, "..") {
		return fmt.Errorf("WORKDIR %s resolves outside the image", dir)
	}
	cur := ""
	for _, part := range strings.Split(rel, string(filepath.Separator)) {
		if part == "" || part == "." {
			continue
		}
		cur = filepath.Join(cur, part)
		dst := filepath.Join(upper, cur)
		if st, err := os.Lstat(filepath.Join(lower, cur)); err == nil && st.IsDir() {
			if err := copyDirAttrs(filepath.Join(lower, cur), dst, st); err != nil {
				return err
			}
			continue
		}
		if err := os.Mkdir(dst, 0o755); err != nil {
			return fmt.Errorf("WORKDIR %s: %w", dir, err)
		}
		if err := os.Lchown(dst, uid, gid); err != nil {
			return fmt.Errorf("WORKDIR %s: %w", dir, err)
		}
	}
	return nil
}

func firstWord(s string) string {
	w, _, _ := strings.Cut(strings.TrimSpace(s), " ")
	return strings.ToUpper(w)
}

// shorten cuts s to n runes for one-line display.
func shorten(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// stepNetwork is what a RUN step of req may reach beyond the internet: every
// private range for the operator's builds, only the ones the operator opened
// for sandboxes for an API key's.
func (s *Store) stepNetwork(req BuildRequest) netpolicy.Policy {
	if !req.Untrusted {
		return netpolicy.Policy{}
	}
	var p netpolicy.Policy
	for _, r := range netpolicy.PrivateRanges {
		if r.Addr().Is4() { // there is no IPv6 egress to close
			p.DenyOut = append(p.DenyOut, r.String())
		}
	}
	for _, r := range s.opts.AllowPrivate {
		p.AllowOut = append(p.AllowOut, r.String())
	}
	return p
}

// SweepBuildBox removes what a build of a process that died left running in
// the build sandbox (its step's processes, mounts, network), unless another
// build holds the box now (which swept when it opened it). A server calls it
// when it finds builds a previous run left unfinished: without it, their
// steps would run on until the next build.
func (s *Store) SweepBuildBox(ctx context.Context) error {
	if s.opts.EnvdPath == "" {
		return nil // no RUN step could have run
	}
	b, err := buildbox.Open(ctx, buildbox.Options{
		DataDir: s.opts.DataDir, EnvdPath: s.opts.EnvdPath, Egress: false,
		DNSUpstreams: s.opts.DNSUpstreams, Logger: s.log, NoWait: true,
	})
	if errors.Is(err, buildbox.ErrBusy) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("sweep the build sandbox: %w", err)
	}
	return b.Close()
}
