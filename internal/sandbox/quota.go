package sandbox

import "fmt"

// Quota is what one owner (a team) may hold at once. A zero field limits
// nothing, but Sandboxes, which falls back to Options.MaxPerOwner.
type Quota struct {
	// Team names the owner in messages ("" says "this team").
	Team string
	// Sandboxes alive at once: running, paused or starting.
	Sandboxes int
	// VCPUs and MemoryMB of the running and starting sandboxes (a paused
	// one holds neither).
	VCPUs    int
	MemoryMB int
	// Paused sandboxes at once.
	Paused int
	// PausedDiskMB is what the paused sandboxes hold on disk together
	// (Info.PausedDiskBytes).
	PausedDiskMB int
}

// pending is what the creations and resumes in flight of one owner will
// hold, counted until they end, so that concurrent requests cannot all
// pass a quota before any is counted among the live.
type pending struct{ alive, cpu, mem int }

// usage is what an owner holds now.
type usage struct {
	alive, paused, cpu, mem int
	pausedDisk              int64
}

// quotaFor is owner's quota: Options.Quota's, with Options.MaxPerOwner
// where it sets no Sandboxes. The caller holds m.mu.
func (m *Manager) quotaFor(owner string) Quota {
	var q Quota
	if m.opts.Quota != nil {
		q = m.opts.Quota(owner)
	}
	if q.Sandboxes <= 0 {
		q.Sandboxes = m.opts.MaxPerOwner
	}
	return q
}

// usageLocked is what owner holds, in-flight work included; the caller
// holds m.mu.
func (m *Manager) usageLocked(owner string) usage {
	p := m.creating[owner]
	u := usage{alive: p.alive, cpu: p.cpu, mem: p.mem}
	for _, e := range m.sandboxes {
		e.mu.Lock()
		if e.info.Owner == owner && e.info.State != StateKilled {
			u.alive++
			if e.info.State == StatePaused {
				u.paused++
				u.pausedDisk += e.info.PausedDiskBytes
			} else {
				u.cpu += e.info.CPUCount
				u.mem += e.info.MemoryMB
			}
		}
		e.mu.Unlock()
	}
	return u
}

func teamName(q Quota) string {
	if q.Team == "" {
		return "this team"
	}
	return "team " + q.Team
}

// reserve counts a creation (or, resuming, the resume of a paused sandbox)
// in flight for owner, of cpu vCPUs and mem MiB, or fails with ErrLimit
// naming the quota, its limit and its use. The returned release must be
// called once the work has ended either way (a sandbox made is then
// counted among the live ones).
func (m *Manager) reserve(owner string, cpu, mem int, resuming bool) (release func(), err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	q := m.quotaFor(owner)
	if q.Sandboxes <= 0 && q.VCPUs <= 0 && q.MemoryMB <= 0 {
		return func() {}, nil
	}
	u := m.usageLocked(owner)
	switch {
	case !resuming && q.Sandboxes > 0 && u.alive+1 > q.Sandboxes:
		return nil, fmt.Errorf("%w: quota of concurrent sandboxes reached: %s has %d running, paused or starting, its limit is %d; kill one first",
			ErrLimit, teamName(q), u.alive, q.Sandboxes)
	case q.VCPUs > 0 && u.cpu+cpu > q.VCPUs:
		return nil, fmt.Errorf("%w: quota of vCPUs reached: %s's running sandboxes use %d of its %d vCPUs, and this one needs %d",
			ErrLimit, teamName(q), u.cpu, q.VCPUs, cpu)
	case q.MemoryMB > 0 && u.mem+mem > q.MemoryMB:
		return nil, fmt.Errorf("%w: quota of memory reached: %s's running sandboxes use %d of its %d MiB, and this one needs %d MiB",
			ErrLimit, teamName(q), u.mem, q.MemoryMB, mem)
	}
	p := m.creating[owner]
	if !resuming {
		p.alive++
	}
	p.cpu, p.mem = p.cpu+cpu, p.mem+mem
	m.creating[owner] = p
	return func() {
		m.mu.Lock()
		p := m.creating[owner]
		if !resuming {
			p.alive--
		}
		p.cpu, p.mem = p.cpu-cpu, p.mem-mem
		if p == (pending{}) {
			delete(m.creating, owner)
		} else {
			m.creating[owner] = p
		}
		m.mu.Unlock()
	}, nil
}

// checkPausedQuota fails with ErrLimit when owner may pause no more
// sandboxes, and with ErrStorageLimit (an ErrLimit too) when its paused
// sandboxes already hold its quota of disk. The disk quota is checked
// against what is paused already, since a sandbox's size is known only once
// its pause has written it: the pause that crosses the limit is let through,
// and the next one is refused. Nothing is reserved for a pause in flight
// either, so concurrent pauses of one team may all pass.
func (m *Manager) checkPausedQuota(owner string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	q := m.quotaFor(owner)
	if q.Paused <= 0 && q.PausedDiskMB <= 0 {
		return nil
	}
	u := m.usageLocked(owner)
	if q.Paused > 0 && u.paused+1 > q.Paused {
		return fmt.Errorf("%w: quota of paused sandboxes reached: %s has %d paused, its limit is %d; kill or resume one first",
			ErrLimit, teamName(q), u.paused, q.Paused)
	}
	if q.PausedDiskMB > 0 && u.pausedDisk >= int64(q.PausedDiskMB)<<20 {
		return fmt.Errorf("%w: quota of paused sandboxes' disk reached: %s's paused sandboxes hold %d MiB on disk, its limit is %d MiB; kill or resume one first",
			ErrStorageLimit, teamName(q), ceilMiB(u.pausedDisk), q.PausedDiskMB)
	}
	return nil
}

// ceilMiB is n bytes in MiB, rounded up: a use just past a limit does not
// read as equal to it.
func ceilMiB(n int64) int64 { return (n + 1<<20 - 1) >> 20 }
