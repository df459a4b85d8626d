package bench

// `airlock bench persist`: what pause, resume, snapshots and fork cost, and
// how much memory a paused sandbox gives back, measured on the manager the
// daemon wires (the calls the E2B handlers make, without HTTP), next to a
// plain `runc checkpoint` / `runc restore` of an equivalent container with
// the same CRIU in the same run.
//
// A pause may not do what its name promises: a runtime that cannot save a
// sandbox's processes freezes it in place (its memory stays on the host). So
// every pause row says which mode each pause really took, read from the data
// dir after it (the checkpoint's complete mark) and the sandbox's record, and
// the memory table shows what came back to the host whatever the mode.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/airlock-sandbox/airlock/internal/apikey"
	"github.com/airlock-sandbox/airlock/internal/grant"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/airlock-sandbox/airlock/internal/layout"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// PersistConfig says what to measure and on which server.
type PersistConfig struct {
	// Manager is the server's sandbox manager and DataDir its data dir (the
	// pause mode is read from it).
	Manager *sandbox.Manager
	DataDir string
	// SandboxURL and APIKey reach envd through the server's proxy, as the SDK
	// does, to start and check the workloads in sandboxes; Keys (the
	// server's) says who APIKey is: the sandboxes are its team's, and the
	// proxy takes its grants (internal/grant).
	SandboxURL, APIKey string
	Keys               *apikey.Service
	// Base is the template of the idle rows; BaseRootfs its root filesystem
	// for the runc baseline.
	Base, BaseRootfs string
	// Python is a template with python3 whose memory limit fits BigMiB plus
	// the interpreter; PythonRootfs its root filesystem. Empty skips the
	// Python rows.
	Python, PythonRootfs string
	// SmallMiB and BigMiB are what the Python process holds (every page
	// touched); 0 skips that row.
	SmallMiB, BigMiB int
	// Iterations pauses and resumes the idle and SmallMiB sandboxes, and
	// BigIterations the BigMiB one (each holds BigMiB on the host, and on disk
	// when paused with memory).
	Iterations, BigIterations int
	// Snapshots is how many snapshots, creates from a snapshot and forks of
	// one are measured, Fork10 how many forks of ten; 0 skips them.
	Snapshots, Fork10 int
	// NoBaseline skips the runc checkpoint/restore rows.
	NoBaseline bool
	Progress   io.Writer
}

// Pause modes, as read from the data dir after a pause.
const (
	ModeDisk   = "memory to disk"
	ModeFrozen = "frozen in place"
	ModeFS     = "filesystem only"
	// Modes of a sandbox started from a capture (fork, snapshot).
	ModeRestored = "restored with memory"
	ModeColdBoot = "cold boot from the filesystem"
)

// MemRow is what one workload's paused sandbox gave back to the host, from
// one pause per iteration (medians across them).
type MemRow struct {
	Name string
	N    int
	// Used is the sandbox's own memory while running (its cgroup, page
	// cache included, which is where gVisor's memory shows), just before
	// the pause. HostDrop is how much the host's process memory (below)
	// grew from before the create to just before the pause; Returned how
	// much it shrank from just before the pause to just after it (a window
	// of the pause alone). Resident is what the sandbox's cgroup still
	// holds once paused (frozen in place), 0 when its processes left the
	// host.
	Used, HostDrop, Returned, Resident int64
	Modes                              string
}

// Released is the share of what the sandbox used that the host has back
// once it is paused, in percent. Other processes move the host's figure
// too, so it can come out above 100 or below 0 when the sandbox's own use
// is small (an idle one's few MiB).
func (r MemRow) Released() float64 {
	if r.Used <= 0 {
		return 0
	}
	return 100 * float64(r.Returned) / float64(r.Used)
}

// PersistResult is both tables.
type PersistResult struct {
	Rows []Row
	Mem  []MemRow
}

// Targets (issue 13), printed beside the figures.
const (
	targetIdlePause   = 300 * time.Millisecond
	targetIdleResume  = 300 * time.Millisecond
	targetBigPause    = 2 * time.Second
	targetBigResume   = time.Second
	targetReleasedPct = 95
	targetFork1       = 500 * time.Millisecond
	targetFork10      = 3 * time.Second
)

// sandboxTimeout is long enough for any series; every sandbox is killed
// when its series ends.
const sandboxTimeout = 30 * time.Minute

