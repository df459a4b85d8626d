package tplbuild

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/template"
)

// Build states, the upstream TemplateBuildStatus values.
const (
	StatusWaiting  = "waiting"
	StatusBuilding = "building"
	StatusReady    = "ready"
	StatusError    = "error"
)

// Builder is what a job needs of the template store (template.Store).
type Builder interface {
	Build(ctx context.Context, req template.BuildRequest, progress io.Writer) (template.Template, error)
	Get(idOrAlias string) (template.Template, error)
	IsBuiltin(name string) bool
	// Claim makes an API key the owner of a name before its first build
	// (template.ErrOwned when another owns it); Unclaim frees a name whose
	// first build failed.
	Claim(name, owner string) error
	Unclaim(name, owner string) error
	// SweepBuildBox stops what builds of a dead server left running.
	SweepBuildBox(ctx context.Context) error
}

var (
	// ErrForbidden: the template belongs to another API key (403).
	ErrForbidden = errors.New("template belongs to another API key")
	// ErrLimit: a per-key bound on builds was reached (429).
	ErrLimit = errors.New("template build limit reached")
	// ErrFinished: the build is over and cannot be cancelled (409).
	ErrFinished = errors.New("template build already finished")
)

// Why a build's context ended, to say so in its status.
var (
	errCancelled = errors.New("the build was cancelled")
	errTimeLimit = errors.New("the build ran past its time limit")
)

// Options configures a Service.
type Options struct {
	// Dir holds the build records (<Dir>/<buildID>.json) and each running
	// build's context (<Dir>/<buildID>/); FilesDir the uploads by hash.
	Dir, FilesDir string
	// MaxConcurrent builds run at once; the others wait (status "waiting").
	// Default 1: a build already uses every core it can get.
	MaxConcurrent int
	// MaxPerOwner bounds one API key's started builds that are not over
	// (waiting or building); default DefaultMaxPerOwner.
	MaxPerOwner int
	// MaxFor, when set, gives an owner's (team's) own bound instead (0:
	// MaxPerOwner).
	MaxFor func(owner string) int
	// MaxUpload bounds one upload; default DefaultMaxUpload.
	MaxUpload int64
	// MaxContext bounds what one build's uploads unpack to together;
	// default DefaultMaxContext.
	MaxContext int64
	// Timeout bounds one build from its start (waiting included); default
	// DefaultTimeout.
	Timeout time.Duration
	Logger  *slog.Logger
	// Finished, when set, hears each build's end: its status (StatusReady
	// or StatusError) and how long it took from its request (the server's
	// metrics).
	Finished func(status string, took time.Duration)
}

// Defaults of Options' per-key bounds.
const (
	DefaultMaxPerOwner = 2
	DefaultTimeout     = time.Hour
)

// LogEntry is one line of a build's log (upstream BuildLogEntry).
type LogEntry struct {
	Timestamp time.Time `json:"timestamp"`
	Level     string    `json:"level"`
	Message   string    `json:"message"`
	Step      string    `json:"step,omitempty"`
}

// Reason says why a build failed (upstream BuildStatusReason).
type Reason struct {
	Message string `json:"message"`
	// Step is the SDK's step number ("1" is its first step) or "base".
	Step string `json:"step,omitempty"`
}

// Status is a build's state and a page of its log.
type Status struct {
	TemplateID, BuildID string
	Status              string
	Entries             []LogEntry
	Reason              *Reason
}

// Request is a build asked for by POST /v3/templates.
type Request struct {
	Name     string // name[:tag]
	Tags     []string
	CPUCount int
	MemoryMB int
	// Owner is the API key's digest (e2b.OwnerOf); the template's owner.
	// Empty (in-process callers) builds as the server's operator.
	Owner string
}

// record is a build as kept on disk, so a restart can answer for it.
type record struct {
	TemplateID string    `json:"templateID"`
	BuildID    string    `json:"buildID"`
	Owner      string    `json:"owner,omitempty"`
	Status     string    `json:"status"`
	Reason     *Reason   `json:"reason,omitempty"`
	CPUCount   int       `json:"cpuCount,omitempty"`
	MemoryMB   int       `json:"memoryMB,omitempty"`
	Started    bool      `json:"started,omitempty"` // the steps were posted
	Tags       []string  `json:"tags,omitempty"`    // the tags the build gets when ready
	CreatedAt  time.Time `json:"createdAt"`
	FinishedAt time.Time `json:"finishedAt,omitzero"`
}

