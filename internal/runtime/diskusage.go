package runtime

import (
	"io/fs"
	"path/filepath"
	"syscall"
)

// DiskUsage sums the allocated blocks under dir, as du -x does. Backends use
// it for Stats.WritableBytes (their upper dir), the manager for what a paused
// sandbox holds on disk; hard links inside it are rare enough that counting
// them twice is acceptable. It does not descend into another filesystem
// mounted below dir: gVisor's root overlay is mounted inside the sandbox's
// directory until the runtime lets the sandbox go (after a pause measures it,
// for good when it is frozen in place), and counting it would count the
// template it shows.
func DiskUsage(dir string) int64 {
	var total int64
	var rootDev uint64
	haveRoot := false
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok {
			return nil
		}
		if !haveRoot {
			rootDev, haveRoot = uint64(st.Dev), true
		} else if d.IsDir() && uint64(st.Dev) != rootDev {
			return filepath.SkipDir
		}
		total += st.Blocks * 512
		return nil
	})
	return total
}
