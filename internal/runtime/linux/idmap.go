package linux

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/mountutil"
)

// IDMap shifts the sandbox's user and group ids onto an unprivileged host range:
// id n inside the sandbox is HostID+n on the host, for n < Size. Root in the
// sandbox is therefore HostID on the host, a uid that owns nothing there.
type IDMap struct {
	HostID uint32
	Size   uint32
}

// DefaultIDMap is the range used when Options leaves it unset: the first range
// Debian's useradd hands out as subordinate ids, so it does not collide with
// regular host users.
var DefaultIDMap = IDMap{HostID: 100000, Size: 65536}

// userNSHolderArg makes MaybeInit park the process until its stdin closes. The
// idmapped template mounts need a user namespace carrying the sandbox's id map;
// a Go program cannot unshare one in-process (it is multi-threaded), so it
// starts itself in a new one and holds it open just long enough.
const userNSHolderArg = "airlock-userns-holder"

func holdUserNS() {
	_, _ = io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

// idmapStore keeps one idmapped, read-only view of each template rootfs
// (per id map) under dir, shared by every sandbox of that template:
//
//	dir/<key>/          the idmapped mount of the template (overlay lowerdir)
//	dir/<key>.refs/<id> one empty file per sandbox that uses it
//	dir/lock            flock held while mounts or refs change
//
// Release policy: the mount is made by the first sandbox of a template and
// unmounted by the Destroy of the last one (its refs dir is then empty). The
// refs live on disk so that the policy survives restarts of the daemon and
// several Runtime values sharing one state dir. Running overlays never depend
// on the idmapped mount point: overlayfs keeps private clones of its layers,
// so releasing it early would only cost the ~1 ms of making it again.
type idmapStore struct {
	dir string
	m   IDMap

	// nsfd is a user namespace carrying m, made on first use and kept for the
	// life of the backend (an open nsfs fd keeps the namespace alive after
	// its holder process exits), so that re-making a view costs only the three
	// mount syscalls and not a process start.
	nsMu sync.Mutex
	nsfd int // 0 until made
}

func (s *idmapStore) lock() (func(), error) {
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return nil, fmt.Errorf("idmap dir: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(s.dir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("idmap lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("idmap lock: %w", err)
	}
	return func() { f.Close() }, nil
}

// key names the idmapped view of lower under this store's id map.
func (s *idmapStore) key(lower string) string {
	h := sha256.Sum256([]byte(fmt.Sprintf("%s\x00%d:%d", filepath.Clean(lower), s.m.HostID, s.m.Size)))
	return hex.EncodeToString(h[:8])
}

// acquire returns the idmapped view of lower, mounting it if no sandbox holds
// it yet, and records that sandbox id uses it.
func (s *idmapStore) acquire(lower, id string) (string, error) {
	unlock, err := s.lock()
	if err != nil {
		return "", err
	}
	defer unlock()
	k := s.key(lower)
	target, refs := filepath.Join(s.dir, k), filepath.Join(s.dir, k+".refs")
	mounted, err := mountutil.IsMountPoint(target)
	if err != nil {
		return "", fmt.Errorf("idmap view: %w", err)
	}
	if !mounted {
		if err := os.MkdirAll(target, 0o700); err != nil {
			return "", fmt.Errorf("idmap mount point: %w", err)
		}
		if err := s.mountIDMapped(lower, target); err != nil {
			return "", err
		}
	}
	if err := os.MkdirAll(refs, 0o700); err != nil {
		return "", fmt.Errorf("idmap refs: %w", err)
	}
	if err := os.WriteFile(filepath.Join(refs, id), nil, 0o600); err != nil {
		return "", fmt.Errorf("idmap ref: %w", err)
	}
	return target, nil
}

// release drops sandbox id's use of the view at target (as returned by
// acquire) and unmounts it when no sandbox uses it any more.
func (s *idmapStore) release(target, id string) error {
	if target == "" || filepath.Dir(target) != filepath.Clean(s.dir) {
		return nil
	}
	unlock, err := s.lock()
	if err != nil {
		return err
	}
	defer unlock()
	refs := target + ".refs"
	if id != "" {
		if err := os.Remove(filepath.Join(refs, id)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("idmap ref: %w", err)
		}
	}
	if held, err := anyEntry(refs); err == nil && held {
		return nil
	}
	if err := mountutil.Unmount(target); err != nil {
		return err
	}
	_ = os.Remove(refs)
	if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("idmap mount point: %w", err)
	}
	return nil
}

