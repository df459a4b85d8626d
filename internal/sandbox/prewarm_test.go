package sandbox

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// TestPrewarmFindsTheLoginShell: on the base template's rootfs, the warm-up
// finds bash's loader and libraries and the default user's home, and looks
// without changing anything.
func TestPrewarmFindsTheLoginShell(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(testenv.DataDir(), "templates", "base", "template.json"))
	if err != nil {
		testenv.Missing(t, "the base template in %s: %v", testenv.DataDir(), err)
	}
	var rec struct {
		Key string `json:"key"`
	}
	if err := json.Unmarshal(data, &rec); err != nil || rec.Key == "" {
		t.Fatalf("base template record: %v", err)
	}
	root := filepath.Join(testenv.DataDir(), "layers", rec.Key, "rootfs")
	libs := sharedLibs(root, "bin/bash")
	has := func(name string) bool {
		return slices.ContainsFunc(libs, func(l string) bool { return strings.HasPrefix(filepath.Base(l), name) })
	}
	if !has("ld-linux") || !has("libc.so") || !has("libtinfo.so") {
		t.Errorf("bash's loader and libraries: %v", libs)
	}
	for _, l := range libs {
		if _, err := os.Stat(filepath.Join(root, l)); err != nil {
			t.Errorf("%s: %v", l, err)
		}
	}
	if h := homeOf(root, "user"); h != "/home/user" {
		t.Errorf("home of user: %q", h)
	}
	if h := homeOf(root, ""); h != "/root" {
		t.Errorf("home of the default user root: %q", h)
	}
	if h := homeOf(root, "nobody-here"); h != "" {
		t.Errorf("home of an unknown user: %q", h)
	}
	before, err := os.ReadDir(filepath.Join(root, "home/user"))
	if err != nil {
		t.Fatal(err)
	}
	prewarmLoginShell(root, "/home/user")
	after, err := os.ReadDir(filepath.Join(root, "home/user"))
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) {
		t.Errorf("the warm-up changed the home directory: %v -> %v", before, after)
	}
	if got := sharedLibs(t.TempDir(), "bin/bash"); got != nil {
		t.Errorf("a rootfs without bash: %v", got)
	}
}