// Persist performs every measurement.
func Persist(ctx context.Context, cfg PersistConfig) (PersistResult, error) {
	who, err := cfg.Keys.Authenticate(cfg.APIKey)
	if err != nil {
		return PersistResult{}, fmt.Errorf("the bench's API key: %w", err)
	}
	p := &persister{cfg: cfg, who: who, c: newClient(Config{SandboxURL: cfg.SandboxURL, APIKey: cfg.APIKey})}
	var res PersistResult
	add := func(rows ...Row) {
		for _, r := range rows {
			res.Rows = append(res.Rows, r)
			if cfg.Progress != nil {
				fmt.Fprintf(cfg.Progress, "measured %s (%d samples)\n", r.Name, len(r.Samples))
			}
		}
	}
	type workload struct {
		name, template, rootfs string
		mib, n                 int
		pause, resume          time.Duration // targets; 0: none
	}
	loads := []workload{{name: "idle " + cfg.Base, template: cfg.Base, rootfs: cfg.BaseRootfs, n: cfg.Iterations, pause: targetIdlePause, resume: targetIdleResume}}
	if cfg.Python != "" && cfg.SmallMiB > 0 {
		loads = append(loads, workload{name: fmt.Sprintf("python holding %d MiB", cfg.SmallMiB), template: cfg.Python, rootfs: cfg.PythonRootfs, mib: cfg.SmallMiB, n: cfg.Iterations})
	}
	if cfg.Python != "" && cfg.BigMiB > 0 {
		loads = append(loads, workload{name: fmt.Sprintf("python holding %d MiB", cfg.BigMiB), template: cfg.Python, rootfs: cfg.PythonRootfs, mib: cfg.BigMiB, n: cfg.BigIterations, pause: targetBigPause, resume: targetBigResume})
	}
	noise, err := hostNoise(max(cfg.Iterations, 3))
	if err != nil {
		return res, err
	}
	res.Mem = append(res.Mem, noise)
	for _, w := range loads {
		if w.n <= 0 {
			continue
		}
		pause, resume, mem, err := p.pauseResume(ctx, w.name, w.template, w.mib, w.n, false)
		if err != nil {
			return res, err
		}
		pause.Note = joinNote(targetNote(pause.Samples, w.pause), mem.Modes)
		resume.Note = joinNote(targetNote(resume.Samples, w.resume), mem.Modes)
		add(pause, resume)
		res.Mem = append(res.Mem, mem)
		if !cfg.NoBaseline {
			add(runcCheckpoint(ctx, w.name, w.rootfs, w.mib, w.n, cfg.DataDir)...)
		}
		// memory=false: the processes end and resume boots afresh. It
		// shows what a pause that really releases the sandbox returns to
		// the host, as measured here, whatever mode memory=true takes.
		pause, resume, mem, err = p.pauseResume(ctx, w.name, w.template, w.mib, w.n, true)
		if err != nil {
			return res, err
		}
		pause.Note, resume.Note = mem.Modes, joinNote("a cold boot", mem.Modes)
		add(pause, resume)
		res.Mem = append(res.Mem, mem)
	}
	if cfg.Snapshots > 0 {
		rows, err := p.captures(ctx, cfg.Snapshots, cfg.Fork10)
		if err != nil {
			return res, err
		}
		add(rows...)
	}
	return res, nil
}

type persister struct {
	cfg PersistConfig
	who apikey.Principal // APIKey's
	c   *client
}

func (p *persister) create(ctx context.Context, tpl string) (sandbox.Info, error) {
	info, err := p.cfg.Manager.Create(ctx, sandbox.CreateRequest{Template: tpl, Timeout: sandboxTimeout, Secure: true, Owner: p.who.Team})
	if err != nil {
		return info, fmt.Errorf("create %s: %w", tpl, err)
	}
	return info, nil
}

// kill is best effort, as client.kill: the measurement is over.
func (p *persister) kill(ctx context.Context, id string) {
	_ = p.cfg.Manager.Kill(context.WithoutCancel(ctx), id)
}

// sh runs cmd in the sandbox through the proxy (commands.run) and fails
// unless it exits 0.
func (p *persister) sh(ctx context.Context, info sandbox.Info, cmd string) error {
	code, err := p.c.run(ctx, p.c.c.Sandbox(info.ID, grant.Token(info.AccessToken, p.who.KeyID)), cmd)
	if err != nil {
		return fmt.Errorf("sandbox %s: %q: %w", info.ID, cmd, err)
	}
	if code != 0 {
		return fmt.Errorf("sandbox %s: %q exited %d", info.ID, cmd, code)
	}
	return nil
}

