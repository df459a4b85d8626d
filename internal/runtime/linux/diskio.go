package linux

import (
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// DiskThrottle is the blkio throttle every sandbox of a backend gets on one
// block device: the loop device under the sandbox disk pool
// (diskquota.Pool.Device), through which all of a sandbox's writable layer
// is read and written. Zero rates are no limit.
//
// What cgroup v1 throttles: I/O that a sandbox's own tasks submit, which is
// reads, direct I/O and the writeback that fsync, sync_file_range or
// O_SYNC do in the writer's context. Buffered writes that the kernel's
// flusher writes back later are submitted by the flusher, in the root blkio
// cgroup, and are not throttled here (cgroup v1 has no writeback
// attribution); what holds those back is the sandbox's memory cgroup (dirty
// pages count against it, and its reclaim waits for their writeback) and
// its disk quota.
type DiskThrottle struct {
	Major, Minor        uint32
	ReadBps, WriteBps   uint64 // bytes per second
	ReadIOPS, WriteIOPS uint64 // requests per second
}

// DefaultDiskThrottle is per sandbox: enough for a package install or a
// build (a sequential 1 GiB write takes ~16 s), low enough that one
// sandbox syncing in a loop leaves the pool's device to the others.
var DefaultDiskThrottle = DiskThrottle{ReadBps: 128 << 20, WriteBps: 64 << 20, ReadIOPS: 4000, WriteIOPS: 2000}

// SetDiskThrottle makes every sandbox this backend starts from now on
// (creates and restores) throttled as t says; a zero t (Major 0) turns it
// off. Sandboxes running already keep what they started with.
func (r *Runtime) SetDiskThrottle(t DiskThrottle) { r.disk.Store(&t) }

// applyDiskThrottle puts t on the OCI spec's blkio resources, which
// libcontainer writes to the sandbox's blkio cgroup (/airlock/<id>).
func applyDiskThrottle(s *specs.Spec, t *DiskThrottle) {
	if t == nil || t.Major == 0 {
		return
	}
	dev := func(rate uint64) []specs.LinuxThrottleDevice {
		if rate == 0 {
			return nil
		}
		d := specs.LinuxThrottleDevice{Rate: rate}
		d.Major, d.Minor = int64(t.Major), int64(t.Minor)
		return []specs.LinuxThrottleDevice{d}
	}
	if s.Linux.Resources.BlockIO == nil {
		s.Linux.Resources.BlockIO = &specs.LinuxBlockIO{}
	}
	b := s.Linux.Resources.BlockIO
	b.ThrottleReadBpsDevice = dev(t.ReadBps)
	b.ThrottleWriteBpsDevice = dev(t.WriteBps)
	b.ThrottleReadIOPSDevice = dev(t.ReadIOPS)
	b.ThrottleWriteIOPSDevice = dev(t.WriteIOPS)
}
