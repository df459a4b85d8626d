package sandbox

// Persistence: pause to disk, resume, and the captures forks and snapshots
// start from.
//
// A pause with memory checkpoints every process of the sandbox into
// <data>/paused/<id>/memory (runtime.Checkpointer), marks the image complete,
// then releases the runtime sandbox: its RAM goes back to the host, while its
// directory (the writable layer) and its network namespace stay. A pause
// without memory releases it without a checkpoint. Resume boots the sandbox
// again on the same directory: restored from the image when there is one,
// else afresh (processes gone, files kept, a new boot id).
//
// The record in the store changes state only after the runtime did, and
// Recover reads what is on disk, so a crash at any point leaves the old state
// or the new one: a complete image with no running sandbox is a paused
// sandbox, whatever the record says.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/crashpoint"
	"github.com/airlock-sandbox/airlock/internal/diskquota"
	"github.com/airlock-sandbox/airlock/internal/envdapi"
	"github.com/airlock-sandbox/airlock/internal/layout"
	"github.com/airlock-sandbox/airlock/internal/lifecycle"
	"github.com/airlock-sandbox/airlock/internal/runtime"
)

// bootRecord is what a sandbox's directory keeps about how to boot it again
// (resume, fork, snapshot): the template as it was at create, so that a
// rebuilt template does not change what a paused sandbox comes back on.
type bootRecord struct {
	Template Template `json:"template"`
	// Timeout is the create request's, which an auto-resume gives again.
	Timeout   time.Duration `json:"timeout"`
	Lifecycle Lifecycle     `json:"lifecycle"`
	// Envd is the digest of the envd binary the sandbox was booted with
	// (envdstore.go), which a checkpoint of it is restored with.
	Envd string `json:"envd,omitempty"`
}

const bootRecordName = "boot.json"

// writeBootRecord replaces dir's boot record whole (a temporary file renamed
// over it), without syncing it: a running sandbox does not outlive the host,
// so until a pause its record needs to survive only the server, which the
// page cache does. A pause makes it durable first (syncBootRecord), so that
// the paused sandbox it describes comes back after a power cut. Two fsyncs
// cost a create about 1.5 ms.
func writeBootRecord(dir string, rec bootRecord) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("boot record: %w", err)
	}
	if err := replaceFile(filepath.Join(dir, bootRecordName), b, false); err != nil {
		return fmt.Errorf("boot record: %w", err)
	}
	return nil
}

// syncBootRecord makes dir's boot record durable: its data, then the
// directory entry its rename made.
func syncBootRecord(dir string) error {
	f, err := os.Open(filepath.Join(dir, bootRecordName))
	if err != nil {
		return fmt.Errorf("boot record: %w", err)
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		return fmt.Errorf("boot record: sync: %w", err)
	}
	return nil
}

// writeDurable replaces path with data through a synced temporary file
// renamed over it, then syncs the directory: after a crash, even of the
// host, path holds the old content or the new, whole. The files that mark
// a step done (an image complete, a snapshot whole) are written so.
func writeDurable(path string, data []byte) error { return replaceFile(path, data, true) }

// replaceFile replaces path with data through a temporary file renamed over
// it, so that a reader (or a crash of the server) sees the old content or the
// new, whole; durable syncs both, so that a crash of the host does too.
func replaceFile(path string, data []byte, durable bool) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil && durable {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return err
	}
	if !durable {
		return nil
	}
	return syncDir(filepath.Dir(path))
}

func readBootRecord(dir string) (bootRecord, error) {
	var rec bootRecord
	b, err := os.ReadFile(filepath.Join(dir, bootRecordName))
	if err != nil {
		return rec, fmt.Errorf("boot record: %w", err)
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, fmt.Errorf("boot record: %w", err)
	}
	return rec, nil
}

func (m *Manager) layout() layout.DataDir { return layout.DataDir{Root: m.opts.DataDir} }

// connTracker remembers the host's open connections to one sandbox's envd
// and interpreter sockets. A checkpoint cannot save a socket whose peer is
// outside the sandbox, so every one is closed first (a client streaming a
// command's output sees its stream end, as on E2B).
type connTracker struct {
	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

type trackedConn struct {
	net.Conn
	t    *connTracker
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.t.mu.Lock()
		delete(c.t.conns, c)
		c.t.mu.Unlock()
	})
	return c.Conn.Close()
}

func (t *connTracker) track(c net.Conn) net.Conn {
	tc := &trackedConn{Conn: c, t: t}
	t.mu.Lock()
	if t.conns == nil {
		t.conns = map[net.Conn]struct{}{}
	}
	t.conns[tc] = struct{}{}
	t.mu.Unlock()
	return tc
}