// readyFile is where the held-memory process writes its pid once every
// page is touched.
const readyFile = "/tmp/airlock-bench-hold"

// holdCommand starts a Python process in the background that allocates mib
// MiB, writes to every page of it (so the memory is resident, not merely
// reserved), writes its pid to readyFile and sleeps; the command returns once
// it is ready. Its output goes nowhere, so nothing on the host holds it.
func holdCommand(mib int) string {
	py := fmt.Sprintf("import os,time; n=%d<<20; b=bytearray(n); b[::4096]=bytes([1])*(n//4096); "+
		"open(%q,%q).write(str(os.getpid())); time.sleep(1e9)", mib, readyFile+".tmp", "w")
	return fmt.Sprintf("rm -f %[1]s %[1]s.tmp; nohup python3 -c '%[2]s' </dev/null >/dev/null 2>&1 & "+
		"for i in $(seq 1200); do [ -s %[1]s.tmp ] && mv %[1]s.tmp %[1]s && exit 0; sleep 0.05; done; exit 1", readyFile, py)
}

// aliveCommand checks that the held-memory process is still there.
const aliveCommand = "kill -0 $(cat " + readyFile + ")"

// pauseResume pauses and resumes n sandboxes of tpl, each holding mib MiB
// in a Python process (none: idle), and reads the host's memory around the
// pause; dropMemory pauses with memory=false.
func (p *persister) pauseResume(ctx context.Context, name, tpl string, mib, n int, dropMemory bool) (pause, resume Row, mem MemRow, err error) {
	if dropMemory {
		name = "memory=false, " + name
	}
	pause = Row{Name: fmt.Sprintf("pause, %s", name)}
	resume = Row{Name: fmt.Sprintf("resume, %s", name)}
	mem = MemRow{Name: name}
	modes := map[string]int{}
	var used, drop, returned, resident []int64
	for i := 0; i < n; i++ {
		before, err := settledProcessMemory()
		if err != nil {
			return pause, resume, mem, err
		}
		info, err := p.create(ctx, tpl)
		if err != nil {
			return pause, resume, mem, err
		}
		err = func() error {
			defer p.kill(ctx, info.ID)
			if mib > 0 {
				if err := p.sh(ctx, info, holdCommand(mib)); err != nil {
					return err
				}
			}
			st, err := p.cfg.Manager.Stats(ctx, info.ID)
			if err != nil {
				return err
			}
			// Cache counts too: gVisor's sentry backs the sandbox's memory
			// with a memfd, charged to the host cgroup as shmem (cache).
			holds := st.MemoryUsed + st.MemoryCache
			if mib > 0 && holds < int64(mib)<<20*9/10 {
				return fmt.Errorf("%s: the sandbox uses %d MiB, less than the %d MiB its process should hold", name, holds>>20, mib)
			}
			running, err := settledProcessMemory()
			if err != nil {
				return err
			}
			start := time.Now()
			if err := p.cfg.Manager.Pause(ctx, info.ID, sandbox.PauseOptions{DropMemory: dropMemory}); err != nil {
				return fmt.Errorf("%s: %w", pause.Name, err)
			}
			pause.Samples = append(pause.Samples, time.Since(start))
			mode, err := p.pauseMode(ctx, info.ID)
			if err != nil {
				return err
			}
			modes[mode]++
			paused, err := settledProcessMemory()
			if err != nil {
				return err
			}
			left := int64(0)
			if mode == ModeFrozen {
				pst, err := p.cfg.Manager.Stats(ctx, info.ID)
				if err != nil {
					return err
				}
				left = pst.MemoryUsed + pst.MemoryCache
			}
			used = append(used, holds)
			drop = append(drop, running-before)
			returned = append(returned, running-paused)
			resident = append(resident, left)
			if p.cfg.Progress != nil {
				fmt.Fprintf(p.cfg.Progress, "%s %d/%d: %s, used %s MiB, host drop %s MiB, returned %s MiB\n",
					name, i+1, n, mode, inMiB(holds), inMiB(running-before), inMiB(running-paused))
			}
			start = time.Now()
			if _, _, err := p.cfg.Manager.Connect(ctx, info.ID, sandboxTimeout); err != nil {
				return fmt.Errorf("%s: %w", resume.Name, err)
			}
			resume.Samples = append(resume.Samples, time.Since(start))
			// The resumed sandbox answers, and its process lived through.
			check := "true"
			if mib > 0 && !dropMemory {
				check = aliveCommand
			}
			return p.sh(ctx, info, check)
		}()
		if err != nil {
			return pause, resume, mem, err
		}
	}
	mem.N, mem.Modes = len(used), modeNote(modes, len(used))
	mem.Used, mem.HostDrop, mem.Returned, mem.Resident = median(used), median(drop), median(returned), median(resident)
	return pause, resume, mem, nil
}

