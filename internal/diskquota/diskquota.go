// Package diskquota gives every sandbox a writable layer with a hard size
// limit (E2B's diskSizeMB).
//
// Why btrfs: per-directory limits need a filesystem with per-directory quotas.
// ext4 project quotas need CONFIG_QFMT_V2 and XFS quotas CONFIG_XFS_QUOTA; the
// kernel of our machine kind has neither (an ext4 image made with
// "-O quota,project" does not even mount). btrfs is built in and its qgroups
// limit a subvolume. They have a second advantage: ext4 and XFS let a writer
// with CAP_SYS_RESOURCE exceed quota hard limits, and overlayfs writes to its
// upper layer with the credentials of whoever mounted it (the server, full
// root), so a project quota would not hold for overlay writes. btrfs qgroup
// limits have no such exemption.
//
// Layout: one sparse file (the image) holds a btrfs filesystem, mounted on
// the sandboxes directory through a loop device. Each sandbox directory is a
// subvolume whose level-0 qgroup carries the limit on referenced bytes. The
// limit and the subvolume are on disk, so both survive a restart of the
// server; Open only re-mounts the image when nothing is mounted there yet.
//
// Snapshots: a sandbox's subvolume can be snapshotted (Snapshot) into the
// snapshot store, SnapshotsDir inside the mount point, and a snapshot into a
// new sandbox directory: copy-on-write, so neither copies the bytes the
// sandbox wrote, and each snapshot is a subvolume with its own limit. The
// store is inside the mount because a snapshot must be on its source's
// filesystem; its name starts with a dot because sandbox ids never do, so
// sweeps of the sandboxes directory can tell it apart (Reserved). Without a
// pool, Clone copies instead (reflinks where the filesystem can).
//
// Volumes: the volume store, VolumesDir beside the snapshot store, holds one
// quota-limited subvolume per volume (CreateVolume), for internal/volume.
//
// btrfs has no ioctls in golang.org/x/sys/unix, and the Go btrfs libraries
// either need cgo and libbtrfs headers (containerd/btrfs) or lack qgroups, so
// the handful of ioctls used here are issued directly (see ioctl.go).
package diskquota

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/airlock-sandbox/airlock/internal/mountutil"
	"golang.org/x/sys/unix"
)

// DefaultImageSize caps the default size of the image; the image is sparse,
// so this is a ceiling, not an allocation.
const DefaultImageSize = 64 << 30

// Pool is a mounted quota filesystem holding sandbox directories.
type Pool struct {
	image, mountPoint string
	// sysfs is /sys/fs/btrfs/<fsid>, where the kernel publishes qgroup usage.
	sysfs string

	mu sync.Mutex
	// ids caches the subvolume id of each directory of the pool by its path
	// relative to the mount point ("<id>" or ".snapshots/<name>", see key),
	// so that kill does not have to look at every other sandbox.
	ids map[string]uint64
	// pending holds qgroups of deleted subvolumes not removed yet: the kernel
	// drops a subvolume in the background and refuses (EBUSY) to remove its
	// qgroup until then, so each Remove retries them.
	pending map[uint64]bool
}

// Open mounts the image at mountPoint, creating and formatting the image
// first when it does not exist (size bytes, sparse; size <= 0 picks
// min(free space of the image's filesystem, DefaultImageSize)). If a btrfs
// filesystem is already mounted at mountPoint (a restarted server), it is
// adopted as is.
func Open(image, mountPoint string, size int64) (*Pool, error) {
	// Absolute, so that key can relate any directory to it.
	mountPoint, err := filepath.Abs(mountPoint)
	if err != nil {
		return nil, fmt.Errorf("diskquota: %w", err)
	}
	if err := os.MkdirAll(mountPoint, 0o755); err != nil {
		return nil, fmt.Errorf("diskquota: %w", err)
	}
	fstype, err := mountedType(mountPoint)
	if err != nil {
		return nil, err
	}
	switch fstype {
	case "btrfs":
	case "":
		// Mounting over sandboxes a server without quotas left running would
		// hide them (and their mounts) for good: refuse, and say what to do.
		if entries, err := os.ReadDir(mountPoint); err == nil && len(entries) > 0 {
			return nil, fmt.Errorf("diskquota: %s already holds %d entries (sandboxes of a server run without disk quotas); kill them first (serve --disk-quota=false, then kill or --kill-on-exit) or move them away", mountPoint, len(entries))
		}
		if err := createImage(image, size); err != nil {
			return nil, err
		}
		if err := mountImage(image, mountPoint); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("diskquota: %s is already a %s mount, not btrfs", mountPoint, fstype)
	}
	p := &Pool{image: image, mountPoint: mountPoint, ids: map[string]uint64{}, pending: map[uint64]bool{}}
	if err := p.init(); err != nil {
		return nil, err
	}
	return p, nil
}

