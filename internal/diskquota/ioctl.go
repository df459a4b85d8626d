package diskquota

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The btrfs ioctls of linux/btrfs.h that the pool needs. Request numbers are
// _IOC(dir, 0x94, nr, size) spelled out, since x/sys/unix does not carry them.
const (
	iocSubvolCreate = 0x5000940e // _IOW(0x94, 14, struct btrfs_ioctl_vol_args)
	iocSnapDestroy  = 0x5000940f // _IOW(0x94, 15, struct btrfs_ioctl_vol_args)
	iocInoLookup    = 0xd0009412 // _IOWR(0x94, 18, struct btrfs_ioctl_ino_lookup_args)
	iocSnapCreateV2 = 0x50009417 // _IOW(0x94, 23, struct btrfs_ioctl_vol_args_v2)
	iocFSInfo       = 0x8400941f // _IOR(0x94, 31, struct btrfs_ioctl_fs_info_args)
	iocQuotaCtl     = 0xc0109428 // _IOWR(0x94, 40, struct btrfs_ioctl_quota_ctl_args)
	iocQgroupCreate = 0x4010942a // _IOW(0x94, 42, struct btrfs_ioctl_qgroup_create_args)
	iocQgroupLimit  = 0x8030942b // _IOR(0x94, 43, struct btrfs_ioctl_qgroup_limit_args)
	iocQuotaRescan  = 0x4040942c // _IOW(0x94, 44, struct btrfs_ioctl_quota_rescan_args)

	quotaCtlEnable = 1
	limitMaxRfer   = 1 // BTRFS_QGROUP_LIMIT_MAX_RFER
	// limitClear as a limit value lifts the limit (the kernel's CLEAR_VALUE);
	// 0 would be a limit of zero bytes.
	limitClear = ^uint64(0)

	// firstFreeObjectID is the inode number of every subvolume's root
	// directory (BTRFS_FIRST_FREE_OBJECTID).
	firstFreeObjectID = 256
)

// volArgs is struct btrfs_ioctl_vol_args.
type volArgs struct {
	fd   int64
	name [4088]byte
}

// volArgsV2 is struct btrfs_ioctl_vol_args_v2 (4096 bytes): fd is the
// source subvolume of a snapshot, flags 0 makes it writable, and no qgroup
// inherit list is passed (the kernel still gives the snapshot its own level-0
// qgroup, starting from the source's numbers and limit).
type volArgsV2 struct {
	fd      int64
	transid uint64
	flags   uint64
	unused  [4]uint64
	name    [4040]byte
}

// The kernel reads exactly 4096 bytes; a layout mistake must not compile.
var (
	_ [4096 - unsafe.Sizeof(volArgsV2{})]byte
	_ [unsafe.Sizeof(volArgsV2{}) - 4096]byte
)

// inoLookupArgs is struct btrfs_ioctl_ino_lookup_args.
type inoLookupArgs struct {
	treeID   uint64
	objectID uint64
	name     [4080]byte
}

// fsInfoArgs is the head of struct btrfs_ioctl_fs_info_args (1024 bytes).
type fsInfoArgs struct {
	maxID      uint64
	numDevices uint64
	fsid       [16]byte
	rest       [1024 - 32]byte
}

type quotaCtlArgs struct {
	cmd    uint64
	status uint64
}

type qgroupCreateArgs struct {
	create   uint64
	qgroupID uint64
}

// quotaRescanArgs is struct btrfs_ioctl_quota_rescan_args.
type quotaRescanArgs struct {
	flags    uint64
	progress uint64
	reserved [6]uint64
}

// qgroupLimitArgs is struct btrfs_ioctl_qgroup_limit_args.
type qgroupLimitArgs struct {
	qgroupID uint64
	flags    uint64
	maxRfer  uint64
	maxExcl  uint64
	rsvRfer  uint64
	rsvExcl  uint64
}

func ioctl(fd int, req uintptr, arg unsafe.Pointer) error {
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
	if errno != 0 {
		return errno
	}
	return nil
}

func nameArgs(name string) (*volArgs, error) {
	a := &volArgs{}
	if len(name) == 0 || len(name) >= len(a.name) {
		return nil, fmt.Errorf("bad subvolume name %q", name)
	}
	copy(a.name[:], name)
	return a, nil
}

func subvolCreate(parentFD int, name string) error {
	a, err := nameArgs(name)
	if err != nil {
		return err
	}
	return ioctl(parentFD, iocSubvolCreate, unsafe.Pointer(a))
}

// snapCreate makes name, in the directory parentFD, a writable snapshot of
// the subvolume srcFD is the root of.
func snapCreate(parentFD, srcFD int, name string) error {
	a := &volArgsV2{fd: int64(srcFD)}
	if len(name) == 0 || len(name) >= len(a.name) {
		return fmt.Errorf("bad subvolume name %q", name)
	}
	copy(a.name[:], name)
	return ioctl(parentFD, iocSnapCreateV2, unsafe.Pointer(a))
}

func subvolDestroy(parentFD int, name string) error {
	a, err := nameArgs(name)
	if err != nil {
		return err
	}
	return ioctl(parentFD, iocSnapDestroy, unsafe.Pointer(a))
}

// subvolID returns the id of the subvolume whose root is dir.
func subvolID(dir string) (uint64, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("diskquota: %w", err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, fmt.Errorf("diskquota: %w", err)
	}
	if st.Ino != firstFreeObjectID {
		return 0, fmt.Errorf("diskquota: %s is not a subvolume", dir)
	}
	a := &inoLookupArgs{objectID: firstFreeObjectID}
	if err := ioctl(fd, iocInoLookup, unsafe.Pointer(a)); err != nil {
		return 0, fmt.Errorf("diskquota: subvolume id of %s: %w", dir, err)
	}
	return a.treeID, nil
}

// fsID returns the filesystem's UUID as /sys/fs/btrfs names it.
func fsID(fd int) (string, error) {
	a := &fsInfoArgs{}
	if err := ioctl(fd, iocFSInfo, unsafe.Pointer(a)); err != nil {
		return "", fmt.Errorf("diskquota: btrfs fs info: %w", err)
	}
	u := a.fsid
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16]), nil
}

func quotaEnable(fd int) error {
	a := &quotaCtlArgs{cmd: quotaCtlEnable}
	if err := ioctl(fd, iocQuotaCtl, unsafe.Pointer(a)); err != nil {
		return fmt.Errorf("diskquota: enable quotas: %w", err)
	}
	return nil
}

// qgroupLimit sets the referenced-bytes limit of the level-0 qgroup of a
// subvolume (limit <= 0 lifts it); fd is any file of the filesystem.
func qgroupLimit(fd int, subvol uint64, limit int64) error {
	max := uint64(limit)
	if limit <= 0 {
		max = limitClear
	}
	a := &qgroupLimitArgs{qgroupID: subvol, flags: limitMaxRfer, maxRfer: max}
	return ioctl(fd, iocQgroupLimit, unsafe.Pointer(a))
}

func qgroupRemove(fd int, subvol uint64) error {
	a := &qgroupCreateArgs{create: 0, qgroupID: subvol}
	return ioctl(fd, iocQgroupCreate, unsafe.Pointer(a))
}

// quotaRescan starts a recount of every qgroup in the background.
func quotaRescan(fd int) error {
	a := &quotaRescanArgs{}
	return ioctl(fd, iocQuotaRescan, unsafe.Pointer(a))
}