// closeAll closes every tracked connection.
func (t *connTracker) closeAll() {
	t.mu.Lock()
	conns := make([]net.Conn, 0, len(t.conns))
	for c := range t.conns {
		conns = append(conns, c)
	}
	t.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}

// quiesce closes the host's connections into e, so that nothing outside the
// sandbox is connected to it when it is checkpointed.
func (m *Manager) quiesce(e *entry) {
	e.transport.CloseIdleConnections()
	e.interp.CloseIdleConnections()
	e.conns.closeAll()
}

// quiesceEnvd asks envd to let go of what a checkpoint cannot save (its
// sockets in RunDir, its sysinfo seccomp listeners: envdapi.QuiesceSignal)
// and waits until it has, that is until no socket file is left in its run
// directory. On failure (the runtime says up front it cannot checkpoint the
// sandbox, cannot signal envd, or envd did not finish within
// envdapi.QuiesceTimeout, as an envd older than the protocol does not) envd
// runs as before (woken again if it was signalled) and the error says why;
// the caller then goes on as when the runtime cannot checkpoint the sandbox.
func (m *Manager) quiesceEnvd(ctx context.Context, e *entry) error {
	if c, ok := e.rt.(runtime.CheckpointChecker); ok {
		// Not quiesced for a checkpoint that cannot happen: the quiesce
		// costs the running process trees their sysinfo view.
		if err := c.CanCheckpoint(); err != nil {
			return err
		}
	}
	sig, ok := e.rt.(runtime.InitSignaler)
	if !ok {
		return fmt.Errorf("the %T runtime cannot signal envd", e.rt)
	}
	if err := sig.SignalInit(envdapi.QuiesceSignal); err != nil {
		return fmt.Errorf("quiesce envd: %w", err)
	}
	runDir := filepath.Join(e.dir, envdapi.HostRunDir)
	deadline := time.Now().Add(envdapi.QuiesceTimeout)
	for delay := time.Millisecond; ; delay = min(2*delay, 20*time.Millisecond) {
		left := socketsIn(runDir)
		if left == "" {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			err := fmt.Errorf("envd did not quiesce within %v (%s still there)", envdapi.QuiesceTimeout, left)
			if werr := m.wakeEnvd(context.WithoutCancel(ctx), e, envdWakeLimit); werr != nil {
				err = errors.Join(err, werr)
			}
			return err
		}
		time.Sleep(delay)
	}
}

// socketsIn names a unix socket in dir, or returns "" when there is none.
func socketsIn(dir string) string {
	entries, _ := os.ReadDir(dir)
	for _, de := range entries {
		if de.Type()&os.ModeSocket != 0 {
			return de.Name()
		}
	}
	return ""
}

// envdWakeLimit bounds the wait for a woken envd to answer.
const envdWakeLimit = 10 * time.Second

// wakeEnvd ends a quiesce (envdapi.WakeSignal): envd listens again, and the
// host waits, up to limit, until it answers.
func (m *Manager) wakeEnvd(ctx context.Context, e *entry, limit time.Duration) error {
	sig, ok := e.rt.(runtime.InitSignaler)
	if !ok {
		return nil // never quiesced
	}
	if err := sig.SignalInit(envdapi.WakeSignal); err != nil {
		return fmt.Errorf("wake envd: %w", err)
	}
	if err := m.waitEnvd(ctx, e, limit); err != nil {
		return fmt.Errorf("wake envd: envd does not answer: %w", err)
	}
	return nil
}

