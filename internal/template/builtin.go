package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"

	"github.com/airlock-sandbox/airlock/templates"
)

// builtin is a template defined in the repo (templates/<name>/): a Dockerfile, an
// airlock.toml and any files its COPY steps read. Built-ins go through the same
// builder as users' templates; only their names are reserved.
type builtin struct {
	name     string
	fsys     fs.FS // the template's directory
	settings Settings
	// digest covers every file of the definition and the builder version, so a
	// server rebuilds a built-in (from cache, mostly) only when either changed.
	digest string
}

func (b *builtin) hasAlias(a string) bool {
	for _, x := range b.settings.Aliases {
		if x == a {
			return true
		}
	}
	return false
}

// recordVersion changes when the builder derives a template's record
// differently from the same layers (its defaults, say): built-ins are then
// re-recorded, from the layer cache, without rebuilding any layer.
const recordVersion = 2

// loadBuiltins reads every <name>/Dockerfile of fsys (nil: the embedded built-ins).
func loadBuiltins(fsys fs.FS) (map[string]*builtin, error) {
	if fsys == nil {
		fsys = templates.FS
	}
	files, err := fs.Glob(fsys, "*/Dockerfile")
	if err != nil {
		return nil, fmt.Errorf("list built-in templates: %w", err)
	}
	out := map[string]*builtin{}
	aliases := map[string]string{}
	for _, f := range files {
		name := path.Dir(f)
		if err := ValidName(name); err != nil {
			return nil, fmt.Errorf("built-in %s: %w", f, err)
		}
		sub, err := fs.Sub(fsys, name)
		if err != nil {
			return nil, err
		}
		b := &builtin{name: name, fsys: sub}
		if data, err := fs.ReadFile(sub, SettingsFile); err == nil {
			if b.settings, err = ParseSettings(data); err != nil {
				return nil, fmt.Errorf("built-in %s: %w", name, err)
			}
		}
		if b.settings.Name != "" && b.settings.Name != name {
			return nil, fmt.Errorf("built-in %s: %s names it %q; the directory name is the template name", name, SettingsFile, b.settings.Name)
		}
		for _, a := range b.settings.Aliases {
			if other, ok := aliases[a]; ok {
				return nil, fmt.Errorf("built-in %s: alias %q is also %s's", name, a, other)
			}
			aliases[a] = name
		}
		if b.digest, err = digestFS(sub); err != nil {
			return nil, fmt.Errorf("built-in %s: %w", name, err)
		}
		out[name] = b
	}
	for a, owner := range aliases {
		if _, ok := out[a]; ok {
			return nil, fmt.Errorf("built-in %s: alias %q is a template name", owner, a)
		}
	}
	return out, nil
}

func digestFS(fsys fs.FS) (string, error) {
	var files []string
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	sort.Strings(files)
	h := sha256.New()
	fmt.Fprintf(h, "airlock-builtin/%d/%d\n", builderVersion, recordVersion)
	for _, f := range files {
		data, err := fs.ReadFile(fsys, f)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %d\n", f, len(data))
		h.Write(data)
	}
	return hex.EncodeToString(h.Sum(nil)[:12]), nil
}

// buildBuiltin builds a built-in with its own directory as the build context.
func (s *Store) buildBuiltin(ctx context.Context, b *builtin, progress io.Writer) (Template, error) {
	dockerfile, err := fs.ReadFile(b.fsys, "Dockerfile")
	if err != nil {
		return Template{}, err
	}
	// The context must be a real directory: COPY reads it through os.Root, which
	// is what keeps users' builds inside their context.
	ctxDir, err := os.MkdirTemp("", "airlock-builtin-"+b.name+"-")
	if err != nil {
		return Template{}, err
	}
	defer os.RemoveAll(ctxDir)
	if err := os.CopyFS(ctxDir, b.fsys); err != nil {
		return Template{}, fmt.Errorf("built-in %s: write its build context: %w", b.name, err)
	}
	return s.build(ctx, BuildRequest{
		Name:       b.name,
		Dockerfile: dockerfile,
		ContextDir: ctxDir,
		Settings:   b.settings,
		Replace:    true,
	}, buildOrigin{builtin: b}, progress)
}

// BuildBuiltin builds a built-in now, whether or not its current build is
// recorded (the layer cache makes an unchanged rebuild quick).
func (s *Store) BuildBuiltin(ctx context.Context, name string, progress io.Writer) (Template, error) {
	for n, b := range s.builtins {
		if n == name || b.hasAlias(name) {
			return s.buildBuiltin(ctx, b, progress)
		}
	}
	return Template{}, fmt.Errorf("%w: %q is not a built-in template (built-ins: %v)", ErrNotFound, name, s.Builtins())
}

// IsBuiltin reports whether name is a built-in's name or alias.
func (s *Store) IsBuiltin(name string) bool {
	if _, ok := s.builtins[name]; ok {
		return true
	}
	for _, b := range s.builtins {
		if b.hasAlias(name) {
			return true
		}
	}
	return false
}
