package sandbox

import (
	"os"
	"testing"
	"time"
)

// TestBootRecordReplacedWhole: a boot record written over another is the new
// one whole, with no temporary file left, and syncing it (as a pause does)
// finds it; a directory without one cannot be synced, so a pause of it stops
// before anything changed instead of leaving a paused sandbox nothing can
// boot.
func TestBootRecordReplacedWhole(t *testing.T) {
	dir := t.TempDir()
	if err := syncBootRecord(dir); err == nil {
		t.Fatal("syncBootRecord of a directory without a boot record succeeded")
	}
	for _, timeout := range []time.Duration{time.Minute, 2 * time.Hour} {
		if err := writeBootRecord(dir, bootRecord{Timeout: timeout, Envd: "e"}); err != nil {
			t.Fatal(err)
		}
		rec, err := readBootRecord(dir)
		if err != nil || rec.Timeout != timeout || rec.Envd != "e" {
			t.Fatalf("read back %+v, %v; want timeout %v", rec, err, timeout)
		}
	}
	if err := syncBootRecord(dir); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 1 || ents[0].Name() != bootRecordName {
		t.Errorf("directory holds %v, want only %s", ents, bootRecordName)
	}
}