// pause is Pause on a running sandbox whose op lock the caller holds. Every
// way a pause succeeds (with its memory, frozen in place, or without) ends
// in markPaused, which records its event with the record.
func (m *Manager) pause(ctx context.Context, e *entry, opts PauseOptions) (err error) {
	defer m.observe(OpPause, time.Now(), &err)
	e.mu.Lock()
	state := e.info.State
	e.mu.Unlock()
	if state == StatePaused {
		return fmt.Errorf("%w: sandbox %q is already paused", ErrConflict, e.id)
	}
	ck, ok := e.rt.(runtime.Checkpointer)
	if !ok {
		// A runtime without checkpoints freezes the sandbox in place.
		return m.freeze(ctx, e)
	}
	// The paused sandbox outlives the host: so must how to boot it again.
	if err := syncBootRecord(e.dir); err != nil {
		return fmt.Errorf("pause %s: %w", e.id, err)
	}
	dirs := m.layout()
	m.quiesce(e)
	withMemory := !opts.DropMemory
	if withMemory {
		img := dirs.PausedMemory(e.id)
		if err := os.RemoveAll(dirs.Paused(e.id)); err != nil {
			return fmt.Errorf("pause %s: %w", e.id, err)
		}
		if err := os.MkdirAll(dirs.Paused(e.id), 0o700); err != nil {
			return fmt.Errorf("pause %s: %w", e.id, err)
		}
		if err := m.quiesceEnvd(ctx, e); err != nil {
			// envd runs on as it was (quiesceEnvd woke it): freeze the
			// sandbox in place, as for one the runtime cannot save.
			_ = os.RemoveAll(dirs.Paused(e.id))
			m.log.Info("sandbox pause: memory stays resident", "id", e.id, "why", err)
			return m.freeze(ctx, e)
		}
		// The image is taken from the frozen sandbox, which is left frozen
		// (LeaveRunning) rather than ended by the checkpoint: its processes
		// end with the release, after the image is marked complete, so that
		// a crash in between leaves the old state (a frozen sandbox, which
		// Recover thaws and wakes) or the new one (a complete image, from
		// which Recover takes it as paused), never processes gone without a
		// complete image.
		if err := e.rt.Pause(); err != nil {
			_ = os.RemoveAll(dirs.Paused(e.id))
			if werr := m.wakeEnvd(context.WithoutCancel(ctx), e, envdWakeLimit); werr != nil {
				err = errors.Join(err, werr)
			}
			return fmt.Errorf("pause %s: freeze: %w", e.id, err)
		}
		if err := m.checkpointFrozen(ctx, e, ck, img, nil); err != nil {
			_ = os.RemoveAll(dirs.Paused(e.id))
			if st, serr := e.rt.Status(); serr != nil || (st != runtime.StatusPaused && st != runtime.StatusRunning) {
				// CRIU and runsc leave the processes as they were when they
				// fail; if they did not survive, the sandbox is lost, and is
				// not left half-dead.
				m.kill(context.WithoutCancel(ctx), e, lifecycle.KillPauseFailed)
				return fmt.Errorf("pause %s: the checkpoint failed and the sandbox did not survive it, so it was killed: %w", e.id, err)
			}
			if rerr := e.rt.Resume(); rerr != nil {
				// Left frozen, it would stay listed as running and answer
				// nothing.
				m.kill(context.WithoutCancel(ctx), e, lifecycle.KillResumeFailed)
				return fmt.Errorf("pause %s: the checkpoint failed (%w) and the sandbox could not be thawed after it, so it was killed: %w", e.id, err, rerr)
			}
			if werr := m.wakeEnvd(context.WithoutCancel(ctx), e, envdWakeLimit); werr != nil {
				return fmt.Errorf("pause %s: the checkpoint failed (%w) and envd did not wake after it: %w", e.id, err, werr)
			}
			if errors.Is(err, runtime.ErrNotSupported) {
				// This sandbox cannot be saved with its processes: freeze it
				// in place instead, its memory kept resident.
				m.log.Info("sandbox pause: memory stays resident", "id", e.id, "why", err)
				return m.freeze(ctx, e)
			}
			return fmt.Errorf("pause %s: the sandbox is still running: %w", e.id, err)
		}
		crashpoint.Hit(crashpoint.PauseCheckpointed)
		if err := writeDurable(dirs.PausedComplete(e.id), []byte(time.Now().UTC().Format(time.RFC3339Nano))); err != nil {
			return fmt.Errorf("pause %s: %w", e.id, err)
		}
		crashpoint.Hit(crashpoint.PauseImageComplete)
		m.pushPaused(e)
	}
	// The commit point of a pause with memory is the complete image above;
	// without memory nothing on disk tells a released sandbox from a dead
	// one but its record, so the record says paused before the runtime
	// sandbox goes. A crash in between leaves a running sandbox whose record
	// says paused, which Recover takes back as running.
	markErr := m.markPaused(context.WithoutCancel(ctx), e, withMemory)
	if markErr != nil && !withMemory {
		m.unmarkPaused(e)
		return markErr
	}
	crashpoint.Hit(crashpoint.PauseRecorded)
	if err := ck.Release(context.WithoutCancel(ctx)); err != nil {
		// What is left (a mount, a cgroup) is logged; the sandbox itself is
		// stopped and its state is on disk.
		m.log.Error("sandbox pause: release", "id", e.id, "err", err)
	}
	e.undo.drop(stepRuntime)
	e.rt = nil
	crashpoint.Hit(crashpoint.PauseReleased)
	if markErr != nil {
		// The image is whole and the processes are gone: the sandbox is
		// paused, and Recover will say so from the disk.
		return markErr
	}
	m.log.Info("sandbox paused", "id", e.id, "memory", withMemory)
	return nil
}

