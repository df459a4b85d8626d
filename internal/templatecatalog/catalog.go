// Package templatecatalog serves the E2B template endpoints from a
// template store: one box's (every template, changes allowed) and a
// Kubernetes replica's (the templates it serves, read only).
package templatecatalog

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/airlock-sandbox/airlock/internal/e2b"
	"github.com/airlock-sandbox/airlock/internal/envdapi"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/template"
	"github.com/airlock-sandbox/airlock/internal/tplbuild"
)

// Catalog serves the E2B template endpoints (e2b.TemplateCatalog) from a
// template store. It lists built templates (an unbuilt built-in cannot make
// a sandbox, and the E2B shape describes a build); deleting refuses
// built-ins (serve --templates would rebuild them; `airlock template rm` can
// remove one) and templates that live sandboxes use, as InUse counts them.
type Catalog struct {
	Store *template.Store
	// InUse counts the live sandboxes of a template, by its ID.
	InUse func(ctx context.Context, templateID string) (int, error)
	// Builds has the records of E2B API builds, for a template's build
	// list; nil lists the kept builds only.
	Builds *tplbuild.Service
	// Served, when set, is all the catalog shows (by name or ID), read
	// only: a replica over Kubernetes serves a template volume it shares
	// with others, and changes there are made on the box that builds them.
	Served []string
}

// errReadOnly is a change asked of a read-only catalog.
func errReadOnly(what string) error {
	return fmt.Errorf("%w: %s: this server's templates are read only (built and changed on the box whose data dir it serves)", sandbox.ErrNotSupported, what)
}

// shown reports whether the catalog shows tpl.
func (t Catalog) shown(tpl template.Template) bool {
	return t.Served == nil || slices.Contains(t.Served, tpl.ID) || slices.Contains(t.Served, tpl.Name)
}

// get is a template the catalog shows.
func (t Catalog) get(ref string) (template.Template, error) {
	tpl, err := t.Store.Get(ref)
	if err == nil && !t.shown(tpl) {
		err = fmt.Errorf("%w: %q", template.ErrNotFound, ref)
	}
	return tpl, err
}

func (t Catalog) List(context.Context) ([]e2b.TemplateInfo, error) {
	all, err := t.Store.List()
	if err != nil {
		return nil, fmt.Errorf("list templates: %w", err)
	}
	var out []e2b.TemplateInfo
	for _, tpl := range all {
		if tpl.Ready && t.shown(tpl) {
			out = append(out, Info(tpl))
		}
	}
	return out, nil
}

// SetPublic changes the visibility of owner's template (the store refuses
// another's, and the operator's, with template.ErrOwned).
func (t Catalog) SetPublic(_ context.Context, ref, owner string, public bool) error {
	if t.Served != nil {
		return errReadOnly("changing a template's visibility")
	}
	err := t.Store.SetPublic(ref, owner, public)
	switch {
	case errors.Is(err, template.ErrOwned):
		return fmt.Errorf("%w: %w", e2b.ErrTemplateProtected, err)
	case errors.Is(err, template.ErrNotFound):
		return fmt.Errorf("%w: %w", e2b.ErrTemplateNotFound, err)
	}
	return err
}

func (t Catalog) Get(_ context.Context, ref string) (e2b.TemplateInfo, error) {
	tpl, err := t.get(ref)
	if err != nil {
		return e2b.TemplateInfo{}, storeError(ref, err)
	}
	info := Info(tpl)
	if info.Builds, err = t.buildList(tpl); err != nil {
		return e2b.TemplateInfo{}, err
	}
	info.BuildCount = len(info.Builds)
	return info, nil
}

func (t Catalog) Access(_ context.Context, ref string) (e2b.TemplateAccess, error) {
	tpl, err := t.get(ref)
	if err != nil {
		return e2b.TemplateAccess{}, storeError(ref, err)
	}
	info := Info(tpl)
	return e2b.TemplateAccess{Owner: info.Owner, Public: info.Public}, nil
}

// storeError maps the template store's errors to the e2b package's.
func storeError(ref string, err error) error {
	switch {
	case errors.Is(err, template.ErrNotFound) || errors.Is(err, template.ErrNotBuilt):
		return fmt.Errorf("%w: %w", e2b.ErrTemplateNotFound, err)
	case errors.Is(err, template.ErrBuiltinTags):
		return fmt.Errorf("%w: %w", e2b.ErrTemplateProtected, err)
	case errors.Is(err, template.ErrInvalid):
		return fmt.Errorf("%w: %w", sandbox.ErrInvalid, err)
	}
	return fmt.Errorf("template %q: %w", ref, err)
}

