package template

import (
	"fmt"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/airlock-sandbox/airlock/templates"
)

func TestBuiltinBaseDefinition(t *testing.T) {
	defs, err := loadDefinitions(templates.FS)
	if err != nil {
		t.Fatal(err)
	}
	base := defs["base"]
	if base == nil {
		t.Fatalf("no base template among %v", defs)
	}
	db := base.From.Debootstrap
	if db == nil || db.Suite != "bookworm" || db.Variant != "minbase" {
		t.Fatalf("base must debootstrap bookworm minbase, got %+v", db)
	}
	for _, pkg := range []string{"bash", "coreutils", "procps", "python3", "nodejs", "git", "curl", "sudo", "ca-certificates"} {
		if !contains(db.Include, pkg) {
			t.Errorf("base does not include %s", pkg)
		}
	}
	want := Settings{CPUCount: 2, MemoryMB: 512, DiskSizeMB: 1024, DefaultUser: "user", DefaultWorkdir: ""}
	if base.Settings != want {
		t.Errorf("settings = %+v, want %+v", base.Settings, want)
	}
	if k := base.Key(); len(k) != 16 || k != base.Key() {
		t.Errorf("key %q is not a stable 16-hex-digit hash", k)
	}
}

func TestKeyCoversBuildInputsOnly(t *testing.T) {
	parse := func(s string) *Definition {
		t.Helper()
		d, err := ParseDefinition([]byte(s))
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	const tmpl = `{"name": %q, "description": %q,
	  "from": {"debootstrap": {"suite": "bookworm", "include": [%s]}},
	  "steps": [{"name": "s", "run": [%q]}],
	  "settings": {"cpuCount": %d, "memoryMB": 512, "diskSizeMB": 1024, "defaultUser": "user"}}`
	def := func(name, desc, include, run string, cpus int) *Definition {
		return parse(fmt.Sprintf(tmpl, name, desc, include, run, cpus))
	}
	a := def("a", "x", `"git"`, "true", 1)
	// Formatting, name, description and settings don't change the rootfs.
	same := []*Definition{
		parse(strings.ReplaceAll(fmt.Sprintf(tmpl, "a", "x", `"git"`, "true", 1), "\n", "\n\n   ")),
		def("b", "x", `"git"`, "true", 1),
		def("a", "other words", `"git"`, "true", 1),
		def("a", "x", `"git"`, "true", 4),
	}
	for i, d := range same {
		if d.Key() != a.Key() {
			t.Errorf("same[%d]: key changed to %s from %s", i, d.Key(), a.Key())
		}
	}
	// Packages and steps do.
	for i, d := range []*Definition{def("a", "x", `"git","curl"`, "true", 1), def("a", "x", `"git"`, "false", 1)} {
		if d.Key() == a.Key() {
			t.Errorf("different[%d]: key did not change", i)
		}
	}
}

func TestParseDefinitionRejects(t *testing.T) {
	good := `{"name": "ok", "from": {"debootstrap": {"suite": "bookworm"}}, "settings": {"cpuCount": 1, "memoryMB": 1, "diskSizeMB": 1, "defaultUser": "u"}}`
	if _, err := ParseDefinition([]byte(good)); err != nil {
		t.Fatalf("good definition rejected: %v", err)
	}
	for name, bad := range map[string]string{
		"unknown field": strings.Replace(good, `"name"`, `"nmae": "x", "name"`, 1),
		"bad name":      strings.Replace(good, `"ok"`, `"Not OK"`, 1),
		"no source":     strings.Replace(good, `"debootstrap": {"suite": "bookworm"}`, ``, 1),
		"bad package":   strings.Replace(good, `"suite": "bookworm"`, `"suite": "bookworm", "include": ["git; rm -rf /"]`, 1),
		"zero memory":   strings.Replace(good, `"memoryMB": 1`, `"memoryMB": 0`, 1),
		"empty step":    strings.Replace(good, `"settings"`, `"steps": [{"name": "x", "run": []}], "settings"`, 1),
		"trailing data": good + "{}",
	} {
		if _, err := ParseDefinition([]byte(bad)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestLoadDefinitionsNameMustMatchDirectory(t *testing.T) {
	fsys := fstest.MapFS{"other/template.json": {Data: []byte(
		`{"name": "base", "from": {"debootstrap": {"suite": "bookworm"}}, "settings": {"cpuCount": 1, "memoryMB": 1, "diskSizeMB": 1, "defaultUser": "u"}}`)}}
	if _, err := loadDefinitions(fsys); err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Fatalf("err = %v, want a name/directory mismatch", err)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestRuntimeSetting checks the per-template backend: a sandbox default, so it
// is parsed and validated but does not change the build key.
func TestRuntimeSetting(t *testing.T) {
	const tmpl = `{"name": "g", "from": {"debootstrap": {"suite": "bookworm"}},
	  "settings": {"cpuCount": 1, "memoryMB": 512, "diskSizeMB": 1024, "defaultUser": "user"%s}}`
	plain, err := ParseDefinition([]byte(fmt.Sprintf(tmpl, "")))
	if err != nil {
		t.Fatal(err)
	}
	gv, err := ParseDefinition([]byte(fmt.Sprintf(tmpl, `, "runtime": "gvisor"`)))
	if err != nil {
		t.Fatal(err)
	}
	if plain.Settings.Runtime != "" || gv.Settings.Runtime != "gvisor" {
		t.Fatalf("runtime = %q and %q, want empty and gvisor", plain.Settings.Runtime, gv.Settings.Runtime)
	}
	if plain.Key() != gv.Key() {
		t.Errorf("the runtime setting changed the build key")
	}
	if _, err := ParseDefinition([]byte(fmt.Sprintf(tmpl, `, "runtime": "../linux"`))); err == nil {
		t.Errorf("a malformed runtime name was accepted")
	}
}
