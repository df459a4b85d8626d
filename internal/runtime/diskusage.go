package runtime

import (
	"io/fs"
	"path/filepath"
	"syscall"
)

// DiskUsage sums the allocated blocks under dir, as du does. Backends use it
// for Stats.WritableBytes (their upper dir); hard links inside it are rare
// enough that counting them twice is acceptable.
func DiskUsage(dir string) int64 {
	var total int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			total += st.Blocks * 512
		}
		return nil
	})
	return total
}