type job struct {
	rec     record
	entries []LogEntry
	// cancel ends the build's context (with errCancelled); set by Start.
	cancel context.CancelCauseFunc
	// changed is closed (and replaced) when the status changes.
	changed chan struct{}
}

// notifyLocked wakes the waiters of a status change.
func (j *job) notifyLocked() {
	if j.changed != nil {
		close(j.changed)
		j.changed = nil
	}
}

// over reports whether a build has an outcome.
func (r record) over() bool { return r.Status == StatusReady || r.Status == StatusError }

// maxEntries bounds a build's log kept in memory; past it lines are counted,
// not kept (the full output is in the template's build.log).
const maxEntries = 20000

// requestTTL is how long a requested build may wait for its start.
const requestTTL = time.Hour

// recordTTL is how long finished builds are answered for after a restart.
const recordTTL = 7 * 24 * time.Hour

// Service runs builds as jobs: one record and one in-memory log per build.
type Service struct {
	b     Builder
	opts  Options
	files files
	log   *slog.Logger
	slots chan struct{}

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu   sync.Mutex
	jobs map[string]*job
}

// Open starts a Service. Builds a previous server left waiting or building
// (it stopped or crashed during them) are recorded as failed: nothing of
// theirs was kept, and a client polling them must not wait forever.
func Open(b Builder, opts Options) (*Service, error) {
	if opts.MaxConcurrent <= 0 {
		opts.MaxConcurrent = 1
	}
	if opts.MaxUpload <= 0 {
		opts.MaxUpload = DefaultMaxUpload
	}
	if opts.MaxPerOwner <= 0 {
		opts.MaxPerOwner = DefaultMaxPerOwner
	}
	if opts.MaxContext <= 0 {
		opts.MaxContext = DefaultMaxContext
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	for _, d := range []string{opts.Dir, opts.FilesDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("template builds: %w", err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Service{
		b: b, opts: opts, files: files{dir: opts.FilesDir, max: opts.MaxUpload}, log: opts.Logger,
		slots: make(chan struct{}, opts.MaxConcurrent), ctx: ctx, cancel: cancel, jobs: map[string]*job{},
	}
	if err := s.recover(); err != nil {
		cancel()
		return nil, err
	}
	return s, nil
}

// recover fails the builds a previous server left unfinished, removes their
// contexts, and forgets records older than recordTTL.
func (s *Service) recover() error {
	ents, err := os.ReadDir(s.opts.Dir)
	if err != nil {
		return fmt.Errorf("template builds: %w", err)
	}
	swept := false
	for _, e := range ents {
		p := filepath.Join(s.opts.Dir, e.Name())
		if e.IsDir() {
			_ = os.RemoveAll(p) // a context of a build that is over
			continue
		}
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok {
			continue
		}
		r, err := s.readRecord(id)
		if err != nil {
			s.log.Warn("template builds: unreadable record removed", "file", p, "err", err)
			_ = os.Remove(p)
			continue
		}
		switch {
		case r.Status == StatusBuilding:
			swept = swept || s.sweep()
			fallthrough
		case r.Status == StatusWaiting:
			r.Status = StatusError
			r.Reason = &Reason{Message: "the server restarted during the build; build again"}
			r.FinishedAt = time.Now().UTC()
			if err := s.writeRecord(r); err != nil {
				return err
			}
			s.unclaim(r)
		case time.Since(r.FinishedAt) > recordTTL:
			_ = os.Remove(p)
		}
	}
	return nil
}

// sweep stops the steps of builds a dead server ran; it reports whether
// it ran (once is enough).
func (s *Service) sweep() bool {
	ctx, cancel := context.WithTimeout(s.ctx, time.Minute)
	defer cancel()
	if err := s.b.SweepBuildBox(ctx); err != nil {
		s.log.Warn("template builds: sweeping the build sandbox of unfinished builds", "err", err)
	}
	return true
}

// Close cancels the running builds and waits for them; each is recorded as
// failed by its own goroutine.
func (s *Service) Close() error {
	s.cancel()
	s.wg.Wait()
	return nil
}

// MaxUpload is the size bound of one upload.
func (s *Service) MaxUpload() int64 { return s.opts.MaxUpload }

func (s *Service) recordPath(id string) string { return filepath.Join(s.opts.Dir, id+".json") }

func (s *Service) readRecord(id string) (record, error) {
	var r record
	data, err := os.ReadFile(s.recordPath(id))
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return r, fmt.Errorf("build record %s: %w", id, err)
	}
	return r, nil
}

// writeRecord replaces a record atomically (write, sync, rename).
func (s *Service) writeRecord(r record) error {
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(s.opts.Dir, ".tmp-"+r.BuildID+"-*")
	if err != nil {
		return fmt.Errorf("build record: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("build record: %w", err)
	}
	if err := os.Rename(tmp.Name(), s.recordPath(r.BuildID)); err != nil {
		return fmt.Errorf("build record: %w", err)
	}
	return nil
}

// ParseName splits the SDK's "name[:tag]"; the tag is "default" when there
// is none. A malformed name or tag (a:b:c, "a:", bad characters) is ErrInvalid.
func ParseName(s string) (name, tag string, err error) {
	name, tag, err = template.ParseRef(s)
	if err != nil {
		return "", "", fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return name, tag, nil
}

// BuildTags returns the template name and the tags a build of name[:tag]
// gets: the name's tag (upstream reads it as one more entry of tags), then
// tags, without duplicates.
func BuildTags(nameTag string, tags []string) (name string, all []string, err error) {
	name, tag, err := ParseName(nameTag)
	if err != nil {
		return "", nil, err
	}
	if all, err = template.NormalizeTags(append([]string{tag}, tags...)); err != nil {
		return "", nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return name, all, nil
}

// Request registers a build of name (see ParseName) and returns its
// template and build ids. Nothing is built until Start.
func (s *Service) Request(req Request) (templateID, buildID string, err error) {
	s.expireRequests()
	name, tags, err := BuildTags(req.Name, req.Tags)
	if err != nil {
		return "", "", err
	}
	if s.b.IsBuiltin(name) {
		return "", "", fmt.Errorf("%w: %q is a built-in template's name; choose another", ErrInvalid, name)
	}
	if req.CPUCount < 0 || req.MemoryMB < 0 {
		return "", "", fmt.Errorf("%w: cpuCount and memoryMB must not be negative", ErrInvalid)
	}
	if req.Owner != "" {
		if err := s.b.Claim(name, req.Owner); err != nil {
			if errors.Is(err, template.ErrOwned) {
				return "", "", fmt.Errorf("%w: %w", ErrForbidden, err)
			}
			return "", "", fmt.Errorf("claim template %s: %w", name, err)
		}
	}
	r := record{
		TemplateID: name, BuildID: rand.Text(), Status: StatusWaiting, Owner: req.Owner,
		CPUCount: req.CPUCount, MemoryMB: req.MemoryMB, CreatedAt: time.Now().UTC(),
		Tags: tags,
	}
	r.BuildID = strings.ToLower(r.BuildID)
	if err := s.writeRecord(r); err != nil {
		return "", "", err
	}
	s.mu.Lock()
	s.jobs[r.BuildID] = &job{rec: r}
	s.mu.Unlock()
	return r.TemplateID, r.BuildID, nil
}

// knownTemplate reports whether templateID has a build of owner's here or
// is a template owner may use.
func (s *Service) knownTemplate(owner, templateID string) bool {
	s.mu.Lock()
	for _, j := range s.jobs {
		if j.rec.TemplateID == templateID && j.rec.Owner == owner {
			s.mu.Unlock()
			return true
		}
	}
	s.mu.Unlock()
	t, err := s.b.Get(templateID)
	return err == nil && t.Access.VisibleTo(owner)
}

// FilePresent answers GET /templates/{id}/files/{hash} for owner.
func (s *Service) FilePresent(owner, templateID, hash string) (bool, error) {
	if !ValidHash(hash) {
		return false, fmt.Errorf("%w: files hash %q is not a hex sha256", ErrInvalid, hash)
	}
	if !s.knownTemplate(owner, templateID) {
		return false, fmt.Errorf("%w: template %q", ErrNotFound, templateID)
	}
	return s.files.present(owner, hash), nil
}

// PutFile stores owner's upload (the PUT to the URL FilePresent's caller got).
func (s *Service) PutFile(owner, hash string, r io.Reader) error {
	return s.files.put(owner, hash, r)
}

// Start checks the steps, assembles the build context from the uploads and
// queues owner's build. Errors are the client's (ErrInvalid, ErrNotFound,
// ErrLimit, ErrTooLarge) until the job is queued; after that they are the
// build's status. A build refused here is dropped (its record, and the
// name's claim when it was the name's first build): the SDK gives up on it,
// and nothing of it may be left.
func (s *Service) Start(owner, templateID, buildID string, spec Spec) error {
	s.mu.Lock()
	j := s.jobs[buildID]
	if j == nil || j.rec.TemplateID != templateID || j.rec.Owner != owner {
		s.mu.Unlock()
		return fmt.Errorf("%w: build %s of template %s", ErrNotFound, buildID, templateID)
	}
	if j.rec.Started {
		s.mu.Unlock()
		return fmt.Errorf("%w: build %s was started already", ErrInvalid, buildID)
	}
	if j.rec.over() {
		s.mu.Unlock()
		return fmt.Errorf("%w: build %s is %s", ErrFinished, buildID, j.rec.Status)
	}
	j.rec.Started = true // claimed: a second POST must not start it twice
	n := s.activeLocked(owner)
	s.mu.Unlock()
	refuse := func() { s.drop(j) } // a build refused here never existed
	if own := s.ownBound(owner); own > 0 {
		if n > own {
			refuse()
			return fmt.Errorf("%w: quota of template builds at once reached: the team has %d builds waiting or building, its limit is %d; wait for one to finish", ErrLimit, n-1, own)
		}
	} else if n > s.opts.MaxPerOwner {
		refuse()
		return fmt.Errorf("%w: this API key has %d builds waiting or building, the server's bound (serve --builds-per-key %d); wait for one to finish", ErrLimit, n-1, s.opts.MaxPerOwner)
	}

	// Steps start as the source's default user, as upstream's do (its base
	// runs them as "user"): a template's setting, else its last USER. An
	// image's USER is the builder's to read when it has pulled it.
	var sourceUser string
	from, isTemplate, err := Source(spec)
	if err != nil {
		refuse()
		return err
	}
	if isTemplate {
		src, err := s.b.Get(from)
		if err == nil && !src.Access.VisibleTo(owner) {
			err = fmt.Errorf("template %q: %w", from, template.ErrNotFound)
		}
		if err != nil {
			refuse()
			return fmt.Errorf("%w: source template %s: %w", ErrInvalid, from, err)
		}
		sourceUser = src.Config.User
		if src.Settings.DefaultUser != "" {
			sourceUser = src.Settings.DefaultUser
		}
	}
	conv, err := Convert(spec, sourceUser)
	if err != nil {
		refuse()
		return err
	}
	ctxDir := filepath.Join(s.opts.Dir, buildID)
	var unverified []string
	budget := s.opts.MaxContext
	for _, c := range conv.Copies {
		dst := filepath.Join(ctxDir, c.Hash)
		if _, err := os.Stat(dst); err == nil {
			continue // the same files copied twice
		}
		ok, size, err := s.files.extract(s.ctx, owner, c, dst, budget)
		if err != nil {
			_ = os.RemoveAll(ctxDir)
			refuse()
			return err
		}
		budget -= size
		if !ok {
			unverified = append(unverified, c.Src)
		}
	}
	// The time bound runs from here: a build that waits long for a slot is
	// still bounded, and its client learns so from its status.
	ctx, cancel := context.WithCancelCause(s.ctx)
	ctx, stop := context.WithTimeoutCause(ctx, s.opts.Timeout, fmt.Errorf("%w (%s, serve --build-timeout)", errTimeLimit, s.opts.Timeout))
	s.mu.Lock()
	j.cancel = cancel
	s.mu.Unlock()
	j.rec.Status = StatusWaiting
	if err := s.writeRecord(s.snapshot(j)); err != nil {
		stop()
		cancel(nil)
		_ = os.RemoveAll(ctxDir)
		refuse()
		return err
	}
	for _, src := range unverified {
		s.appendLog(j, "warn", "", fmt.Sprintf("the files of COPY %s could not be checked against their hash (directory sizes depend on the client's filesystem); using them as uploaded", src))
	}
	settings := template.Settings{
		CPUCount: j.rec.CPUCount, MemoryMB: j.rec.MemoryMB,
		StartCmd: spec.StartCmd, ReadyCmd: spec.ReadyCmd,
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer stop()
		defer cancel(nil)
		s.run(ctx, j, conv, ctxDir, settings)
	}()
	return nil
}

// drop forgets a build that never ran: its record, its job, and the name's
// claim when it has no template.
func (s *Service) drop(j *job) {
	s.mu.Lock()
	delete(s.jobs, j.rec.BuildID)
	rec := j.rec
	s.mu.Unlock()
	if err := os.Remove(s.recordPath(rec.BuildID)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.log.Warn("template builds: removing a refused build's record", "build", rec.BuildID, "err", err)
	}
	s.unclaim(rec)
}

// expireRequests drops builds requested longer than requestTTL ago and
// never started (a client that went away between its two calls), so their
// names are not claimed forever.
func (s *Service) expireRequests() {
	s.mu.Lock()
	var stale []*job
	for _, j := range s.jobs {
		if !j.rec.Started && !j.rec.over() && time.Since(j.rec.CreatedAt) > requestTTL {
			stale = append(stale, j)
		}
	}
	s.mu.Unlock()
	for _, j := range stale {
		s.drop(j)
	}
}

// activeLocked counts owner's started builds that are not over.
// ownBound is the owner's own bound of builds at once (0: none, the
// server's applies).
func (s *Service) ownBound(owner string) int {
	if s.opts.MaxFor == nil {
		return 0
	}
	return s.opts.MaxFor(owner)
}

func (s *Service) activeLocked(owner string) int {
	n := 0
	for _, j := range s.jobs {
		if j.rec.Owner == owner && j.rec.Started && !j.rec.over() {
			n++
		}
	}
	return n
}

// Cancel ends owner's build: a waiting one never starts, a running one
// stops at once (the build sandbox is killed and nothing of the build is
// kept); its status becomes error with the reason. ErrFinished when it is
// over already.
func (s *Service) Cancel(owner, templateID, buildID string) error {
	s.mu.Lock()
	j := s.jobs[buildID]
	if j == nil || j.rec.TemplateID != templateID || j.rec.Owner != owner {
		s.mu.Unlock()
		if r, err := s.readRecord(buildID); err == nil && r.TemplateID == templateID && r.Owner == owner {
			return fmt.Errorf("%w: build %s is %s", ErrFinished, buildID, r.Status)
		}
		return fmt.Errorf("%w: build %s of template %s", ErrNotFound, buildID, templateID)
	}
	rec, cancel := j.rec, j.cancel
	s.mu.Unlock()
	if rec.over() {
		return fmt.Errorf("%w: build %s is %s", ErrFinished, buildID, rec.Status)
	}
	if cancel == nil {
		// Requested, never started: nothing runs; record the outcome here.
		s.unclaim(rec)
		s.finish(j, StatusError, &Reason{Message: errCancelled.Error() + " before it started"})
		return nil
	}
	cancel(errCancelled)
	return nil
}

// CancelTemplate cancels owner's builds of templateID that are not over and
// reports how many there were.
func (s *Service) CancelTemplate(owner, templateID string) int {
	s.mu.Lock()
	var ids []string
	for id, j := range s.jobs {
		if j.rec.TemplateID == templateID && j.rec.Owner == owner && !j.rec.over() {
			ids = append(ids, id)
		}
	}
	s.mu.Unlock()
	n := 0
	for _, id := range ids {
		if s.Cancel(owner, templateID, id) == nil {
			n++
		}
	}
	return n
}

// unclaim frees the name of a first build that failed (the store keeps the
// owner of a name that has a template).
func (s *Service) unclaim(r record) {
	if r.Owner == "" {
		return
	}
	// Another build of the name by its owner still needs the claim.
	s.mu.Lock()
	for _, j := range s.jobs {
		if j.rec.BuildID != r.BuildID && j.rec.TemplateID == r.TemplateID && j.rec.Owner == r.Owner && !j.rec.over() {
			s.mu.Unlock()
			return
		}
	}
	s.mu.Unlock()
	if err := s.b.Unclaim(r.TemplateID, r.Owner); err != nil {
		s.log.Warn("template builds: freeing the name of a failed first build", "template", r.TemplateID, "err", err)
	}
}

func (s *Service) snapshot(j *job) record {
	s.mu.Lock()
	defer s.mu.Unlock()
	return j.rec
}

// run waits for a slot, builds, and records the outcome.
func (s *Service) run(ctx context.Context, j *job, conv Converted, ctxDir string, settings template.Settings) {
	status, reason := s.build(ctx, j, conv, ctxDir, settings)
	// Cleaned up before the outcome is recorded: a client that sees it
	// finds nothing of the build left.
	_ = os.RemoveAll(ctxDir)
	if status == StatusError {
		s.unclaim(s.snapshot(j))
	}
	s.finish(j, status, reason)
}

// build waits for a slot and builds; it returns the outcome.
func (s *Service) build(ctx context.Context, j *job, conv Converted, ctxDir string, settings template.Settings) (string, *Reason) {
	select {
	case s.slots <- struct{}{}:
	case <-ctx.Done():
		return StatusError, s.stopped(ctx, "before it started")
	}
	defer func() { <-s.slots }()
	s.setStatus(j, StatusBuilding)
	s.appendLog(j, "info", "", "Building template "+j.rec.TemplateID+" from "+firstLine(conv.Dockerfile))
	// Two writers: the builder's status lines and the steps' raw output
	// arrive from different goroutines and must not mix within a line.
	status, output := &logWriter{s: s, j: j}, &logWriter{s: s, j: j}
	_, err := s.b.Build(ctx, template.BuildRequest{
		Name: j.rec.TemplateID, Dockerfile: []byte(conv.Dockerfile), ContextDir: ctxDir,
		Settings: settings, Replace: true, Output: output, NoCacheFromLine: conv.NoCacheFromLine,
		Untrusted: true, // an API key's steps, not the operator's
		BuildID:   j.rec.BuildID, Tags: j.rec.Tags,
		Keychain: conv.Keychain,
	}, status)
	status.flush()
	output.flush()
	switch {
	case err != nil && ctx.Err() != nil:
		return StatusError, s.stopped(ctx, "during the build")
	case err != nil:
		return StatusError, failure(err, conv)
	}
	return StatusReady, nil
}

// stopped is the reason of a build whose context ended: the server shut
// down, the client cancelled it, or it ran out of time.
func (s *Service) stopped(ctx context.Context, when string) *Reason {
	if s.ctx.Err() != nil {
		return &Reason{Message: "the server shut down " + when + "; build again"}
	}
	return &Reason{Message: context.Cause(ctx).Error() + " " + when}
}

// failure turns a build error into the reason the SDK throws: the failing
// SDK step, its exit code and the last lines of its output.
func failure(err error, conv Converted) *Reason {
	r := &Reason{Message: err.Error()}
	var be *template.BuildError
	var se *template.StepError
	if errors.As(err, &se) {
		step := conv.StepOfLine[se.Line]
		if step > 0 {
			r.Step = fmt.Sprint(step)
		}
		var b strings.Builder
		fmt.Fprintf(&b, "step %d: %s", step, se.Text)
		if se.ExitCode >= 0 {
			fmt.Fprintf(&b, ": exited with code %d", se.ExitCode)
		} else {
			fmt.Fprintf(&b, ": %v", se.Err)
		}
		if errors.As(err, &be) && len(be.Tail) > 0 {
			tail := be.Tail
			if len(tail) > 10 {
				tail = tail[len(tail)-10:]
			}
			b.WriteString("\nlast output:\n  " + strings.Join(tail, "\n  "))
		}
		r.Message = b.String()
	} else {
		if errors.As(err, &be) {
			r.Message = be.Err.Error()
		}
		// Before the steps there is only the source: the image that could
		// not be pulled (the message names it and the cause) or the template.
		r.Step = "base"
	}
	return r
}

func (s *Service) setStatus(j *job, status string) {
	s.mu.Lock()
	j.rec.Status = status
	rec := j.rec
	s.mu.Unlock()
	if err := s.writeRecord(rec); err != nil {
		s.log.Warn("template builds: recording status", "build", rec.BuildID, "err", err)
	}
	s.mu.Lock()
	j.notifyLocked()
	s.mu.Unlock()
}

// StatusChanged returns a channel closed at the next status change of
// owner's build, or nil when the build is over or not this server's to
// watch: a status poll can wait on it instead of answering "building"
// again at once (the SDK polls every 200 ms, so an answer held until the
// change saves the client most of a poll interval at the end of a build).
func (s *Service) StatusChanged(owner, templateID, buildID string) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	j := s.jobs[buildID]
	if j == nil || j.rec.TemplateID != templateID || j.rec.Owner != owner || j.rec.over() {
		return nil
	}
	if j.changed == nil {
		j.changed = make(chan struct{})
	}
	return j.changed
}

func (s *Service) finish(j *job, status string, reason *Reason) {
	if reason != nil {
		s.appendLog(j, "error", reason.Step, reason.Message)
	} else {
		s.appendLog(j, "info", "", "Template "+j.rec.TemplateID+" is ready")
	}
	s.mu.Lock()
	j.rec.Status, j.rec.Reason, j.rec.FinishedAt = status, reason, time.Now().UTC()
	rec := j.rec
	s.mu.Unlock()
	if f := s.opts.Finished; f != nil {
		f(status, rec.FinishedAt.Sub(rec.CreatedAt))
	}
	if err := s.writeRecord(rec); err != nil {
		s.log.Warn("template builds: recording the outcome", "build", rec.BuildID, "err", err)
	}
	s.mu.Lock()
	j.notifyLocked()
	s.mu.Unlock()
}

func (s *Service) appendLog(j *job, level, step, msg string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(j.entries) == maxEntries {
		j.entries = append(j.entries, LogEntry{Timestamp: time.Now().UTC(), Level: "warn", Message: "(more output in the template's build.log on the server)"})
	}
	if len(j.entries) > maxEntries {
		return
	}
	j.entries = append(j.entries, LogEntry{Timestamp: time.Now().UTC(), Level: level, Message: msg, Step: step})
}

// Status returns owner's build's state and up to limit log entries from
// offset. A build of an earlier server run has its record but no log.
func (s *Service) Status(owner, templateID, buildID string, offset, limit int) (Status, error) {
	s.mu.Lock()
	j := s.jobs[buildID]
	var rec record
	var entries []LogEntry
	if j != nil {
		rec = j.rec
		if offset < len(j.entries) {
			end := min(len(j.entries), offset+limit)
			entries = append(entries, j.entries[offset:end]...)
		}
	}
	s.mu.Unlock()
	if j == nil {
		r, err := s.readRecord(buildID)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return Status{}, fmt.Errorf("%w: build %s of template %s", ErrNotFound, buildID, templateID)
			}
			return Status{}, err
		}
		rec = r
	}
	if rec.TemplateID != templateID || rec.Owner != owner {
		return Status{}, fmt.Errorf("%w: build %s of template %s", ErrNotFound, buildID, templateID)
	}
	return Status{TemplateID: rec.TemplateID, BuildID: rec.BuildID, Status: rec.Status, Entries: entries, Reason: rec.Reason}, nil
}

// logWriter turns the builder's output into log entries, one per line.
type logWriter struct {
	s   *Service
	j   *job
	mu  sync.Mutex
	buf []byte
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexAny(w.buf, "\n\r")
		if i < 0 {
			break
		}
		if l := strings.TrimSpace(string(w.buf[:i])); l != "" {
			w.s.appendLog(w.j, "info", "", l)
		}
		w.buf = w.buf[i+1:]
	}
	if len(w.buf) > 8192 {
		w.s.appendLog(w.j, "info", "", string(w.buf))
		w.buf = w.buf[:0]
	}
	return len(p), nil
}

func (w *logWriter) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if l := strings.TrimSpace(string(w.buf)); l != "" {
		w.s.appendLog(w.j, "info", "", l)
	}
	w.buf = nil
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return strings.TrimPrefix(l, "FROM ")
}
