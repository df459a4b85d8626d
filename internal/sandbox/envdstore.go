package sandbox

// The envd binary a sandbox runs is part of its checkpoints: CRIU records the
// build ID of every file a process maps and refuses to restore when the file
// at that path changed, and gVisor's restored sentry holds the old binary's
// pages too. So a checkpoint taken before an Airlock upgrade must be restored
// with the envd it was taken with, not Options.EnvdPath as it is now.
//
// Every boot binds a copy of the envd it was given from <data>/envd/<digest>
// (layout.DataDir.Envd): written once per distinct binary, named by its
// content and never changed after, so the copy stays what the sandbox mapped
// whatever happens to Options.EnvdPath. The boot record (boot.json, which
// captures and pauses keep with the writable layer) names the digest; a
// restore binds that one, a cold boot the current one. Recover removes the
// copies no boot record names any more.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"github.com/airlock-sandbox/airlock/internal/store"
)

// envdStore is the current envd's digest, stored on first use.
type envdStore struct {
	once sync.Once
	name string
	err  error
}

// currentEnvd returns the digest name of Options.EnvdPath, storing a copy of
// it under layout.DataDir.Envd the first time.
func (m *Manager) currentEnvd() (string, error) {
	m.envd.once.Do(func() {
		m.envd.name, m.envd.err = storeByDigest(m.opts.EnvdPath, m.layout().Envd())
		if m.envd.err != nil {
			m.envd.err = fmt.Errorf("envd binary %s: %w", m.opts.EnvdPath, m.envd.err)
		}
	})
	return m.envd.name, m.envd.err
}

// envdPath is the stored copy of the envd binary with digest name.
func (m *Manager) envdPath(name string) string { return filepath.Join(m.layout().Envd(), name) }

// envdForBoot returns the digest of the envd a boot binds: the one the
// checkpoint was taken with (recorded) when restoring one, else the current.
// A restore whose envd copy is gone fails, rather than mapping another binary
// into the restored processes. A record from before envd copies were kept
// names none: its checkpoint gets the current binary, as it always did.
func (m *Manager) envdForBoot(mode bootMode) (string, error) {
	if mode.image != "" && mode.envd != "" {
		if _, err := os.Stat(m.envdPath(mode.envd)); err != nil {
			return "", fmt.Errorf("the envd binary the checkpoint was taken with: %w", err)
		}
		return mode.envd, nil
	}
	return m.currentEnvd()
}

// storeByDigest copies src into dir as a file named by a digest of its
// content, unless one is there, and returns that name. The copy is synced
// and renamed into place, so a name present is a whole copy.
func storeByDigest(src, dir string) (string, error) {
	f, err := os.Open(src)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	name := hex.EncodeToString(h.Sum(nil))[:32]
	dst := filepath.Join(dir, name)
	if _, err := os.Stat(dst); err == nil {
		return name, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(dir, ".tmp-")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	_, err = io.Copy(tmp, f)
	if err == nil {
		err = tmp.Chmod(0o755)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), dst)
	}
	if err != nil {
		return "", err
	}
	return name, syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// sweepEnvd removes the stored envd copies that neither the current binary
// nor the boot record of any sandbox or snapshot names, and temporary files
// an interrupted store left. Recover calls it last, once the sandboxes and
// snapshots that are kept are known. A record it cannot read may name any
// copy, so then it removes none.
func (m *Manager) sweepEnvd(ctx context.Context) {
	current, err := m.currentEnvd()
	if err != nil {
		m.log.Warn("envd store: sweep skipped", "err", err)
		return
	}
	keep := map[string]bool{current: true}
	var recordDirs []string
	m.mu.Lock()
	for _, e := range m.sandboxes {
		recordDirs = append(recordDirs, e.dir)
	}
	m.mu.Unlock()
	snaps, err := m.opts.Store.ListSnapshots(ctx, store.SnapshotFilter{})
	if err != nil {
		m.log.Warn("envd store: sweep skipped", "err", err)
		return
	}
	for _, s := range snaps {
		recordDirs = append(recordDirs, filepath.Join(m.snapshotsDir(), s.ID, captureFS))
	}
	for _, dir := range recordDirs {
		rec, err := readBootRecord(dir)
		if err != nil {
			m.log.Warn("envd store: sweep skipped", "err", err, "dir", dir)
			return
		}
		keep[rec.Envd] = true
	}
	stored, _ := os.ReadDir(m.layout().Envd())
	for _, f := range stored {
		if !keep[f.Name()] {
			if err := os.Remove(filepath.Join(m.layout().Envd(), f.Name())); err != nil {
				m.log.Warn("envd store: remove an unused copy", "err", err, "name", f.Name())
			}
		}
	}
}
