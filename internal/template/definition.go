package template

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"sort"
)

// builderVersion is part of every build key. Bump it when the builder starts producing
// a different rootfs from the same definition (new debootstrap flags, a different step
// runner), so existing caches are rebuilt instead of silently reused.
const builderVersion = 1

// Definition is the build recipe of one template. Built-ins are written as JSON
// (templates/<name>/template.json); a Dockerfile-subset front end will later produce the
// same structure, with From.Template naming the parent and Steps holding its RUN lines.
type Definition struct {
	Name        string   `json:"name"`
	Description string   `json:"description,omitempty"`
	From        From     `json:"from"`
	Steps       []Step   `json:"steps,omitempty"`
	Settings    Settings `json:"settings"`
}

// From says where a template's first layer comes from. Exactly one field is set.
type From struct {
	Debootstrap *Debootstrap `json:"debootstrap,omitempty"`
}

// Debootstrap builds a Debian root filesystem from a mirror.
type Debootstrap struct {
	Suite   string   `json:"suite"`
	Variant string   `json:"variant,omitempty"`
	Include []string `json:"include,omitempty"`
}

// Step is one shell script run inside the rootfs being built. Lines run in order under
// `sh -e`, so the first failing line fails the build.
type Step struct {
	Name string   `json:"name"`
	Run  []string `json:"run"`
}

// Settings are the defaults a sandbox created from the template gets. They are not part
// of the build key: changing a default must not force a rebuild of the rootfs.
type Settings struct {
	CPUCount    int    `json:"cpuCount"`
	MemoryMB    int    `json:"memoryMB"`
	DiskSizeMB  int    `json:"diskSizeMB"`
	DefaultUser string `json:"defaultUser"`
	// DefaultWorkdir empty means the default user's home directory.
	DefaultWorkdir string `json:"defaultWorkdir"`
	// Runtime is the isolation backend sandboxes of this template run on
	// ("linux", "gvisor"); empty means the server's default (serve --runtime).
	Runtime string `json:"runtime,omitempty"`
}

var (
	validName    = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)
	validPackage = regexp.MustCompile(`^[a-z0-9][a-z0-9.+-]+$`)
	validSuite   = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]*$`)
	validRuntime = regexp.MustCompile(`^[a-z0-9]+$`)
)

// ParseDefinition decodes and validates one definition. Unknown fields are rejected:
// a typo in a recipe should fail loudly rather than build something else.
func ParseDefinition(data []byte) (*Definition, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var d Definition
	if err := dec.Decode(&d); err != nil {
		return nil, fmt.Errorf("decode template definition: %w", err)
	}
	if dec.More() {
		return nil, errors.New("decode template definition: trailing data after the JSON object")
	}
	if err := d.validate(); err != nil {
		return nil, err
	}
	return &d, nil
}

func (d *Definition) validate() error {
	if !validName.MatchString(d.Name) {
		return fmt.Errorf("template name %q: want lower-case letters, digits, '.', '_' or '-'", d.Name)
	}
	db := d.From.Debootstrap
	if db == nil {
		return fmt.Errorf("template %s: from.debootstrap is required (the only source so far)", d.Name)
	}
	if !validSuite.MatchString(db.Suite) {
		return fmt.Errorf("template %s: bad debootstrap suite %q", d.Name, db.Suite)
	}
	if db.Variant != "" && !validSuite.MatchString(db.Variant) {
		return fmt.Errorf("template %s: bad debootstrap variant %q", d.Name, db.Variant)
	}
	for _, p := range db.Include {
		if !validPackage.MatchString(p) {
			return fmt.Errorf("template %s: bad package name %q", d.Name, p)
		}
	}
	for i, s := range d.Steps {
		if s.Name == "" || len(s.Run) == 0 {
			return fmt.Errorf("template %s: step %d needs a name and at least one run line", d.Name, i+1)
		}
	}
	st := d.Settings
	if st.CPUCount < 1 || st.MemoryMB < 1 || st.DiskSizeMB < 1 {
		return fmt.Errorf("template %s: cpuCount, memoryMB and diskSizeMB must be positive", d.Name)
	}
	if st.DefaultUser == "" {
		return fmt.Errorf("template %s: defaultUser is required", d.Name)
	}
	if st.Runtime != "" && !validRuntime.MatchString(st.Runtime) {
		return fmt.Errorf("template %s: bad runtime name %q", d.Name, st.Runtime)
	}
	return nil
}

// Key identifies the rootfs this definition builds to: a hash of everything that changes
// the bytes on disk (builder version, source, steps) and nothing that doesn't (name,
// description, settings).
func (d *Definition) Key() string {
	// json.Marshal of a struct is deterministic (field order, no maps), so the hash is
	// stable across runs and independent of the source file's formatting.
	b, err := json.Marshal(struct {
		Builder int    `json:"builder"`
		From    From   `json:"from"`
		Steps   []Step `json:"steps"`
	}{builderVersion, d.From, d.Steps})
	if err != nil {
		panic(fmt.Sprintf("template: marshal definition: %v", err)) // only plain types inside
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// loadDefinitions reads every <name>/template.json in fsys. The directory name must match
// the definition's name so the file a user edits is the one that builds.
func loadDefinitions(fsys fs.FS) (map[string]*Definition, error) {
	files, err := fs.Glob(fsys, "*/template.json")
	if err != nil {
		return nil, fmt.Errorf("list template definitions: %w", err)
	}
	sort.Strings(files)
	defs := make(map[string]*Definition, len(files))
	for _, f := range files {
		data, err := fs.ReadFile(fsys, f)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", f, err)
		}
		d, err := ParseDefinition(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		if dir := path.Dir(f); dir != d.Name {
			return nil, fmt.Errorf("%s: name %q does not match its directory %q", f, d.Name, dir)
		}
		defs[d.Name] = d
	}
	return defs, nil
}
