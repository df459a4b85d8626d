package runtime

import (
	"fmt"
	"os"
	"path/filepath"
)

// SyncImage flushes the files of a checkpoint image (a flat directory, as
// CRIU and runsc write them) and the directory itself to disk. Checkpointers
// write through the page cache; once the sandbox's processes are gone the
// image is all there is of them, so a Checkpoint returns only once it would
// survive a crash of the host, and a caller's "complete" mark written after
// it never names a torn image.
func SyncImage(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range append(entries, nil) {
		path := dir
		if e != nil {
			if !e.Type().IsRegular() && !e.IsDir() {
				continue
			}
			path = filepath.Join(dir, e.Name())
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		err = f.Sync()
		f.Close()
		if err != nil {
			return fmt.Errorf("sync %s: %w", path, err)
		}
	}
	return nil
}