// prune drops the refs of sandboxes that have no container state (a Create
// that crashed before libcontainer wrote it) and releases views nobody holds.
// Refs younger than a minute are kept: their Create may still be running.
func (s *idmapStore) prune(stateRoot string) error {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("idmap dir: %w", err)
	}
	unlock, err := s.lock()
	if err != nil {
		return err
	}
	var idle []string
	for _, e := range entries {
		refs, ok := strings.CutSuffix(e.Name(), ".refs")
		if !ok || !e.IsDir() {
			continue
		}
		ids, _ := os.ReadDir(filepath.Join(s.dir, e.Name()))
		left := 0
		for _, id := range ids {
			info, err := id.Info()
			_, stateErr := os.Stat(filepath.Join(stateRoot, id.Name()))
			if err == nil && errors.Is(stateErr, os.ErrNotExist) && time.Since(info.ModTime()) > time.Minute {
				_ = os.Remove(filepath.Join(s.dir, e.Name(), id.Name()))
				continue
			}
			left++
		}
		if left == 0 {
			idle = append(idle, refs)
		}
	}
	unlock()
	var errs []error
	for _, k := range idle {
		// release with an id that holds no ref: unmounts if still unused.
		if err := s.release(filepath.Join(s.dir, k), ""); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// mountIDMapped makes target a read-only clone of lower whose files appear
// shifted by the id map: a file owned by host uid 0 in the template shows as
// HostID, i.e. as root to the sandbox.
func (s *idmapStore) mountIDMapped(lower, target string) error {
	return s.cloneIDMapped(lower, target, unix.MOUNT_ATTR_RDONLY)
}

// mountIDMappedRW is mountIDMapped, writable (a volume's staged source).
func (s *idmapStore) mountIDMappedRW(src, target string) error {
	return s.cloneIDMapped(src, target, 0)
}

func (s *idmapStore) cloneIDMapped(lower, target string, attrs uint64) error {
	nsfd, err := s.cachedUserNS()
	if err != nil {
		return err
	}
	tree, err := unix.OpenTree(unix.AT_FDCWD, lower, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("open_tree %s: %w", lower, err)
	}
	defer unix.Close(tree)
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP | attrs, Userns_fd: uint64(nsfd)}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		return fmt.Errorf("mount_setattr idmap %s: %w", lower, err)
	}
	if err := unix.MoveMount(tree, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("move_mount %s: %w", target, err)
	}
	return nil
}

// cachedUserNS returns the store's user namespace fd, making it if needed (a
// failure is retried by the next call).
func (s *idmapStore) cachedUserNS() (int, error) {
	s.nsMu.Lock()
	defer s.nsMu.Unlock()
	if s.nsfd > 0 {
		return s.nsfd, nil
	}
	fd, err := s.userNS()
	if err != nil {
		return -1, err
	}
	s.nsfd = fd
	return fd, nil
}

// userNS returns an fd of a user namespace with this store's id map, made by
// a short-lived child of ours started in it.
func (s *idmapStore) userNS() (int, error) {
	cmd := exec.Command("/proc/self/exe", userNSHolderArg)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return -1, fmt.Errorf("userns holder: %w", err)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(s.m.HostID), Size: int(s.m.Size)}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(s.m.HostID), Size: int(s.m.Size)}},
		Pdeathsig:   syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		return -1, fmt.Errorf("userns holder: %w", err)
	}
	// The mappings are written before the child execs, so the namespace is
	// complete as soon as Start returns.
	fd, err := unix.Open("/proc/"+strconv.Itoa(cmd.Process.Pid)+"/ns/user", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	stdin.Close()
	_ = cmd.Wait()
	if err != nil {
		return -1, fmt.Errorf("userns holder: %w", err)
	}
	return fd, nil
}

// anyEntry reports whether dir has an entry, reading one: os.ReadDir read
// and sorted every ref of the view, one per live sandbox, at every kill
// (under the store's lock, so kills queued behind it).
func anyEntry(dir string) (bool, error) {
	f, err := os.Open(dir)
	if err != nil {
		return false, err
	}
	defer f.Close()
	names, err := f.Readdirnames(1)
	if err != nil && !errors.Is(err, io.EOF) {
		return false, err
	}
	return len(names) > 0, nil
}