// pauseMode reads what the pause of id really did: a complete checkpoint
// image in the data dir is memory on disk; else the record says whether its
// memory was kept (frozen in place, the processes still on the host) or not.
func (p *persister) pauseMode(ctx context.Context, id string) (string, error) {
	if _, err := os.Stat(layout.DataDir{Root: p.cfg.DataDir}.PausedComplete(id)); err == nil {
		return ModeDisk, nil
	}
	info, err := p.cfg.Manager.Get(ctx, id)
	if err != nil {
		return "", err
	}
	if info.State != sandbox.StatePaused {
		return "", fmt.Errorf("sandbox %s is %s after a pause", id, info.State)
	}
	if info.PausedWithMemory {
		if _, err := p.cfg.Manager.Stats(ctx, id); err != nil {
			return "", fmt.Errorf("sandbox %s: paused with memory, with no checkpoint image and no processes: %w", id, err)
		}
		return ModeFrozen, nil
	}
	return ModeFS, nil
}

// captures measures snapshots, creates from a snapshot and forks of an idle
// sandbox of the base template.
func (p *persister) captures(ctx context.Context, n, fork10 int) ([]Row, error) {
	snap := Row{Name: fmt.Sprintf("snapshot (CreateSnapshot), idle %s", p.cfg.Base)}
	fromSnap := Row{Name: "create from that snapshot"}
	fork1 := Row{Name: fmt.Sprintf("fork of 1, idle %s", p.cfg.Base)}
	forkN := Row{Name: fmt.Sprintf("fork of 10, idle %s", p.cfg.Base)}
	snapModes, fromModes, fork1Modes, forkNModes := map[string]int{}, map[string]int{}, map[string]int{}, map[string]int{}
	orig, err := p.create(ctx, p.cfg.Base)
	if err != nil {
		return nil, err
	}
	defer p.kill(ctx, orig.ID)
	// A started sandbox, not one still settling, is what a user snapshots.
	if err := p.sh(ctx, orig, "true"); err != nil {
		return nil, err
	}
	for i := 0; i < n; i++ {
		start := time.Now()
		s, err := p.cfg.Manager.CreateSnapshot(ctx, orig.ID, sandbox.SnapshotRequest{})
		if err != nil {
			return nil, fmt.Errorf("snapshot: %w", err)
		}
		snap.Samples = append(snap.Samples, time.Since(start))
		snapModes[p.snapshotMode(s)]++
		start = time.Now()
		info, err := p.create(ctx, s.ID)
		if err != nil {
			_ = p.cfg.Manager.DeleteSnapshot(context.WithoutCancel(ctx), s.ID, "")
			return nil, fmt.Errorf("create from snapshot: %w", err)
		}
		fromSnap.Samples = append(fromSnap.Samples, time.Since(start))
		fromModes[startedMode(orig, info)]++
		err = p.sh(ctx, info, "true")
		p.kill(ctx, info.ID)
		if derr := p.cfg.Manager.DeleteSnapshot(context.WithoutCancel(ctx), s.ID, ""); derr != nil && err == nil {
			err = derr
		}
		if err != nil {
			return nil, err
		}
	}
	fork := func(r *Row, modes map[string]int, count int) error {
		start := time.Now()
		out, err := p.cfg.Manager.Fork(ctx, orig.ID, sandbox.ForkRequest{Count: count, Timeout: sandboxTimeout})
		d := time.Since(start)
		var errs []error
		for _, f := range out {
			if f.Err != nil {
				errs = append(errs, f.Err)
				continue
			}
			modes[startedMode(orig, f.Info)]++
			if err := p.sh(ctx, f.Info, "true"); err != nil {
				errs = append(errs, err)
			}
			p.kill(ctx, f.Info.ID)
		}
		if err := errors.Join(append([]error{err}, errs...)...); err != nil {
			return fmt.Errorf("fork of %d: %w", count, err)
		}
		r.Samples = append(r.Samples, d)
		return nil
	}
	for i := 0; i < n; i++ {
		if err := fork(&fork1, fork1Modes, 1); err != nil {
			return nil, err
		}
	}
	for i := 0; i < fork10; i++ {
		if err := fork(&forkN, forkNModes, 10); err != nil {
			return nil, err
		}
	}
	snap.Note = modeNote(snapModes, len(snap.Samples))
	fromSnap.Note = modeNote(fromModes, len(fromSnap.Samples))
	fork1.Note = joinNote(targetNote(fork1.Samples, targetFork1), modeNote(fork1Modes, len(fork1.Samples)))
	rows := []Row{snap, fromSnap, fork1}
	if fork10 > 0 {
		forkN.Note = joinNote(targetNote(forkN.Samples, targetFork10), modeNote(forkNModes, len(forkN.Samples)*10))
		rows = append(rows, forkN)
	}
	return rows, nil
}