// buildList is a template's builds, newest first: the builds the store keeps
// (some tag names them; ready), then the E2B API builds that are waiting,
// building or failed. An API build that finished but was dropped since (its
// tags moved on) is not listed: nothing of it is left to start.
func (t Catalog) buildList(tpl template.Template) ([]e2b.TemplateBuildInfo, error) {
	kept, err := t.Store.Builds(tpl.ID)
	if err != nil {
		return nil, fmt.Errorf("template %s: list builds: %w", tpl.ID, err)
	}
	var records []tplbuild.BuildInfo
	if t.Builds != nil {
		if records, err = t.Builds.Builds(tpl.ID); err != nil {
			return nil, fmt.Errorf("template %s: list build records: %w", tpl.ID, err)
		}
	}
	requested := map[string]time.Time{}
	for _, r := range records {
		requested[r.BuildID] = r.CreatedAt
	}
	var out []e2b.TemplateBuildInfo
	for _, k := range kept {
		created := k.BuiltAt
		if at, ok := requested[k.BuildID]; ok {
			created = at
		}
		out = append(out, e2b.TemplateBuildInfo{
			ID: k.BuildID, Status: e2b.BuildStatusReady,
			CreatedAt: created, UpdatedAt: k.BuiltAt, FinishedAt: k.BuiltAt,
			CPUCount: k.Settings.CPUCount, MemoryMB: k.Settings.MemoryMB, DiskSizeMB: k.Settings.DiskSizeMB,
			EnvdVersion: envdapi.Version,
		})
	}
	for _, r := range records {
		if r.Status == tplbuild.StatusReady {
			continue // kept above, or dropped
		}
		b := e2b.TemplateBuildInfo{
			ID: r.BuildID, Status: r.Status, CreatedAt: r.CreatedAt, UpdatedAt: r.CreatedAt,
			FinishedAt: r.FinishedAt, CPUCount: r.CPUCount, MemoryMB: r.MemoryMB,
			EnvdVersion: envdapi.Version,
		}
		if !r.FinishedAt.IsZero() {
			b.UpdatedAt = r.FinishedAt
		}
		out = append(out, b)
	}
	slices.SortStableFunc(out, func(a, b e2b.TemplateBuildInfo) int { return b.CreatedAt.Compare(a.CreatedAt) })
	return out, nil
}

func (t Catalog) Tags(_ context.Context, ref string) ([]e2b.TemplateTagInfo, error) {
	if _, err := t.get(ref); err != nil && t.Served != nil {
		return nil, storeError(ref, err)
	}
	tags, err := t.Store.Tags(ref)
	if err != nil {
		return nil, storeError(ref, err)
	}
	out := make([]e2b.TemplateTagInfo, 0, len(tags))
	for _, tg := range tags {
		out = append(out, e2b.TemplateTagInfo{Tag: tg.Tag, BuildID: tg.BuildID, CreatedAt: tg.CreatedAt})
	}
	return out, nil
}

func (t Catalog) AssignTags(ctx context.Context, target string, tags []string) (string, error) {
	if t.Served != nil {
		return "", errReadOnly("tagging a template")
	}
	tpl, err := t.Store.AssignTags(ctx, target, tags)
	if err != nil {
		return "", storeError(target, err)
	}
	return tpl.BuildID, nil
}

func (t Catalog) RemoveTags(ctx context.Context, name string, tags []string) error {
	if t.Served != nil {
		return errReadOnly("removing a template's tags")
	}
	if err := t.Store.RemoveTags(ctx, name, tags); err != nil {
		return storeError(name, err)
	}
	return nil
}

func (t Catalog) Delete(ctx context.Context, ref string) error {
	if t.Served != nil {
		return errReadOnly("deleting a template")
	}
	tpl, err := t.Get(ctx, ref)
	if err != nil {
		return err
	}
	if t.Store.IsBuiltin(tpl.ID) {
		return fmt.Errorf("template %q is built in; remove it with `airlock template rm` on the server: %w", ref, e2b.ErrTemplateProtected)
	}
	err = t.Store.Remove(ctx, tpl.ID, func(tt template.Template) (int, error) { return t.InUse(ctx, tt.ID) })
	if errors.Is(err, template.ErrInUse) {
		return fmt.Errorf("%w: %w", e2b.ErrTemplateInUse, err)
	}
	if errors.Is(err, template.ErrNotFound) {
		return fmt.Errorf("%w: %w", e2b.ErrTemplateNotFound, err)
	}
	return err
}

// Info is a template as the E2B API describes it.
func Info(tpl template.Template) e2b.TemplateInfo {
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
		BuildID:     tpl.BuildID,
		CPUCount:    tpl.Settings.CPUCount,
		MemoryMB:    tpl.Settings.MemoryMB,
		DiskSizeMB:  tpl.Settings.DiskSizeMB,
		EnvdVersion: envdapi.Version,
		CreatedAt:   tpl.BuiltAt,
		UpdatedAt:   tpl.BuiltAt,
	}
}