// pausedDiskBytes is what the paused (or pausing) sandbox e holds on disk:
// its checkpoint image, if any, and its directory, the writable layer a
// resume boots from; allocated blocks, as du counts them. The directory is
// walked even on a disk pool, whose quota accounting (the sandbox's disk
// metric) would cost no walk: that accounting lags the writes of the last
// commit interval, and this size is measured once, when the sandbox pauses,
// right after the writes a pause is most often preceded by.
func (m *Manager) pausedDiskBytes(e *entry) int64 {
	return runtime.DiskUsage(m.layout().Paused(e.id)) + runtime.DiskUsage(e.dir)
}

// unmarkPaused undoes markPaused in memory for a sandbox whose pause did
// not go on: it is running, and its timer runs again.
func (m *Manager) unmarkPaused(e *entry) {
	e.mu.Lock()
	e.info.unpause()
	m.armTimerLocked(e)
	e.mu.Unlock()
}

// resume boots a paused sandbox whose op lock the caller holds. On failure
// the sandbox stays paused, with its image and directory untouched.
func (m *Manager) resume(ctx context.Context, e *entry) (err error) {
	defer m.observe(OpResume, time.Now(), &err)
	rec, err := readBootRecord(e.dir)
	if err != nil {
		return fmt.Errorf("resume %s: %w", e.id, err)
	}
	dirs := m.layout()
	if err := m.renewSpentNetwork(e, rec.Template); err != nil {
		return fmt.Errorf("resume %s: %w", e.id, err)
	}
	mode := bootMode{existingDir: true}
	if e.info.PausedWithMemory {
		mode.image, mode.envd = dirs.PausedMemory(e.id), rec.Envd
		if err := affordable(mode.image); err != nil {
			return fmt.Errorf("resume %s: %w", e.id, err)
		}
	} else if err := m.recordCurrentEnvd(e.dir, rec); err != nil {
		return fmt.Errorf("resume %s: %w", e.id, err)
	}
	mark := len(e.undo.steps)
	err = m.boot(context.WithoutCancel(ctx), e, rec.Template, mode)
	if err == nil && mode.image == "" {
		// A cold boot runs the template's start command, as a create does.
		err = m.startPhase(ctx, e, rec.Template)
	}
	if err != nil {
		// Undo what this boot acquired (its runtime sandbox); the network
		// namespace, kept from before, stays.
		_ = e.undo.runAbove(context.WithoutCancel(ctx), mark, stepNetwork)
		e.rt = nil
		return err
	}
	crashpoint.Hit(crashpoint.ResumeBooted)
	if mode.image != "" {
		if err := m.discard(dirs.Paused(e.id)); err != nil {
			m.log.Warn("sandbox resume: removing the image", "id", e.id, "err", err)
		}
	}
	m.log.Info("sandbox resumed", "id", e.id, "memory", mode.image != "")
	return nil
}

// recordCurrentEnvd notes in the boot record in dir that the sandbox boots
// cold with the current envd, so that its next checkpoint is restored with
// that one.
func (m *Manager) recordCurrentEnvd(dir string, rec bootRecord) error {
	current, err := m.currentEnvd()
	if err != nil || rec.Envd == current {
		return err
	}
	rec.Envd = current
	return writeBootRecord(dir, rec)
}

// renewSpentNetwork makes the network a paused sandbox kept usable again
// when its backend used it up (runtime.NetNSSpender: gVisor strips the
// namespace's addresses): it puts eth0's address and default route back
// (netpolicy.Readdress), so the sandbox keeps its address, which the
// connections a restored netstack holds are bound to (a restored gVisor
// netstack takes its addresses from the namespace it joins). When that
// fails, the network is torn down and the boot that follows sets up a new
// one, usually at another address.
func (m *Manager) renewSpentNetwork(e *entry, tpl Template) error {
	if m.opts.Network == nil || e.net == nil {
		return nil
	}
	backend, err := m.runtimeFor(tpl.Runtime)
	if err != nil {
		return err
	}
	if sp, ok := backend.(runtime.NetNSSpender); !ok || !sp.SpendsNetNS() {
		return nil
	}
	rerr := m.opts.Network.Readdress(e.id)
	if rerr == nil {
		return nil
	}
	m.log.Warn("sandbox resume: the kept network could not be readdressed; a new one is set up", "id", e.id, "err", rerr)
	// At once, not in the background as a kill does: the new one is made
	// in the same state directory.
	if err := m.opts.Network.Teardown(e.id); err != nil {
		return fmt.Errorf("renew the network: %w", err)
	}
	e.undo.drop(stepNetwork)
	e.net = nil
	e.info.Addr = netip.Addr{}
	return nil
}

