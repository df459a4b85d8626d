package linux

import (
	"os"
	"path/filepath"
	"testing"
)

// TestAnyEntry: a view's refs dir is held while it has an entry; a missing
// dir is an error, not "empty".
func TestAnyEntry(t *testing.T) {
	dir := t.TempDir()
	if held, err := anyEntry(dir); err != nil || held {
		t.Fatalf("empty dir: %v, %v; want false, nil", held, err)
	}
	for i, name := range []string{"a", "b"} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if held, err := anyEntry(dir); err != nil || !held {
			t.Fatalf("dir with %d entries: %v, %v; want true, nil", i+1, held, err)
		}
	}
	if _, err := anyEntry(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("a missing dir reads as a dir")
	}
}