// MountPoint is where sandbox directories live.
func (p *Pool) MountPoint() string { return p.mountPoint }

func (p *Pool) init() error {
	fd, err := unix.Open(p.mountPoint, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("diskquota: open %s: %w", p.mountPoint, err)
	}
	defer unix.Close(fd)
	fsid, err := fsID(fd)
	if err != nil {
		return err
	}
	p.sysfs = filepath.Join("/sys/fs/btrfs", fsid)
	// Enabling quotas on a filesystem that has them is a no-op, but it starts
	// a rescan; skip it when the kernel says they are on.
	if _, err := os.Stat(filepath.Join(p.sysfs, "qgroups")); err != nil {
		if err := quotaEnable(fd); err != nil {
			return err
		}
	}
	p.sweep()
	p.rescanIfInconsistent(fd)
	return nil
}

// createImage makes a sparse file and formats it. Single (not DUP) metadata:
// both copies would land in the same file.
func createImage(image string, size int64) error {
	if _, err := os.Stat(image); err == nil {
		return nil
	}
	if size <= 0 {
		var st unix.Statfs_t
		if err := unix.Statfs(filepath.Dir(image), &st); err != nil {
			return fmt.Errorf("diskquota: statfs %s: %w", filepath.Dir(image), err)
		}
		size = min(int64(st.Bavail)*st.Bsize, DefaultImageSize)
	}
	const minSize = 256 << 20 // mkfs.btrfs refuses much smaller single-profile filesystems
	if size < minSize {
		return fmt.Errorf("diskquota: image size %d is below %d bytes", size, minSize)
	}
	tmp := image + ".new"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("diskquota: create image: %w", err)
	}
	err = f.Truncate(size)
	f.Close()
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("diskquota: size image: %w", err)
	}
	// No Go library formats btrfs; mkfs.btrfs (btrfs-progs) runs once per host.
	out, err := exec.Command("mkfs.btrfs", "-q", "-f", "-m", "single", "-d", "single", tmp).CombinedOutput()
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("diskquota: mkfs.btrfs (install btrfs-progs): %w: %s", err, strings.TrimSpace(string(out)))
	}
	if err := os.Rename(tmp, image); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("diskquota: %w", err)
	}
	return nil
}