// affordable refuses to restore an image the host has not the memory for:
// the pages it holds must fit in what the host has available.
func affordable(image string) error {
	need := int64(0)
	entries, err := os.ReadDir(image)
	if err != nil {
		return fmt.Errorf("checkpoint image: %w", err)
	}
	for _, de := range entries {
		if strings.HasPrefix(de.Name(), "pages-") {
			if fi, err := de.Info(); err == nil {
				need += fi.Size()
			}
		}
	}
	avail, err := MemAvailable()
	if err != nil {
		return nil // unknown: let the restore try
	}
	if need > avail {
		return fmt.Errorf("%w: restoring needs %d MiB of memory and the host has %d MiB available", ErrLimit, need>>20, avail>>20)
	}
	return nil
}

// MemAvailable is the host's MemAvailable in bytes, as /proc/meminfo has it
// (the resume check).
func MemAvailable() (int64, error) { return HostMeminfo("MemAvailable") }

// HostMeminfo is field key of the host's /proc/meminfo, in bytes.
func HostMeminfo(key string) (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), key+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/meminfo: %s: %w", key, err)
			}
			return kb << 10, nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("/proc/meminfo: %w", err)
	}
	return 0, fmt.Errorf("no %s in /proc/meminfo", key)
}

// recoverPaused makes e, whose runtime sandbox did not survive (rt is what
// is left of it, or nil), a paused sandbox when its state on disk says it is
// one: a complete checkpoint image (paused with memory, whatever the record
// says: the server may have died between the checkpoint and the record), or
// a record that says paused and a directory to boot from (paused without).
// The caller holds e alone and publishes it.
func (m *Manager) recoverPaused(ctx context.Context, e *entry, rt runtime.Sandbox) bool {
	dirs := m.layout()
	_, imgErr := os.Stat(dirs.PausedComplete(e.id))
	withMemory := imgErr == nil
	br, err := readBootRecord(e.dir)
	if err != nil || (!withMemory && e.info.State != StatePaused) {
		return false
	}
	if rt != nil {
		ck, ok := rt.(runtime.Checkpointer)
		if !ok {
			return false
		}
		if err := ck.Release(context.WithoutCancel(ctx)); err != nil {
			m.log.Warn("paused sandbox: releasing what its runtime left", "id", e.id, "err", err)
		}
		e.undo.drop(stepRuntime)
		// Released: a resume boots it from the disk, not by thawing this.
		e.rt = nil
	}
	if withMemory {
		m.pushPaused(e)
	}
	if m.opts.Network != nil {
		// Its namespace survives a restart of the server, not of the host;
		// without it a resume sets up a new one.
		if ns, err := m.opts.Network.Adopt(e.id, PolicyOf(e.info)); err == nil {
			e.net = ns
			e.info.Addr = ns.Addr
		} else {
			// Gone with a reboot: what is left of it (its state dir, the
			// empty netns mount point) goes now, so that the resume's
			// Setup starts clean, and that Setup pushes the one closer.
			m.log.Info("paused sandbox: its network did not survive; a resume sets up a new one", "id", e.id, "why", err)
			if terr := m.opts.Network.Teardown(e.id); terr != nil {
				m.log.Warn("paused sandbox: removing what is left of its network", "id", e.id, "err", terr)
			}
			e.undo.drop(stepNetwork)
			e.info.Addr = netip.Addr{}
		}
	}
	if e.info.State == StatePaused && e.info.PausedWithMemory && !withMemory {
		// Frozen in place (its runtime could not save it to disk), and the
		// processes did not outlive the host: its files are what is left.
		m.log.Warn("paused sandbox: its memory was held in RAM and is lost; a resume boots it afresh from its files", "id", e.id)
	}
	paused := e.info.State != StatePaused || e.info.PausedWithMemory != withMemory
	// A pause the crash caught after its image was complete but before
	// its record said so: its event was not recorded yet.
	unrecorded := e.info.State != StatePaused
	e.info.State = StatePaused
	e.info.PausedWithMemory = withMemory
	e.info.Lifecycle = br.Lifecycle
	if e.info.PausedAt.IsZero() {
		// Retention counts from the pause: the image's time when the
		// record did not get to say it, else from now.
		paused = true
		e.info.PausedAt = time.Now()
		if fi, err := os.Stat(dirs.PausedComplete(e.id)); err == nil {
			e.info.PausedAt = fi.ModTime()
		}
	}
	if e.info.PausedDiskBytes == 0 || unrecorded {
		// A record that did not get to say the pause, or one written by an
		// Airlock that did not measure it.
		paused = true
		e.info.PausedDiskBytes = m.pausedDiskBytes(e)
	}
	var werr error
	if unrecorded {
		werr = m.commit(ctx, e, ToRecord(e.info), lifecycle.Paused, lifecycle.EventData{Execution: executionData(e)})
	} else if paused {
		werr = m.opts.Store.Put(ctx, ToRecord(e.info))
	}
	if err := werr; err != nil {
		m.log.Warn("paused sandbox: record", "id", e.id, "err", err)
	}
	e.seenOOM = m.seenOOMOf(ctx, e.id)
	return true
}

