package diskquota

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// openTestPool mounts a fresh 512 MiB image under a temp dir and unmounts
// and deletes it when the test ends.
func openTestPool(t testing.TB) *Pool { return openTestPoolSize(t, 512<<20) }

func openTestPoolSize(t testing.TB, size int64) *Pool {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	tmp := t.TempDir()
	p, err := Open(filepath.Join(tmp, "img"), filepath.Join(tmp, "mnt"), size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(true); err != nil {
			t.Error(err)
			// Something still holds the mount (a file a failed test left
			// open): detach it lazily so the autoclear loop device goes
			// when the holder does, not never.
			_ = unix.Unmount(p.mountPoint, unix.MNT_DETACH)
			_ = os.Remove(p.image)
		}
	})
	return p
}

// fill writes 1 MiB chunks to path until the write fails or max bytes.
func fill(path string, max int64) (int64, error) {
	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	buf := bytes.Repeat([]byte{1}, 1<<20)
	var n int64
	for n < max {
		w, err := f.Write(buf)
		n += int64(w)
		if err != nil {
			return n, err
		}
		if err := f.Sync(); err != nil {
			return n, err
		}
	}
	return n, nil
}

func TestLimitHoldsAndIsReleased(t *testing.T) {
	p := openTestPool(t)
	dir := filepath.Join(p.MountPoint(), "sb1")
	if err := p.Create(dir, 32<<20); err != nil {
		t.Fatal(err)
	}
	n, err := fill(filepath.Join(dir, "big"), 128<<20)
	if !errors.Is(err, unix.EDQUOT) && !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("wrote %d bytes past a 32 MiB limit; err %v", n, err)
	}
	if n > 40<<20 {
		t.Errorf("wrote %d MiB under a 32 MiB limit", n>>20)
	}
	unix.Sync()
	used, limit, err := p.Usage(dir)
	if err != nil {
		t.Fatal(err)
	}
	if limit != 32<<20 || used < 16<<20 || used > 40<<20 {
		t.Errorf("usage %d / limit %d", used, limit)
	}
	// Room again after deleting, and a new limit applies at once.
	if err := os.Remove(filepath.Join(dir, "big")); err != nil {
		t.Fatal(err)
	}
	unix.Sync()
	if _, err := fill(filepath.Join(dir, "small"), 8<<20); err != nil {
		t.Fatalf("write after delete: %v", err)
	}
	if err := p.SetLimit(dir, 64<<20); err != nil {
		t.Fatal(err)
	}
	if _, limit, _ := p.Usage(dir); limit != 64<<20 {
		t.Errorf("limit after SetLimit = %d", limit)
	}
	id := p.ids["sb1"]
	if err := p.Remove(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("dir survived Remove: %v", err)
	}
	// The qgroup goes once the kernel has dropped the subvolume.
	qdir := filepath.Join(p.sysfs, "qgroups", "0_"+strconv.FormatUint(id, 10))
	deadline := time.Now().Add(30 * time.Second)
	for {
		p.removePending()
		if _, err := os.Stat(qdir); errors.Is(err, os.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("qgroup %s of a removed subvolume still there", qdir)
		}
		unix.Sync()
		time.Sleep(100 * time.Millisecond)
	}
}

func TestReopenAdoptsMount(t *testing.T) {
	p := openTestPool(t)
	dir := filepath.Join(p.MountPoint(), "keep")
	if err := p.Create(dir, 16<<20); err != nil {
		t.Fatal(err)
	}
	again, err := Open(p.image, p.mountPoint, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, limit, err := again.Usage(dir); err != nil || limit != 16<<20 {
		t.Fatalf("after reopen: limit %d, err %v", limit, err)
	}
}

// BenchmarkCreateRemove is the per-sandbox cost of the quota: subvolume +
// limit on create, subvolume delete + qgroup sweep on kill.
func BenchmarkCreateRemove(b *testing.B) {
	p := openTestPool(b)
	for i := 0; i < b.N; i++ {
		dir := filepath.Join(p.MountPoint(), "sb"+strconv.Itoa(i))
		if err := p.Create(dir, 1<<30); err != nil {
			b.Fatal(err)
		}
		if err := p.Remove(dir); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkUsage(b *testing.B) {
	p := openTestPool(b)
	dir := filepath.Join(p.MountPoint(), "sb")
	if err := p.Create(dir, 1<<30); err != nil {
		b.Fatal(err)
	}
	for i := 0; i < b.N; i++ {
		if _, _, err := p.Usage(dir); err != nil {
			b.Fatal(err)
		}
	}
}

// TestDevice: Device names the loop device the pool is mounted from (the
// device the blkio cgroup throttles sandboxes on).
func TestDevice(t *testing.T) {
	p := openTestPool(t)
	major, minor, err := p.Device()
	if err != nil {
		t.Fatal(err)
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	source := ""
	for _, line := range strings.Split(string(mi), "\n") {
		f := strings.Fields(line)
		if len(f) < 10 || f[4] != p.MountPoint() {
			continue
		}
		for i := 6; i < len(f)-2; i++ {
			if f[i] == "-" {
				source = f[i+2]
			}
		}
	}
	if !strings.HasPrefix(source, "/dev/loop") {
		t.Fatalf("pool %s is mounted from %q, not a loop device", p.MountPoint(), source)
	}
	var st unix.Stat_t
	if err := unix.Stat(source, &st); err != nil {
		t.Fatal(err)
	}
	if unix.Major(st.Rdev) != major || unix.Minor(st.Rdev) != minor {
		t.Errorf("Device() = %d:%d; the pool is mounted from %s (%d:%d)", major, minor, source, unix.Major(st.Rdev), unix.Minor(st.Rdev))
	}
}

// TestDamagedImage: an image whose filesystem btrfs cannot read (its
// metadata zeroed, as a machine that stops before the image's writes reach
// the disk can leave it) is not mounted, with an error that says the image
// is damaged and what moving it aside costs; the image stays as it was.
func TestDamagedImage(t *testing.T) {
	p := openTestPool(t)
	image, mnt := p.image, p.mountPoint
	if err := p.Close(false); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(image, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Past the primary superblock (64 KiB): the chunk and root trees.
	zero := make([]byte, 1<<20)
	for off := int64(1 << 20); off < 200<<20; off += int64(len(zero)) {
		if _, err := f.WriteAt(zero, off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	before, err := os.Stat(image)
	if err != nil {
		t.Fatal(err)
	}
	again, err := Open(image, mnt, 0)
	if err == nil {
		_ = again.Close(false)
		t.Fatal("a damaged image was mounted")
	}
	if msg := err.Error(); !strings.Contains(msg, "damaged") || !strings.Contains(msg, image) {
		t.Fatalf("error %q does not say the image %s is damaged", msg, image)
	}
	after, err := os.Stat(image)
	if err != nil || after.Size() != before.Size() || !after.ModTime().Equal(before.ModTime()) {
		t.Fatalf("the damaged image changed: %v, %v", after, err)
	}
	if typ, _ := mountedType(mnt); typ != "" {
		t.Fatalf("%s is mounted (%s)", mnt, typ)
	}
}