// mountImage attaches the image to a free loop device and mounts it. The loop
// device is autoclear: it detaches when the filesystem is unmounted.
func mountImage(image, mountPoint string) error {
	f, err := os.OpenFile(image, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("diskquota: open image: %w", err)
	}
	defer f.Close()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("diskquota: %w", err)
	}
	defer ctl.Close()
	// Another process can take the free device between GET_FREE and
	// CONFIGURE (EBUSY); ask again then.
	for attempt := 0; ; attempt++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return fmt.Errorf("diskquota: get free loop device: %w", err)
		}
		dev := fmt.Sprintf("/dev/loop%d", n)
		lf, err := os.OpenFile(dev, os.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("diskquota: %w", err)
		}
		cfg := unix.LoopConfig{Fd: uint32(f.Fd())}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		copy(cfg.Info.File_name[:], image)
		err = unix.IoctlLoopConfigure(int(lf.Fd()), &cfg)
		if errors.Is(err, unix.EBUSY) && attempt < 10 {
			lf.Close()
			continue
		}
		if err != nil {
			lf.Close()
			return fmt.Errorf("diskquota: configure %s: %w", dev, err)
		}
		// discard=async returns the space of deleted files to the host (the
		// loop device punches holes in the image). commit=5 publishes qgroup
		// usage at the pace of the metrics sampler.
		err = unix.Mount(dev, mountPoint, "btrfs", unix.MS_NOATIME, "discard=async,commit=5")
		// Until mounted, our open fd keeps the device; after, the mount does.
		lf.Close()
		if errors.Is(err, unix.EIO) || errors.Is(err, unix.EUCLEAN) {
			// Seen after the machine stopped without the image's writes
			// reaching its disk: btrfs finds its trees inconsistent.
			return fmt.Errorf("diskquota: mount %s on %s: %w: the filesystem in %s is damaged (the kernel log says how); "+
				"moving the image aside starts an empty one, without the sandboxes that were on it", dev, mountPoint, err, image)
		}
		if err != nil {
			return fmt.Errorf("diskquota: mount %s on %s: %w", dev, mountPoint, err)
		}
		return nil
	}
}

// mountedType returns the filesystem type mounted exactly at dir, or "".
func mountedType(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("diskquota: %w", err)
	}
	if r, err := filepath.EvalSymlinks(abs); err == nil {
		abs = r
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", fmt.Errorf("diskquota: %w", err)
	}
	defer f.Close()
	fstype := ""
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root mountpoint opts [optional...] - fstype source superopts
		fields := strings.Fields(sc.Text())
		if len(fields) < 7 || mountutil.Unescape(fields[4]) != abs {
			continue
		}
		for i := 6; i < len(fields)-1; i++ {
			if fields[i] == "-" {
				fstype = fields[i+1] // the last mount on top wins
				break
			}
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("diskquota: mountinfo: %w", err)
	}
	return fstype, nil
}

// Create makes dir (a direct child of the mount point) a subvolume limited to
// limit bytes.
func (p *Pool) Create(dir string, limit int64) error {
	if filepath.Dir(filepath.Clean(dir)) != filepath.Clean(p.mountPoint) {
		return fmt.Errorf("diskquota: %s is not directly under %s", dir, p.mountPoint)
	}
	parent, err := unix.Open(p.mountPoint, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("diskquota: %w", err)
	}
	defer unix.Close(parent)
	if err := subvolCreate(parent, filepath.Base(dir)); err != nil {
		return fmt.Errorf("diskquota: create subvolume %s: %w", dir, err)
	}
	id, err := subvolID(dir)
	if err != nil {
		_ = p.Remove(dir)
		return err
	}
	p.mu.Lock()
	p.ids[filepath.Base(dir)] = id // key of a direct child
	p.mu.Unlock()
	if err := p.SetLimit(dir, limit); err != nil {
		_ = p.Remove(dir)
		return err
	}
	return nil
}

// SetLimit changes the limit of a sandbox directory (a warm sandbox gets the
// size its claimer asked for). A limit <= 0 lifts it: the kernel would read 0
// as a limit of zero bytes.
func (p *Pool) SetLimit(dir string, limit int64) error {
	id, err := p.id(dir)
	if err != nil {
		return err
	}
	if err := p.setLimit(id, limit); err != nil {
		return fmt.Errorf("diskquota: limit %s to %d bytes: %w", dir, limit, err)
	}
	return nil
}

