package unixuser

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestLookPath: the PATH of the process's environment wins over the
// fallback, relative entries are relative to the process's directory, a
// non-executable file is skipped, and a miss is ErrNotInPath.
func TestLookPath(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, mode := range map[string]os.FileMode{"tool": 0o755, "data": 0o644} {
		if err := os.WriteFile(filepath.Join(bin, name), nil, mode); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range []struct {
		file     string
		env      []string
		dir      string
		fallback string
		want     string
	}{
		{"tool", []string{"PATH=/nonexistent:" + bin}, "/", "", filepath.Join(bin, "tool")},
		{"tool", nil, "/", bin, filepath.Join(bin, "tool")},
		{"tool", []string{"PATH=bin"}, dir, "", filepath.Join(bin, "tool")},
		{"/abs/x", nil, "/", "", "/abs/x"},
	} {
		if got, err := LookPath(tt.file, tt.env, tt.dir, tt.fallback); err != nil || got != tt.want {
			t.Errorf("LookPath(%q, %q, %q, %q) = %q, %v; want %q", tt.file, tt.env, tt.dir, tt.fallback, got, err, tt.want)
		}
	}
	for _, file := range []string{"data", "missing"} {
		if _, err := LookPath(file, []string{"PATH=" + bin}, "/", bin); !errors.Is(err, ErrNotInPath) {
			t.Errorf("LookPath(%q): %v, want ErrNotInPath", file, err)
		}
	}
}