// autoResume resumes a paused sandbox that allows it (lifecycle autoResume,
// paused with memory) for a request that reached it through the proxy; the
// sandbox gets the timeout it was created with. It reports whether the
// sandbox is running afterwards.
func (m *Manager) autoResume(id string) bool {
	_, info, err := m.view(id)
	if err != nil || info.State != StatePaused || !info.Lifecycle.AutoResume || !info.PausedWithMemory {
		return false
	}
	timeout := DefaultAutoResumeTimeout
	if rec, err := readBootRecord(m.sandboxDir(id)); err == nil && rec.Timeout > 0 {
		timeout = min(rec.Timeout, m.opts.MaxTimeout)
	}
	ctx, cancel := context.WithTimeout(m.life, 2*time.Minute)
	defer cancel()
	if _, _, err := m.Connect(ctx, id, timeout); err != nil {
		m.log.Warn("sandbox auto-resume failed", "id", id, "err", err)
		return false
	}
	return true
}

// DefaultAutoResumeTimeout is an auto-resumed sandbox's timeout when the one
// it was created with is unknown (E2B's default).
const DefaultAutoResumeTimeout = 5 * time.Minute

// A capture is what a fork or a snapshot takes of a running sandbox, in one
// instant: its directory (the writable layer and the boot record) as fs/,
// and, when the runtime can save them, its processes as memory/. It lives
// on the sandbox disk pool's filesystem (<data>/sandboxes/.captures,
// .snapshots), so that copying the writable layer in and out of it shares
// the bytes (reflinks) instead of copying them.
const (
	captureFS     = "fs"
	captureMemory = "memory"
)

func (m *Manager) capturesDir() string  { return filepath.Join(m.layout().Sandboxes(), ".captures") }
func (m *Manager) snapshotsDir() string { return filepath.Join(m.layout().Sandboxes(), ".snapshots") }

// capture saves running sandbox e into dst (which must not exist); the
// caller holds e.op. The sandbox is frozen while its layer is copied and its
// processes saved, and runs on after.
func (m *Manager) capture(ctx context.Context, e *entry, dst string) (withMemory bool, err error) {
	e.mu.Lock()
	state := e.info.State
	e.mu.Unlock()
	if state != StateRunning || e.rt == nil {
		return false, fmt.Errorf("%w: sandbox %q is %s; only a running sandbox can be forked or snapshotted", ErrConflict, e.id, state)
	}
	if err := os.MkdirAll(dst, 0o700); err != nil {
		return false, err
	}
	m.quiesce(e)
	ck, canCheckpoint := e.rt.(runtime.Checkpointer)
	if canCheckpoint {
		if qerr := m.quiesceEnvd(ctx, e); qerr != nil {
			// envd runs on as it was (quiesceEnvd woke it); the capture
			// keeps the files only.
			m.log.Info("capture: filesystem only", "id", e.id, "why", qerr)
			canCheckpoint = false
		} else {
			// Woken after the thaw below (deferred calls run last-first),
			// unless the thaw failed and the sandbox is gone.
			defer func() {
				if e.gone {
					return
				}
				if werr := m.wakeEnvd(context.WithoutCancel(ctx), e, envdWakeLimit); werr != nil && err == nil {
					err = fmt.Errorf("capture %s: %w", e.id, werr)
				}
			}()
		}
	}
	if err := e.rt.Pause(); err != nil {
		return false, fmt.Errorf("capture %s: freeze: %w", e.id, err)
	}
	defer func() {
		if rerr := e.rt.Resume(); rerr != nil {
			// Left frozen, it would stay listed as running and answer
			// nothing: it is lost, and killed (after a failed checkpoint
			// that did not leave its processes alive, too).
			m.kill(context.WithoutCancel(ctx), e, lifecycle.KillResumeFailed)
			withMemory = false
			err = fmt.Errorf("capture %s: the sandbox could not be thawed after it, so it was killed: %w", e.id, errors.Join(err, rerr))
		}
	}()
	if err := copySandboxDir(e.dir, filepath.Join(dst, captureFS)); err != nil {
		return false, fmt.Errorf("capture %s: %w", e.id, err)
	}
	crashpoint.Hit(crashpoint.CaptureFrozen)
	if canCheckpoint {
		// A retry thaws the sandbox for a moment: the filesystem is copied
		// again, frozen, so that it and the memory image are of one moment.
		recopy := func() error {
			if err := os.RemoveAll(filepath.Join(dst, captureFS)); err != nil {
				return err
			}
			return copySandboxDir(e.dir, filepath.Join(dst, captureFS))
		}
		err := m.checkpointFrozen(ctx, e, ck, filepath.Join(dst, captureMemory), recopy)
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, runtime.ErrNotSupported):
			_ = os.RemoveAll(filepath.Join(dst, captureMemory))
			m.log.Info("capture: filesystem only", "id", e.id, "why", err)
		default:
			return false, fmt.Errorf("capture %s: %w", e.id, err)
		}
	}
	return false, nil
}

