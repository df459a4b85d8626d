package daemon

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/layout"
)

// TestNetInstanceOf: the default data dir gets the plain names; any other gets
// its own table, interface prefix and range, stable across starts, and never
// the default's or the Go tests' prefixes.
func TestNetInstanceOf(t *testing.T) {
	if got := netInstanceOf(layout.DefaultRoot); got != (netInstance{table: "airlock", prefix: "alk", cidr: "10.77.0.0/16"}) {
		t.Fatalf("default: %+v", got)
	}
	seen := map[string]string{}
	for i := range 500 {
		dir := filepath.Join("/srv/airlock-test", string(rune('a'+i%26)), filepath.Base(t.TempDir()))
		a, b := netInstanceOf(dir), netInstanceOf(dir)
		if a != b {
			t.Fatalf("%s: %+v then %+v", dir, a, b)
		}
		if a.table == "airlock" || a.prefix == "alk" || a.prefix == "alt" || len(a.prefix) > 3 {
			t.Fatalf("%s: %+v collides with a reserved name", dir, a)
		}
		if !regexp.MustCompile(`^10\.(1[0-9][0-9])\.0\.0/16$`).MatchString(a.cidr) {
			t.Fatalf("%s: range %s", dir, a.cidr)
		}
		seen[a.table] = dir
	}
	if len(seen) < 100 {
		t.Fatalf("only %d distinct tables for 500 data dirs", len(seen))
	}
}

// TestStoredAPIKey: a key is made once, in the shape the Python SDK accepts,
// readable by root only, and the same key comes back on the next start.
func TestStoredAPIKey(t *testing.T) {
	dir := layout.DataDir{Root: t.TempDir()}
	k1, err := StoredAPIKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^e2b_[0-9a-f]{40}$`).MatchString(k1) {
		t.Fatalf("key %q", k1)
	}
	st, err := os.Stat(dir.APIKey())
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", st, err)
	}
	if k2, err := StoredAPIKey(dir); err != nil || k2 != k1 {
		t.Fatalf("second start: %q %v, want %q", k2, err, k1)
	}
}

func TestParseAPIKeys(t *testing.T) {
	keys, err := ParseAPIKeys(" a, b ,,c ")
	if err != nil || !slices.Equal(keys, []string{"a", "b", "c"}) {
		t.Fatalf("%q %v", keys, err)
	}
	if _, err := ParseAPIKeys(" , "); err == nil {
		t.Fatal("an empty list was accepted")
	}
}
