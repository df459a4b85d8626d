package nsfile

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/mountutil"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

func TestEnsureMakeRemove(t *testing.T) {
	testenv.NeedRoot(t)
	path := filepath.Join(t.TempDir(), "netns")
	t.Cleanup(func() { _ = Remove(path) })
	// A file left without a namespace (a crash between the two) is replaced.
	if err := os.WriteFile(path, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	if err := Ensure(path); err != nil {
		t.Fatalf("Ensure over a stale file: %v", err)
	}
	if m, err := mountutil.IsMountPoint(path); err != nil || !m {
		t.Fatalf("no namespace mounted at %s after Ensure (%v)", path, err)
	}
	var before, after os.FileInfo
	before, _ = os.Stat(path)
	if err := Ensure(path); err != nil {
		t.Fatalf("Ensure again: %v", err)
	}
	after, _ = os.Stat(path)
	if !os.SameFile(before, after) {
		t.Error("a second Ensure made another namespace")
	}
	if _, err := Make(path); err == nil {
		t.Error("Make over an existing namespace succeeded")
	}
	if err := Remove(path); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("%s still there after Remove: %v", path, err)
	}
	if err := Remove(path); err != nil {
		t.Errorf("Remove of nothing: %v", err)
	}
}