// copySandboxDir copies what a sandbox directory holds of the sandbox's
// state into dst: the writable layer (diskquota.CopyTree: xattrs such as
// trusted.overlay.opaque and whiteout devices kept, data reflinked), the
// boot record, and envd's log (a restored envd holds it open). Mount points,
// overlay's work dir and sockets are made afresh by the next boot.
func copySandboxDir(src, dst string) error {
	if err := os.MkdirAll(filepath.Join(dst, envdapi.HostRunDir), 0o700); err != nil {
		return err
	}
	if err := diskquota.CopyTree(filepath.Join(src, "upper"), filepath.Join(dst, "upper")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	for _, name := range []string{bootRecordName, filepath.Join(envdapi.HostRunDir, envdapi.LogName)} {
		if _, err := os.Lstat(filepath.Join(src, name)); errors.Is(err, os.ErrNotExist) {
			continue
		}
		out, err := exec.Command("cp", "-a", "--", filepath.Join(src, name), filepath.Join(dst, name)).CombinedOutput()
		if err != nil {
			return fmt.Errorf("copy %s: %w: %s", name, err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// startFrom starts a new sandbox from the capture in dir: info describes it
// (its new ID set by startFrom), timeout its life. It is published and
// returned running.
func (m *Manager) startFrom(ctx context.Context, dir string, info Info, timeout time.Duration) (Info, error) {
	rec, err := readBootRecord(filepath.Join(dir, captureFS))
	if err != nil {
		return Info{}, err
	}
	// Any backend's image (CRIU's inventory.img, runsc's checkpoint.img):
	// capture leaves memory/ only when the checkpoint succeeded.
	entries, _ := os.ReadDir(filepath.Join(dir, captureMemory))
	withMemory := len(entries) > 0
	release, err := m.reserve(info.Owner, info.CPUCount, info.MemoryMB, false)
	if err != nil {
		return Info{}, err
	}
	defer release()
	// The same volumes as the captured sandbox, held until this one is
	// published (volumes.go).
	mounts, releaseVolumes, err := m.leaseVolumes(ctx, info.Owner, info.VolumeMounts)
	if err != nil {
		return Info{}, err
	}
	defer releaseVolumes()
	info.VolumeMounts = mounts
	now := time.Now()
	info.ID = newID()
	info.StartedAt, info.EndAt = now, now.Add(timeout)
	info.State = StateCreating
	info.PausedWithMemory, info.PausedAt = false, time.Time{}
	info.Addr = netip.Addr{}
	if !withMemory {
		// A cold boot takes a token of its own; a restored envd keeps the
		// one it was captured with.
		info.AccessToken = newToken()
	}
	e := m.newEntry(info)
	boot := func() error {
		if err := m.opts.Store.Put(ctx, ToRecord(e.info)); err != nil {
			return err
		}
		m.pushRecord(e)
		m.pushDir(e)
		if err := m.makeSandboxDir(e.dir, info.DiskSizeMB); err != nil {
			return err
		}
		if err := copySandboxDir(filepath.Join(dir, captureFS), e.dir); err != nil {
			return err
		}
		rec.Timeout, rec.Lifecycle = timeout, info.Lifecycle
		mode := bootMode{existingDir: true}
		if withMemory {
			mode.image, mode.envd = filepath.Join(dir, captureMemory), rec.Envd
		} else if rec.Envd, err = m.currentEnvd(); err != nil {
			return err
		}
		if err := writeBootRecord(e.dir, rec); err != nil {
			return err
		}
		m.pushLog(e)
		if err := m.boot(context.WithoutCancel(ctx), e, rec.Template, mode); err != nil {
			return err
		}
		if !withMemory {
			if err := m.startPhase(ctx, e, rec.Template); err != nil {
				return err
			}
		}
		// Until the record says running, a crash leaves a sandbox Recover
		// destroys (a record in creating): the fork did not happen.
		crashpoint.Hit(crashpoint.StartedFromCapture)
		m.beginExecution(e, rec.Template.BuildID)
		e.info.State = StateRunning
		return m.commit(context.WithoutCancel(ctx), e, ToRecord(e.info), lifecycle.Created, lifecycle.EventData{})
	}
	if err := boot(); err != nil {
		_ = m.destroy(context.WithoutCancel(ctx), e)
		return Info{}, err
	}
	return m.publish(e), nil
}

// Fork starts req.Count sandboxes from one capture of sandbox id, which runs
// on.
func (m *Manager) Fork(ctx context.Context, id string, req ForkRequest) (_ []ForkResult, err error) {
	defer m.observe(OpFork, time.Now(), &err)
	if req.Count < 1 || req.Count > MaxForkCount {
		return nil, fmt.Errorf("%w: count must be between 1 and %d, got %d", ErrInvalid, MaxForkCount, req.Count)
	}
	if err := m.checkTimeout(req.Timeout, false); err != nil {
		return nil, err
	}
	dir := filepath.Join(m.capturesDir(), "fork-"+newID())
	// Off the caller's path: the forks are answered before the capture's
	// files go (Recover empties capturesDir).
	defer m.background(func() { _ = os.RemoveAll(dir) })
	var base Info
	err = m.with(id, func(e *entry) error {
		e.mu.Lock()
		base = e.info
		e.mu.Unlock()
		if _, err := m.capture(ctx, e, dir); err != nil {
			return err
		}
		m.record(ctx, e, lifecycle.Checkpointed, lifecycle.EventData{ForkCount: req.Count})
		return nil
	})
	if err != nil {
		return nil, err
	}
	crashpoint.Hit(crashpoint.ForkCaptured)
	base.Owner = req.Owner
	base.Metadata, base.EnvVars = copyMap(base.Metadata), copyMap(base.EnvVars)
	base.VolumeMounts = slices.Clone(base.VolumeMounts)
	base.Lifecycle = Lifecycle{}
	out := make([]ForkResult, req.Count)
	for i := range out {
		info, err := m.startFrom(ctx, dir, base, req.Timeout)
		out[i] = ForkResult{Info: info, Err: err}
	}
	return out, nil
}

// sweepCaptures removes what interrupted forks and snapshots left (Recover).
func (m *Manager) sweepCaptures(ctx context.Context) {
	_ = os.RemoveAll(m.capturesDir())
	sweepDiscarded(m.layout().AllPaused())
	m.sweepSnapshots(ctx)
}

// busyAttempts bounds the checkpoints tried while they fail with
// runtime.ErrBusy.
const busyAttempts = 8

// checkpointFrozen checkpoints the frozen sandbox into dir, leaving it
// frozen. A checkpoint that fails with runtime.ErrBusy (a process caught
// halfway through a netlink exchange, or in uninterruptible sleep) is tried
// again after thawing the sandbox for a moment, so that what held it can
// end, and freezing it again; redo, if set, then retakes what the caller took of the frozen
// sandbox before. Whatever it returns, the sandbox is frozen or its
// processes run on as they were, as after one checkpoint.
func (m *Manager) checkpointFrozen(ctx context.Context, e *entry, ck runtime.Checkpointer, dir string, redo func() error) error {
	for attempt := 1; ; attempt++ {
		err := ck.Checkpoint(ctx, runtime.CheckpointOptions{ImageDir: dir, LeaveRunning: true})
		if err == nil || !errors.Is(err, runtime.ErrBusy) || attempt == busyAttempts || ctx.Err() != nil {
			return err
		}
		m.log.Debug("checkpoint: a process is busy; thawing for a moment", "id", e.id, "attempt", attempt)
		if rerr := os.RemoveAll(dir); rerr != nil {
			return errors.Join(err, rerr)
		}
		if rerr := e.rt.Resume(); rerr != nil {
			return errors.Join(err, fmt.Errorf("thaw between checkpoint attempts: %w", rerr))
		}
		select {
		case <-time.After(time.Duration(attempt)*20*time.Millisecond + rand.N(20*time.Millisecond)):
		case <-ctx.Done():
		}
		if perr := e.rt.Pause(); perr != nil {
			return errors.Join(err, fmt.Errorf("freeze between checkpoint attempts: %w", perr))
		}
		if redo != nil {
			if rerr := redo(); rerr != nil {
				return errors.Join(err, rerr)
			}
		}
	}
}