// snapshotMode reads whether snapshot s holds the processes (a CRIU or
// runsc image under memory/) or only the filesystem.
func (p *persister) snapshotMode(s sandbox.Snapshot) string {
	raw := strings.TrimSuffix(s.ID, ":default")
	img := filepath.Join(layout.DataDir{Root: p.cfg.DataDir}.Sandboxes(), ".snapshots", raw, "memory")
	if entries, err := os.ReadDir(img); err == nil && len(entries) > 0 {
		return "with memory"
	}
	return ModeFS
}

// startedMode says how a sandbox started from a capture of orig came up: a
// restored envd keeps the access token it was captured with, a cold boot
// takes a new one (docs/ARCHITECTURE.md, fork and snapshot).
func startedMode(orig, started sandbox.Info) string {
	if started.AccessToken == orig.AccessToken {
		return ModeRestored
	}
	return ModeColdBoot
}

// runcCheckpoint is the baseline: `runc checkpoint` and `runc restore` (the
// same CRIU the linux runtime uses) of a container on the same root
// filesystem running the same workload: the Python process holding mib MiB,
// or, for the idle row, a shell asleep. The image goes under the data dir,
// on the filesystem the sandboxes' images go to.
func runcCheckpoint(ctx context.Context, name, rootfs string, mib, n int, dataDir string) []Row {
	ck := Row{Name: fmt.Sprintf("baseline: runc checkpoint, %s", name)}
	rs := Row{Name: fmt.Sprintf("baseline: runc restore, %s", name)}
	fail := func(note string) []Row {
		ck.Note, rs.Note = note, note
		return []Row{ck, rs}
	}
	runc, err := exec.LookPath("runc")
	if err != nil {
		return fail("runc not installed")
	}
	criu, err := exec.LookPath("criu")
	if err != nil {
		return fail("criu not installed")
	}
	bundle, err := os.MkdirTemp(dataDir, ".bench-runc-")
	if err != nil {
		return fail(err.Error())
	}
	defer os.RemoveAll(bundle)
	args := []string{"/bin/sh", "-c", "exec sleep 1000000 </dev/null >/dev/null 2>&1"}
	if mib > 0 {
		// The same allocation as holdCommand; its stdio is the container's
		// own /dev/null, since CRIU cannot save a host file.
		args = []string{"/bin/sh", "-c", fmt.Sprintf("exec python3 -c 'import time; n=%d<<20; b=bytearray(n); b[::4096]=bytes([1])*(n//4096); time.sleep(1e9)' </dev/null >/dev/null 2>&1", mib)}
	}
	if err := writeRuncSpec(ctx, runc, bundle, rootfs, args); err != nil {
		return fail(err.Error())
	}
	img := filepath.Join(bundle, "image")
	run := func(args ...string) error {
		out, err := exec.CommandContext(ctx, runc, append([]string{"--criu", criu}, args...)...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("runc %s: %w: %s", args[0], err, bytes.TrimSpace(out))
		}
		return nil
	}
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("airlock-bench-ckpt-%d-%d", os.Getpid(), i)
		err := func() error {
			defer func() { _ = exec.Command(runc, "delete", "--force", id).Run() }()
			if err := setRuncCgroup(bundle, id); err != nil {
				return err
			}
			if err := run("run", "--detach", "--bundle", bundle, id); err != nil {
				return err
			}
			if err := waitCgroupMemory(ctx, id, int64(mib)<<20*9/10); err != nil {
				return err
			}
			if err := os.RemoveAll(img); err != nil {
				return err
			}
			start := time.Now()
			if err := run("checkpoint", "--image-path", img, id); err != nil {
				return err
			}
			ck.Samples = append(ck.Samples, time.Since(start))
			start = time.Now()
			if err := run("restore", "--detach", "--image-path", img, "--bundle", bundle, id); err != nil {
				return err
			}
			rs.Samples = append(rs.Samples, time.Since(start))
			return nil
		}()
		if err != nil {
			return fail(err.Error())
		}
	}
	return []Row{ck, rs}
}

