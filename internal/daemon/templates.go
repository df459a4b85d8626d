package daemon

import (
	"context"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/airlock-sandbox/airlock/internal/layout"
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
		Finished: d.Metrics.BuildFinished,
		MaxFor:   func(owner string) int { return d.Keys.Quotas(owner).Builds },
	})
	if err != nil {
		return err
	}
	d.Builds = b
	d.push("template builds", b.Close)
	return nil
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
