package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/airlock-sandbox/airlock/internal/e2b"
	"github.com/airlock-sandbox/airlock/internal/envdapi"
	"github.com/airlock-sandbox/airlock/internal/layout"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/template"
	"github.com/airlock-sandbox/airlock/internal/tplbuild"
)

// BuildLimits bound the E2B API's template builds; zero values are
// tplbuild's defaults.
type BuildLimits struct {
	// Concurrent builds run at once server-wide; the others wait.
	Concurrent int
	// PerKey bounds one API key's builds that are waiting or building.
	PerKey int
	// MaxContextMB bounds what one build's uploaded files unpack to.
	MaxContextMB int64
	// Timeout bounds one build, from its start.
	Timeout time.Duration
}

// startTemplateBuilds starts the jobs of E2B API template builds; builds a
// previous server left unfinished are recorded as failed. Its closer cancels
// the running builds (the listeners, closed first, take no new ones).
func (d *Daemon) startTemplateBuilds() error {
	l := d.cfg.Builds
	b, err := tplbuild.Open(d.Templates, tplbuild.Options{
		Dir: d.Layout.TemplateBuilds(), FilesDir: d.Layout.TemplateFiles(), Logger: d.log,
		MaxConcurrent: l.Concurrent, MaxPerOwner: l.PerKey, MaxContext: l.MaxContextMB << 20, Timeout: l.Timeout,
	})
	if err != nil {
		return err
	}
	d.Builds = b
	d.push("template builds", b.Close)
	return nil
}

// e2bTemplates serves the E2B template endpoints from the template store. It
// lists built templates (an unbuilt built-in cannot make a sandbox, and the E2B
// shape describes a build); deleting refuses built-ins (serve --templates would
// rebuild them; `airlock template rm` can remove one) and templates that live
// sandboxes use, as the manager counts them.
type e2bTemplates struct {
	s   *template.Store
	mgr *sandbox.Manager
}

func (t e2bTemplates) List(context.Context) ([]e2b.TemplateInfo, error) {
	all, err := t.s.List()
	if err != nil {
		return nil, fmt.Errorf("list templates: %w", err)
	}
	var out []e2b.TemplateInfo
	for _, tpl := range all {
		if tpl.Ready {
			out = append(out, e2bTemplateInfo(tpl))
		}
	}
	return out, nil
}

// SetPublic changes the visibility of owner's template (the store refuses
// another's, and the operator's, with template.ErrOwned).
func (t e2bTemplates) SetPublic(_ context.Context, ref, owner string, public bool) error {
	err := t.s.SetPublic(ref, owner, public)
	switch {
	case errors.Is(err, template.ErrOwned):
		return fmt.Errorf("%w: %w", e2b.ErrTemplateProtected, err)
	case errors.Is(err, template.ErrNotFound):
		return fmt.Errorf("%w: %w", e2b.ErrTemplateNotFound, err)
	}
	return err
}

func (t e2bTemplates) Get(_ context.Context, ref string) (e2b.TemplateInfo, error) {
	tpl, err := t.s.Get(ref)
	if errors.Is(err, template.ErrNotFound) || errors.Is(err, template.ErrNotBuilt) {
		return e2b.TemplateInfo{}, fmt.Errorf("%w: %w", e2b.ErrTemplateNotFound, err)
	}
	if err != nil {
		return e2b.TemplateInfo{}, fmt.Errorf("template %q: %w", ref, err)
	}
	return e2bTemplateInfo(tpl), nil
}

func (t e2bTemplates) Delete(ctx context.Context, ref string) error {
	tpl, err := t.Get(ctx, ref)
	if err != nil {
		return err
	}
	if t.s.IsBuiltin(tpl.ID) {
		return fmt.Errorf("template %q is built in; remove it with `airlock template rm` on the server: %w", ref, e2b.ErrTemplateProtected)
	}
	err = t.s.Remove(ctx, tpl.ID, func(tt template.Template) (int, error) {
		live, err := t.mgr.List(ctx, sandbox.ListFilter{Template: tt.ID})
		return len(live), err
	})
	if errors.Is(err, template.ErrInUse) {
		return fmt.Errorf("%w: %w", e2b.ErrTemplateInUse, err)
	}
	if errors.Is(err, template.ErrNotFound) {
		return fmt.Errorf("%w: %w", e2b.ErrTemplateNotFound, err)
	}
	return err
}

// e2bTemplateInfo is a template as the E2B API describes it.
func e2bTemplateInfo(tpl template.Template) e2b.TemplateInfo {
	var aliases []string
	for _, a := range []string{tpl.Alias, tpl.Name} {
		if a != "" && a != tpl.ID && !slices.Contains(aliases, a) {
			aliases = append(aliases, a)
		}
	}
	if len(aliases) == 0 {
		aliases = []string{tpl.ID} // built-ins: the id is the name clients use
	}
	return e2b.TemplateInfo{
		ID:          tpl.ID,
		Aliases:     aliases,
		Owner:       tpl.Access.Owner,
		Public:      tpl.Access.Owner == "" || tpl.Access.Public, // the operator's: every key may use it
		BuildID:     tpl.Key,
		CPUCount:    tpl.Settings.CPUCount,
		MemoryMB:    tpl.Settings.MemoryMB,
		DiskSizeMB:  tpl.Settings.DiskSizeMB,
		EnvdVersion: envdapi.Version,
		CreatedAt:   tpl.BuiltAt,
		UpdatedAt:   tpl.BuiltAt,
	}
}

// RecordedSandboxes counts the sandboxes a server on dir has on record for a
// template (by id, name or alias), running or not: what `airlock template rm`
// must not pull the root filesystem from under. It reads the records without
// a server; a data dir no server ever ran on has none.
func RecordedSandboxes(ctx context.Context, dir layout.DataDir, t template.Template) (int, error) {
	if _, err := os.Stat(dir.DB()); err != nil {
		return 0, nil
	}
	db, err := store.OpenSQLite(dir.DB())
	if err != nil {
		return 0, err
	}
	defer db.Close()
	all, err := db.List(ctx)
	if err != nil {
		return 0, fmt.Errorf("sandbox records: %w", err)
	}
	n := 0
	for _, sb := range all {
		if sb.TemplateID == t.ID || sb.Alias == t.Name || slices.Contains(t.Aliases, sb.TemplateID) {
			n++
		}
	}
	return n, nil
}
