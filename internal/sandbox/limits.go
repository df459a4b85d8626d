package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/airlock-sandbox/airlock/internal/envdapi"
	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/sandboxlog"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// Disk sizes a create request may ask for. The lower bound leaves room for
// what a shell session writes (apt lists, pip caches are bigger, but those
// are the client's choice); the upper default is the image's default ceiling.
const (
	DefaultDiskSizeMB = 1024
	MinDiskSizeMB     = 64
	defaultMaxDiskMB  = 64 << 10
)

// EventOOM is the kind of the event recorded when the kernel OOM-kills a
// process of a sandbox.
const EventOOM = "oom"

// diskSize resolves and bounds the disk size of a create request: the
// request's, else the template's, else DefaultDiskSizeMB.
func (m *Manager) diskSize(req CreateRequest, tpl Template) (int, error) {
	mb := req.DiskSizeMB
	if mb == 0 {
		mb = tpl.DiskSizeMB
	}
	if mb <= 0 {
		mb = DefaultDiskSizeMB
	}
	maxMB := m.opts.MaxDiskSizeMB
	if maxMB <= 0 {
		maxMB = defaultMaxDiskMB
	}
	if mb < MinDiskSizeMB || mb > maxMB {
		return 0, fmt.Errorf("%w: diskSizeMB must be between %d and %d, got %d", ErrInvalid, MinDiskSizeMB, maxMB, mb)
	}
	return mb, nil
}

// startDiskMB is the disk size a sandbox starts with: a warm one has no
// request yet and takes the template's (claim sets the request's).
func startDiskMB(info Info, tpl Template) int {
	switch {
	case info.DiskSizeMB > 0:
		return info.DiskSizeMB
	case tpl.DiskSizeMB > 0:
		return tpl.DiskSizeMB
	}
	return DefaultDiskSizeMB
}

// makeSandboxDir creates a sandbox's directory: with a disk pool, as a quota
// subvolume limited to the sandbox's disk size, so that the writable layer
// the runtime keeps under it cannot outgrow it (writes then fail with EDQUOT
// inside the sandbox).
func (m *Manager) makeSandboxDir(dir string, diskSizeMB int) error {
	if m.opts.Disk != nil {
		if err := m.opts.Disk.Create(dir, int64(diskSizeMB)<<20); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, envdapi.HostRunDir), 0o700); err != nil {
		return err
	}
	return nil
}

// releaseDisk drops a sandbox directory's subvolume and quota once the
// runtime has torn the sandbox down.
func (m *Manager) releaseDisk(dir string) {
	if m.opts.Disk == nil {
		return
	}
	if err := m.opts.Disk.Remove(dir); err != nil {
		m.log.Error("release sandbox disk", "dir", dir, "err", err)
	}
}

// diskUsed is the sandbox's writable-layer size: from the quota accounting
// when there is a pool (two small sysfs reads), else what the runtime measured.
func (m *Manager) diskUsed(e *entry, st runtime.Stats) int64 {
	if m.opts.Disk != nil {
		if used, _, err := m.opts.Disk.Usage(e.dir); err == nil {
			return used
		}
	}
	return st.WritableBytes
}

// noteOOM records an event when the sandbox's OOM-kill counter has grown
// since the last sample. The counter lives in the kernel; seenOOM is what the
// events recorded so far add up to, so a restarted server does not record
// old kills again. The caller holds e.op (the event must not outlive Kill).
func (m *Manager) noteOOM(e *entry, st runtime.Stats) {
	e.mu.Lock()
	delta := st.OOMKills - e.seenOOM
	if delta > 0 {
		e.seenOOM = st.OOMKills
	}
	e.mu.Unlock()
	if delta <= 0 {
		return
	}
	msg := fmt.Sprintf("out of memory: the kernel killed %d process(es) that exceeded the sandbox's memory limit", delta)
	m.log.Warn("sandbox OOM kill", "id", e.id, "killed", delta, "total", st.OOMKills)
	ev := store.Event{SandboxID: e.id, Time: st.Time, Kind: EventOOM, Count: delta, Message: msg}
	if err := m.opts.Store.AddEvent(context.Background(), ev); err != nil {
		m.log.Error("record OOM event", "id", e.id, "err", err)
	}
	m.hostLog(e.id, sandboxlog.Error, "airlock.oom", msg, map[string]string{"killed": fmt.Sprint(delta), "total": fmt.Sprint(st.OOMKills)})
}

// seenOOMOf sums the OOM kills already recorded for a sandbox.
func (m *Manager) seenOOMOf(ctx context.Context, id string) int64 {
	evs, err := m.opts.Store.Events(ctx, id)
	if err != nil {
		return 0
	}
	var n int64
	for _, ev := range evs {
		if ev.Kind == EventOOM {
			n += ev.Count
		}
	}
	return n
}

// DataDir is the directory the manager keeps sandboxes under.
func (m *Manager) DataDir() string { return m.opts.DataDir }