// writeRuncSpec writes a bundle's config.json: runc's default spec on rootfs
// (read-only), running args with no terminal.
func writeRuncSpec(ctx context.Context, runc, bundle, rootfs string, args []string) error {
	if out, err := exec.CommandContext(ctx, runc, "spec", "--bundle", bundle).CombinedOutput(); err != nil {
		return fmt.Errorf("runc spec: %w: %s", err, out)
	}
	return editRuncSpec(bundle, func(spec map[string]any) {
		spec["root"] = map[string]any{"path": rootfs, "readonly": true}
		proc := spec["process"].(map[string]any)
		proc["terminal"] = false
		proc["args"] = args
	})
}

// setRuncCgroup puts container id's cgroup under Airlock's own parent, like
// the sandboxes' (and runcRun's).
func setRuncCgroup(bundle, id string) error {
	return editRuncSpec(bundle, func(spec map[string]any) {
		spec["linux"].(map[string]any)["cgroupsPath"] = "/airlock/" + id
	})
}

// waitCgroupMemory waits until container id's cgroup holds at least want
// bytes (its process touched its pages), for a minute at most.
func waitCgroupMemory(ctx context.Context, id string, want int64) error {
	paths := []string{
		filepath.Join("/sys/fs/cgroup/memory/airlock", id, "memory.usage_in_bytes"), // cgroup v1
		filepath.Join("/sys/fs/cgroup/airlock", id, "memory.current"),               // v2
	}
	deadline := time.Now().Add(time.Minute)
	for {
		var got int64 = -1
		for _, p := range paths {
			if b, err := os.ReadFile(p); err == nil {
				got, _ = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
				break
			}
		}
		if got >= want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("container %s holds %d bytes after a minute, want %d", id, got, want)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// noiseFloor is the least use whose release the host's process memory can
// show on a shared host: other processes move it by MiBs within a second.
const noiseFloor = 64 << 20

// PrintPersist writes the timing table (Print's) and the memory table.
func PrintPersist(w io.Writer, res PersistResult) {
	Print(w, res.Rows)
	if len(res.Mem) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "memory per paused sandbox (medians)\tn\tused MiB\thost drop MiB\treturned MiB\tresident paused MiB\treleased\t")
	for _, r := range res.Mem {
		if r.Used == 0 {
			fmt.Fprintf(tw, "%s\t%d\t-\t-\t%s\t-\t-\t  %s\n", r.Name, r.N, inMiB(r.Returned), r.Modes)
			continue
		}
		verdict := "met"
		switch {
		case r.Used < noiseFloor:
			verdict = "n/a, use below the host's noise"
		case r.Released() < targetReleasedPct:
			verdict = "MISSED"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%.0f%%\t  target ≥ %d%%: %s; %s\n", r.Name, r.N,
			inMiB(r.Used), inMiB(r.HostDrop), inMiB(r.Returned), inMiB(r.Resident), r.Released(), targetReleasedPct, verdict, r.Modes)
	}
	tw.Flush()
	fmt.Fprintln(w, "\nused: the sandbox's cgroup (page cache included), just before the pause; host drop: how much the host's")
	fmt.Fprintln(w, "process memory (AnonPages + Shmem: gVisor keeps a sandbox's memory in a memfd) grew from before the create")
	fmt.Fprintln(w, "to just before the pause; returned: how much it shrank over the pause; resident paused: what the sandbox's")
	fmt.Fprintln(w, "cgroup still holds once paused; released: returned/used. Other processes move the host's figure too, which")
	fmt.Fprintln(w, "outweighs an idle sandbox's own use: read the idle row's released figure as noise.")
}

// editRuncSpec rewrites a bundle's config.json through edit.
func editRuncSpec(bundle string, edit func(spec map[string]any)) error {
	path := filepath.Join(bundle, "config.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("runc spec: %w", err)
	}
	var spec map[string]any
	if err := json.Unmarshal(raw, &spec); err != nil {
		return fmt.Errorf("runc spec: %w", err)
	}
	edit(spec)
	if raw, err = json.Marshal(spec); err != nil {
		return fmt.Errorf("runc spec: %w", err)
	}
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		return fmt.Errorf("runc spec: %w", err)
	}
	return nil
}