// setLimit issues the limit ioctl on the mount point, not on the subvolume:
// the ioctl's transaction reserves space in the qgroup of the subvolume its fd
// is on, so on a subvolume over its limit (one lowered below its usage) it
// would fail with EDQUOT, and the limit could never be raised again. The
// top-level subvolume has no limit.
func (p *Pool) setLimit(id uint64, limit int64) error {
	fd, err := unix.Open(p.mountPoint, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return qgroupLimit(fd, id, limit)
}

// Usage returns the bytes a sandbox directory references and its limit, as
// the kernel last accounted them (at most one commit interval old). It reads
// two small sysfs files: no walk of the directory.
func (p *Pool) Usage(dir string) (used, limit int64, err error) {
	id, err := p.id(dir)
	if err != nil {
		return 0, 0, err
	}
	q := filepath.Join(p.sysfs, "qgroups", "0_"+strconv.FormatUint(id, 10))
	used, err = readInt(filepath.Join(q, "referenced"))
	if err != nil {
		return 0, 0, err
	}
	limit, err = readInt(filepath.Join(q, "max_referenced"))
	return used, limit, err
}

func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("diskquota: %w", err)
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("diskquota: %s: %w", path, err)
	}
	return v, nil
}

// key names a directory of the pool in ids: its path relative to the mount
// point. Subvolumes live only directly under the mount point (sandboxes,
// temporaries) and directly under the snapshot and volume stores, the places
// sweep looks, so any other path is refused.
func (p *Pool) key(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("diskquota: %w", err)
	}
	rel, err := filepath.Rel(p.mountPoint, abs)
	if err == nil {
		parent, name := filepath.Split(rel)
		parent = strings.TrimSuffix(parent, "/")
		ok := name != "" && name != "." && name != ".." &&
			(parent == "" && !isStore(name) || isStore(parent))
		if ok {
			return rel, nil
		}
	}
	return "", fmt.Errorf("diskquota: %s is neither directly under %s nor under its %s or %s", dir, p.mountPoint, SnapshotsDir, VolumesDir)
}

// id returns the subvolume id of a directory of the pool.
func (p *Pool) id(dir string) (uint64, error) {
	k, err := p.key(dir)
	if err != nil {
		return 0, err
	}
	p.mu.Lock()
	id, ok := p.ids[k]
	p.mu.Unlock()
	if ok {
		return id, nil
	}
	return subvolID(dir)
}

// Remove deletes a sandbox directory's or snapshot's subvolume (if the
// runtime has not removed it already) and its qgroup. Whatever is inside goes
// with it, so the caller unmounts first.
func (p *Pool) Remove(dir string) error {
	k, err := p.key(dir)
	if err != nil {
		return err
	}
	name := filepath.Base(dir)
	p.mu.Lock()
	id, known := p.ids[k]
	delete(p.ids, k)
	p.mu.Unlock()
	var errs []error
	if _, err := os.Lstat(dir); err == nil {
		if !known {
			id, known = 0, false
			if v, err := subvolID(dir); err == nil {
				id, known = v, true
			}
		}
		parent, err := unix.Open(filepath.Dir(dir), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("diskquota: %w", err)
		}
		err = subvolDestroy(parent, name)
		unix.Close(parent)
		if err != nil && !errors.Is(err, unix.ENOENT) {
			// Not a subvolume (a directory made before quotas were on).
			if rerr := os.RemoveAll(dir); rerr != nil {
				errs = append(errs, fmt.Errorf("diskquota: remove %s: %w", dir, rerr))
			}
		}
	}
	p.mu.Lock()
	if known {
		p.pending[id] = true
	}
	p.mu.Unlock()
	p.removePending()
	return errors.Join(errs...)
}

// removePending removes the qgroups of deleted subvolumes that the kernel
// has finished dropping.
func (p *Pool) removePending() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.pending) == 0 {
		return
	}
	fd, err := unix.Open(p.mountPoint, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	dropped := false
	for id := range p.pending {
		if err := qgroupRemove(fd, id); err == nil || errors.Is(err, unix.ENOENT) {
			delete(p.pending, id)
			dropped = true
		}
	}
	if dropped {
		p.rescanIfInconsistent(fd)
	}
}

// rescanIfInconsistent recounts the qgroups when the kernel gave up counting
// them, which it may do when it drops a subvolume sharing a tall subtree with
// another (a sandbox and its snapshot or fork: past drop_subtree_threshold
// levels, tracing the subtree would stall commits): the numbers, and so the
// limits, would stay wrong until a rescan. The rescan runs in the background;
// fd is any file of the filesystem.
func (p *Pool) rescanIfInconsistent(fd int) {
	if v, err := readInt(filepath.Join(p.sysfs, "qgroups", "inconsistent")); err != nil || v == 0 {
		return
	}
	_ = quotaRescan(fd) // EINPROGRESS: one is running already
}

