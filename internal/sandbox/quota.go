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
}

// pending is what the creations and resumes in flight of one owner will
// hold, counted until they end, so that concurrent requests cannot all
// pass a quota before any is counted among the live.
type pending struct{ alive, cpu, mem int }

// usage is what an owner holds now.
type usage struct{ alive, paused, cpu, mem int }

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
// sandboxes.
func (m *Manager) checkPausedQuota(owner string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	q := m.quotaFor(owner)
	if q.Paused <= 0 {
		return nil
	}
	if u := m.usageLocked(owner); u.paused+1 > q.Paused {
		return fmt.Errorf("%w: quota of paused sandboxes reached: %s has %d paused, its limit is %d; kill or resume one first",
			ErrLimit, teamName(q), u.paused, q.Paused)
	}
	return nil
}