// joinNote joins the non-empty parts of a row's note.
func joinNote(parts ...string) string {
	var out []string
	for _, p := range parts {
		if p != "" {
			out = append(out, p)
		}
	}
	return strings.Join(out, "; ")
}

func inMiB(b int64) string { return fmt.Sprintf("%.1f", float64(b)/(1<<20)) }

// targetNote says how a series' p50 stands against its target ("" when none).
func targetNote(s []time.Duration, target time.Duration) string {
	if target <= 0 || len(s) == 0 {
		return ""
	}
	sorted := append([]time.Duration(nil), s...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	verdict := "met"
	if Percentile(sorted, 50) > target {
		verdict = "MISSED"
	}
	return fmt.Sprintf("target p50 ≤ %s: %s", target, verdict)
}

// modeNote lists the modes seen, most frequent first: "frozen in place 5/5".
func modeNote(modes map[string]int, n int) string {
	names := make([]string, 0, len(modes))
	for m := range modes {
		names = append(names, m)
	}
	sort.Slice(names, func(i, j int) bool { return modes[names[i]] > modes[names[j]] })
	parts := make([]string, len(names))
	for i, m := range names {
		parts[i] = fmt.Sprintf("%s %d/%d", m, modes[m], n)
	}
	return "mode: " + strings.Join(parts, ", ")
}

func median(v []int64) int64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]int64(nil), v...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// hostNoise is the memory table's baseline: how far the host's process
// memory moves over a window like a pause's when nothing is paused (the
// median of n windows' absolute change), the error bar of every "returned"
// figure.
func hostNoise(n int) (MemRow, error) {
	r := MemRow{Name: "baseline: host noise, nothing paused", N: n, Modes: "|process memory change| over 0.5 s"}
	var d []int64
	for i := 0; i < n; i++ {
		a, err := settledProcessMemory()
		if err != nil {
			return r, err
		}
		b, err := settledProcessMemory()
		if err != nil {
			return r, err
		}
		d = append(d, max(b-a, a-b))
	}
	r.Returned = median(d)
	return r, nil
}

// settledProcessMemory is the median of a few readings of processMemory
// over a quarter of a second: a killed process's pages are freed as it
// exits, which the runtime waits for, but a cgroup or a netns may go in the
// background, and one reading catches any other process's passing peak.
func settledProcessMemory() (int64, error) {
	var v []int64
	for i := 0; i < 5; i++ {
		if i > 0 {
			time.Sleep(50 * time.Millisecond)
		}
		m, err := processMemory()
		if err != nil {
			return 0, err
		}
		v = append(v, m)
	}
	return median(v), nil
}

// processMemory is the host's memory in processes' pages, in bytes:
// AnonPages plus Shmem (gVisor's sentry keeps a sandbox's memory in a
// memfd). MemAvailable counts page cache too, which a pause writing its
// image fills; and on the project machine (a VM) MemFree and MemAvailable
// drifted by 200-400 MiB across a few 1 GiB allocations and frees while
// AnonPages came back to within a few MiB (cause not pinned down). The kernel
// folds each CPU's page counts into the totals /proc/meminfo reads only
// every vm.stat_interval (a second), so a reading just after a pause would
// miss what it freed; a write to /proc/sys/vm/stat_refresh folds them now
// (root only: without it the reading is merely older).
func processMemory() (int64, error) {
	_ = os.WriteFile("/proc/sys/vm/stat_refresh", []byte("1"), 0)
	anon, err := sandbox.HostMeminfo("AnonPages")
	if err != nil {
		return 0, err
	}
	shmem, err := sandbox.HostMeminfo("Shmem")
	if err != nil {
		return 0, err
	}
	return anon + shmem, nil
}