// sweep, at Open, removes the temporaries a crash left half made (a snapshot
// or copy not yet renamed into place), learns the subvolume of every sandbox
// directory and snapshot, and queues the qgroups whose subvolume is gone
// (left by an earlier server).
func (p *Pool) sweep() {
	live, temps, err := p.subvolIDs()
	if err != nil {
		return
	}
	for _, t := range temps {
		_ = p.Remove(t)
	}
	entries, err := os.ReadDir(filepath.Join(p.sysfs, "qgroups"))
	if err != nil {
		return
	}
	p.mu.Lock()
	for name, id := range live {
		p.ids[name] = id
	}
	seen := map[uint64]bool{}
	for _, id := range live {
		seen[id] = true
	}
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), "0_")
		if !ok {
			continue
		}
		id, err := strconv.ParseUint(rest, 10, 64)
		if err != nil || id == 5 || seen[id] { // 5 is the top-level subvolume
			continue
		}
		p.pending[id] = true
	}
	p.mu.Unlock()
	p.removePending()
}

// subvolIDs returns the ids of the subvolumes, by key, directly under the
// mount point and the snapshot and volume stores (the only places the pool
// makes them), and the paths of the temporaries there.
func (p *Pool) subvolIDs() (ids map[string]uint64, temps []string, err error) {
	ids = map[string]uint64{}
	for _, sub := range []string{"", SnapshotsDir, VolumesDir} {
		entries, err := os.ReadDir(filepath.Join(p.mountPoint, sub))
		if errors.Is(err, os.ErrNotExist) && sub != "" {
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("diskquota: %w", err)
		}
		for _, e := range entries {
			if !e.IsDir() || sub == "" && isStore(e.Name()) {
				continue
			}
			path := filepath.Join(p.mountPoint, sub, e.Name())
			if isTemp(e.Name()) {
				temps = append(temps, path)
				continue
			}
			if id, err := subvolID(path); err == nil {
				ids[filepath.Join(sub, e.Name())] = id
			}
		}
	}
	return ids, temps, nil
}

// IsSubvolume reports whether dir is the root of a subvolume (a directory
// the pool created).
func IsSubvolume(dir string) bool {
	var st unix.Stat_t
	return unix.Stat(dir, &st) == nil && st.Ino == firstFreeObjectID
}

// Close unmounts the filesystem (the loop device detaches itself). A server
// keeps it mounted across restarts; tests call this with removeImage=true.
func (p *Pool) Close(removeImage bool) error {
	if err := unix.Unmount(p.mountPoint, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("diskquota: unmount %s: %w", p.mountPoint, err)
	}
	if removeImage {
		if err := os.Remove(p.image); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("diskquota: %w", err)
		}
	}
	return nil
}

// Device returns the major and minor numbers of the block device (the loop
// device) under the pool, which is what the blkio cgroup throttles sandbox
// I/O on: a sandbox's reads and writes reach the image through it.
func (p *Pool) Device() (major, minor uint32, err error) {
	dir := filepath.Join(p.sysfs, "devices")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, 0, fmt.Errorf("diskquota: pool devices: %w", err)
	}
	// One entry: the image is a single-device filesystem (createImage).
	if len(entries) != 1 {
		return 0, 0, fmt.Errorf("diskquota: pool has %d devices in %s, want 1", len(entries), dir)
	}
	b, err := os.ReadFile(filepath.Join(dir, entries[0].Name(), "dev"))
	if err != nil {
		return 0, 0, fmt.Errorf("diskquota: pool device: %w", err)
	}
	if _, err := fmt.Sscanf(strings.TrimSpace(string(b)), "%d:%d", &major, &minor); err != nil {
		return 0, 0, fmt.Errorf("diskquota: pool device %q: %w", b, err)
	}
	return major, minor, nil
}
