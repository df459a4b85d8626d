package template

// Tags and builds of one template name. See the package doc for the design;
// in short: template.json holds every build some tag names and the tags, it
// is rewritten whole (temp file, fsync, rename) under the store's tag lock,
// and a build no tag names is dropped in the same write.

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultTag is the tag a template reference without one means ("name" and
// "name:default" are the same build), as in E2B.
const DefaultTag = "default"

var (
	validTag     = regexp.MustCompile(`^[a-z0-9_.-]{1,128}$`)
	validBuildID = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,63}$`)
)

// ValidTag checks a tag: E2B's rule, 1-128 lower-case letters, digits, '.', '_'
// or '-'.
func ValidTag(tag string) error {
	if !validTag.MatchString(tag) {
		return fmt.Errorf("%w: tag %q: use 1-128 lower-case letters, digits, '.', '_' or '-'", ErrInvalid, tag)
	}
	return nil
}

// SplitRef splits a template reference "name[:tag]" into the name (an id or
// alias; not checked here) and its tag, DefaultTag when there is none. A
// reference with more than one ':' or a malformed tag is ErrInvalid.
func SplitRef(ref string) (name, tag string, err error) {
	name, tag, tagged := strings.Cut(ref, ":")
	if !tagged {
		return name, DefaultTag, nil
	}
	if strings.Contains(tag, ":") {
		return "", "", fmt.Errorf("%w: template %q: a reference is name[:tag], with one ':'", ErrInvalid, ref)
	}
	if tag == "" {
		return "", "", fmt.Errorf("%w: template %q: the tag after ':' is empty", ErrInvalid, ref)
	}
	if !validTag.MatchString(tag) {
		return "", "", fmt.Errorf("%w: template %q: the tag after ':' must be 1-128 lower-case letters, digits, '.', '_' or '-'", ErrInvalid, ref)
	}
	return name, tag, nil
}

// ParseRef is SplitRef for a reference whose name must be a valid template
// name (one being built or tagged, not looked up).
func ParseRef(ref string) (name, tag string, err error) {
	name, tag, err = SplitRef(ref)
	if err != nil {
		return "", "", err
	}
	if err := ValidName(name); err != nil {
		return "", "", err
	}
	return name, tag, nil
}

// NormalizeTags checks tags and returns them without duplicates, in order.
func NormalizeTags(tags []string) ([]string, error) {
	var out []string
	for _, t := range tags {
		if err := ValidTag(t); err != nil {
			return nil, err
		}
		if !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return out, nil
}

// newBuildID names a build made without one (`airlock template build`): the
// same shape as the E2B API's build ids (tplbuild).
func newBuildID() string { return strings.ToLower(rand.Text()) }

// legacyBuildID names the one build of a template.json written before tags,
// the same on every read (such a file is only rewritten by the next change).
func legacyBuildID(r *record) string {
	sum := sha256.Sum256([]byte("airlock-legacy-build\n" + r.Name + "\n" + r.Key + "\n" + r.BuiltAt.UTC().Format(time.RFC3339Nano)))
	return strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:16]))
}

// TagInfo is one tag of a template.
type TagInfo struct {
	Tag       string
	BuildID   string
	CreatedAt time.Time // when the tag was last pointed at BuildID
}

// normalize turns a record as read into the current shape: a file of
// version 1 (one build, no "builds") becomes one build named by "default".
// The top-level build fields are then the default build's.
func (r *record) normalize() error {
	if len(r.Builds) == 0 {
		b := r.buildRecord
		b.BuildID = legacyBuildID(r)
		if b.Log == "" {
			b.Log = "build.log"
		}
		r.Builds = []buildRecord{b}
		r.Tags = map[string]tagRecord{DefaultTag: {BuildID: b.BuildID, CreatedAt: b.BuiltAt}}
	}
	for tag, t := range r.Tags {
		if _, ok := r.build(t.BuildID); !ok {
			return fmt.Errorf("template %s: tag %q names build %s, which the record does not hold", r.Name, tag, t.BuildID)
		}
	}
	if d, ok := r.Tags[DefaultTag]; ok {
		b, _ := r.build(d.BuildID)
		r.buildRecord = b
	}
	return nil
}

func (r *record) build(id string) (buildRecord, bool) {
	for _, b := range r.Builds {
		if b.BuildID == id {
			return b, true
		}
	}
	return buildRecord{}, false
}

// byTag returns the build tag names; an unknown tag is ErrNotFound naming it
// and the tags there are.
func (r *record) byTag(tag string) (buildRecord, error) {
	t, ok := r.Tags[tag]
	if !ok {
		return buildRecord{}, fmt.Errorf("%w: template %s has no tag %q (its tags: %s)", ErrNotFound, r.Name, tag, strings.Join(r.tagNames(), ", "))
	}
	b, _ := r.build(t.BuildID)
	return b, nil
}

func (r *record) tagNames() []string {
	names := make([]string, 0, len(r.Tags))
	for t := range r.Tags {
		names = append(names, t)
	}
	sort.Strings(names)
	return names
}

// tagsOf lists the tags naming build id, sorted.
func (r *record) tagsOf(id string) []string {
	var out []string
	for _, t := range r.tagNames() {
		if r.Tags[t].BuildID == id {
			out = append(out, t)
		}
	}
	return out
}

// prune drops the builds no tag names and returns them.
func (r *record) prune() (dropped []buildRecord) {
	kept := r.Builds[:0:0]
	for _, b := range r.Builds {
		if len(r.tagsOf(b.BuildID)) > 0 {
			kept = append(kept, b)
		} else {
			dropped = append(dropped, b)
		}
	}
	r.Builds = kept
	return dropped
}

// lockTags takes the store's tag lock, an flock on templates/.lock: every
// change of a template.json (a build's commit, tag changes, removal) reads,
// changes and writes it holding the lock, in this process or another (flock
// locks belong to the open file, so goroutines exclude each other too).
func (s *Store) lockTags(ctx context.Context) (unlock func(), err error) {
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(s.dir, ".lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open the template lock: %w", err)
	}
	// Held only for a read and a rename, so polling is cheap and keeps the
	// wait cancellable.
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { _ = unix.Flock(int(f.Fd()), unix.LOCK_UN); f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			f.Close()
			return nil, fmt.Errorf("lock templates: %w", err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("waiting for the template lock: %w", ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// update changes template name's record under the tag lock: change gets the
// current record (nil when there is none) and returns the new one, or an
// error to change nothing. Builds the new record's tags no longer name are
// dropped in the same write, and their logs removed after it.
func (s *Store) update(ctx context.Context, name string, change func(cur *record) (*record, error)) (*record, error) {
	unlock, err := s.lockTags(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	cur, err := s.readRecord(name)
	if errors.Is(err, fs.ErrNotExist) {
		cur = nil
	} else if err != nil {
		return nil, err
	}
	next, err := change(cur)
	if err != nil {
		return nil, err
	}
	dropped := next.prune()
	if _, ok := next.Tags[DefaultTag]; !ok {
		return nil, fmt.Errorf("template %s: the change would leave no %q tag", name, DefaultTag)
	}
	if err := next.normalize(); err != nil {
		return nil, err
	}
	if err := s.writeRecord(next); err != nil {
		return nil, fmt.Errorf("record template %s: %w", name, err)
	}
	for _, b := range dropped {
		if b.Log != "" && !slices.ContainsFunc(next.Builds, func(k buildRecord) bool { return k.Log == b.Log }) {
			_ = os.Remove(filepath.Join(s.dir, name, b.Log))
		}
	}
	return next, nil
}

// Tags lists a template's tags by name. A template of the old layout has
// "default" only.
func (s *Store) Tags(idOrAlias string) ([]TagInfo, error) {
	r, err := s.record(idOrAlias)
	if err != nil {
		return nil, err
	}
	out := make([]TagInfo, 0, len(r.Tags))
	for _, t := range r.tagNames() {
		out = append(out, TagInfo{Tag: t, BuildID: r.Tags[t].BuildID, CreatedAt: r.Tags[t].CreatedAt})
	}
	return out, nil
}

// Builds returns a template's kept builds (those some tag names), newest
// first, each as Get would return it by one of its tags.
func (s *Store) Builds(idOrAlias string) ([]Template, error) {
	r, err := s.record(idOrAlias)
	if err != nil {
		return nil, err
	}
	out := make([]Template, 0, len(r.Builds))
	for _, b := range r.Builds {
		out = append(out, s.toTemplate(r, b))
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].BuiltAt.After(out[j].BuiltAt) })
	return out, nil
}

// record reads a built template's record by id or alias (no tag).
func (s *Store) record(idOrAlias string) (*record, error) {
	name, err := s.resolveName(idOrAlias)
	if err != nil {
		return nil, err
	}
	r, err := s.readRecord(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("template %q is not built: %w", name, ErrNotFound)
	}
	return r, err
}

// AssignTags points tags at the build target ("name[:tag]", the default tag
// when it has none) names, moving them from whatever build they named; a
// build left without tags is dropped (sandboxes running on it keep its
// layers until they end). Built-in templates have only "default": they are
// rebuilt from their definitions, which would silently undo a tag.
func (s *Store) AssignTags(ctx context.Context, target string, tags []string) (Template, error) {
	ref, tag, err := SplitRef(target)
	if err != nil {
		return Template{}, err
	}
	if tags, err = NormalizeTags(tags); err != nil {
		return Template{}, err
	}
	if len(tags) == 0 {
		return Template{}, fmt.Errorf("%w: give at least one tag to assign", ErrInvalid)
	}
	name, err := s.resolveName(ref)
	if err != nil {
		return Template{}, err
	}
	if s.IsBuiltin(name) {
		return Template{}, fmt.Errorf("%w: %s is a built-in template: it has only the tag %q", ErrBuiltinTags, name, DefaultTag)
	}
	var b buildRecord
	r, err := s.update(ctx, name, func(r *record) (*record, error) {
		if r == nil {
			return nil, fmt.Errorf("template %q is not built: %w", name, ErrNotFound)
		}
		if b, err = r.byTag(tag); err != nil {
			return nil, err
		}
		now := time.Now().UTC()
		for _, t := range tags {
			r.Tags[t] = tagRecord{BuildID: b.BuildID, CreatedAt: now}
		}
		return r, nil
	})
	if err != nil {
		return Template{}, err
	}
	if _, err := s.collect(); err != nil {
		s.log.Warn("template store: collecting unused layers", "err", err)
	}
	return s.toTemplate(r, b), nil
}

// RemoveTags removes tags from a template (a name without a tag); builds left
// without a tag are dropped. "default" cannot be removed: a name alone must
// always start something (move it with AssignTags instead). An unknown tag is
// ErrNotFound and removes nothing.
func (s *Store) RemoveTags(ctx context.Context, idOrAlias string, tags []string) error {
	if strings.Contains(idOrAlias, ":") {
		return fmt.Errorf("%w: template %q: name the template without a tag and list the tags to remove", ErrInvalid, idOrAlias)
	}
	tags, err := NormalizeTags(tags)
	if err != nil {
		return err
	}
	if len(tags) == 0 {
		return fmt.Errorf("%w: give at least one tag to remove", ErrInvalid)
	}
	if slices.Contains(tags, DefaultTag) {
		return fmt.Errorf("%w: the tag %q cannot be removed: it is what the name alone starts; point it at another build instead, or delete the template", ErrInvalid, DefaultTag)
	}
	name, err := s.resolveName(idOrAlias)
	if err != nil {
		return err
	}
	if s.IsBuiltin(name) {
		return fmt.Errorf("%w: %s is a built-in template: it has only the tag %q", ErrBuiltinTags, name, DefaultTag)
	}
	_, err = s.update(ctx, name, func(r *record) (*record, error) {
		if r == nil {
			return nil, fmt.Errorf("template %q is not built: %w", name, ErrNotFound)
		}
		for _, t := range tags {
			if _, ok := r.Tags[t]; !ok {
				return nil, fmt.Errorf("%w: template %s has no tag %q (its tags: %s)", ErrNotFound, name, t, strings.Join(r.tagNames(), ", "))
			}
		}
		for _, t := range tags {
			delete(r.Tags, t)
		}
		return r, nil
	})
	if err != nil {
		return err
	}
	if _, err := s.collect(); err != nil {
		s.log.Warn("template store: collecting unused layers", "err", err)
	}
	return nil
}
