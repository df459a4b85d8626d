package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// builderVersion is part of every layer key. Bump it when the builder starts producing
// different bytes from the same inputs (new debootstrap flags, new mount points), so
// cached layers are rebuilt instead of silently reused.
const builderVersion = 2

// layerStore keeps the layers of every template under <data>/layers:
//
//	<key>/rootfs       the layer's complete root filesystem
//	<key>/layer.json   what made it (layerMeta); written last, so its presence means complete
//	.tmp-<key>-*/      a layer being made; renamed to <key> when complete
//	.lock              flock: shared while a build runs, exclusive to collect garbage
//
// A layer's rootfs is self-contained: it is a hard-link clone of its parent's rootfs
// with the step's changes applied, so a template needs only its top layer, deleting a
// parent never breaks a child, and unchanged files cost an inode, not their bytes.
type layerStore struct {
	dir string
}

// layerMeta is layer.json.
type layerMeta struct {
	Key    string `json:"key"`
	Parent string `json:"parent,omitempty"`
	// Kind is "debootstrap", "oci", "run", "copy" or "workdir".
	Kind string `json:"kind"`
	// Text is the instruction (or source) that made the layer, for inspect.
	Text         string    `json:"text"`
	CreatedAt    time.Time `json:"createdAt"`
	BuildSeconds float64   `json:"buildSeconds"`
	// DiffBytes is the allocated size of what the layer added or changed.
	DiffBytes int64 `json:"diffBytes"`
}

// layerKey hashes the inputs of a layer: its parent and a canonical description of
// what it does (step text, config in effect, digests of the files it copies).
func layerKey(parts ...string) string {
	h := sha256.New()
	fmt.Fprintf(h, "airlock-layer/%d\n", builderVersion)
	for _, p := range parts {
		fmt.Fprintf(h, "%d:%s\n", len(p), p)
	}
	return hex.EncodeToString(h.Sum(nil)[:12])
}

func (l *layerStore) rootfs(key string) string { return filepath.Join(l.dir, key, "rootfs") }

// get returns a complete layer's metadata.
func (l *layerStore) get(key string) (layerMeta, bool) {
	data, err := os.ReadFile(filepath.Join(l.dir, key, "layer.json"))
	if err != nil {
		return layerMeta{}, false
	}
	var m layerMeta
	if json.Unmarshal(data, &m) != nil || m.Key != key {
		return layerMeta{}, false
	}
	return m, true
}

// create makes layer key with fill, which must leave a root filesystem at
// <tmp>/rootfs and may return the size of its diff. The layer appears under its key
// only once complete; a failed or cancelled fill leaves nothing. When another
// process made the same layer meanwhile, theirs is kept (same inputs, same bytes).
func (l *layerStore) create(ctx context.Context, meta layerMeta, fill func(tmp string) (diffBytes int64, err error)) (layerMeta, error) {
	if err := os.MkdirAll(l.dir, 0o755); err != nil {
		return layerMeta{}, err
	}
	tmp, err := os.MkdirTemp(l.dir, ".tmp-"+meta.Key+"-")
	if err != nil {
		return layerMeta{}, err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return layerMeta{}, err
	}
	start := time.Now()
	commit := func() error {
		diff, err := fill(tmp)
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if _, err := os.Stat(filepath.Join(tmp, "rootfs")); err != nil {
			return fmt.Errorf("layer %s: no root filesystem made: %w", meta.Key, err)
		}
		meta.CreatedAt = time.Now().UTC()
		meta.BuildSeconds = time.Since(start).Seconds()
		meta.DiffBytes = diff
		data, err := json.MarshalIndent(meta, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(tmp, "layer.json"), append(data, '\n'), 0o644); err != nil {
			return err
		}
		// The rename is the commit point; the files must be on disk before it, or a
		// crash could leave a "complete" layer with empty files.
		if err := syncFS(tmp); err != nil {
			return err
		}
		final := filepath.Join(l.dir, meta.Key)
		if err := os.Rename(tmp, final); err != nil {
			if _, ok := l.get(meta.Key); ok {
				return errLayerExists
			}
			return fmt.Errorf("move layer into place: %w", err)
		}
		return syncDir(l.dir)
	}
	err = commit()
	if err == nil {
		return meta, nil
	}
	if rerr := removeTree(tmp, true); rerr != nil {
		err = errors.Join(err, fmt.Errorf("clean up unfinished layer: %w", rerr))
	}
	if errors.Is(err, errLayerExists) {
		if m, ok := l.get(meta.Key); ok {
			return m, nil
		}
	}
	return layerMeta{}, err
}

var errLayerExists = errors.New("layer made by another build meanwhile")

// lock takes the layer store's flock: shared for a build (many may run), exclusive
// for garbage collection, which must not delete a layer a running build has just
// made and not yet recorded in a template. Exclusive never waits: collection is
// skipped while anything builds. A shared lock that is busy (a collection running
// in another process) is polled, so the wait can be cancelled and reported: wait,
// if not nil, is called once with the lock file's path and its result when the lock is taken.
func (l *layerStore) lock(ctx context.Context, exclusive bool, wait func(path string) (done func())) (unlock func(), ok bool, err error) {
	if err := os.MkdirAll(l.dir, 0o755); err != nil {
		return nil, false, err
	}
	path := filepath.Join(l.dir, ".lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, false, fmt.Errorf("open layer lock: %w", err)
	}
	how := unix.LOCK_SH | unix.LOCK_NB
	if exclusive {
		how = unix.LOCK_EX | unix.LOCK_NB
	}
	var done func()
	defer func() {
		if done != nil {
			done()
		}
	}()
	for {
		err = unix.Flock(int(f.Fd()), how)
		if err == nil {
			return func() { _ = unix.Flock(int(f.Fd()), unix.LOCK_UN); f.Close() }, true, nil
		}
		if exclusive && errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, false, nil
		}
		if !errors.Is(err, unix.EINTR) && !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, false, fmt.Errorf("lock layers: %w", err)
		}
		if errors.Is(err, unix.EWOULDBLOCK) {
			if done == nil && wait != nil {
				done = wait(path)
			}
			select {
			case <-ctx.Done():
				f.Close()
				return nil, false, fmt.Errorf("waiting for the layer lock %s: %w", path, ctx.Err())
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

// collect deletes layers no template needs (keep) and no mount uses, and leftovers
// of builds that died. It needs the exclusive lock and skips quietly without it.
func (l *layerStore) collect(keep map[string]bool) (removed int, err error) {
	unlock, ok, err := l.lock(context.Background(), true, nil)
	if err != nil || !ok {
		return 0, err
	}
	defer unlock()
	entries, err := os.ReadDir(l.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if !e.IsDir() || keep[name] {
			continue
		}
		dir := filepath.Join(l.dir, name)
		if used, err := mountedFrom(dir); err != nil || used {
			continue
		}
		if strings.HasPrefix(name, ".") {
			// Nothing builds (we hold the exclusive lock): a .tmp- dir is a dead build's.
			if strings.HasPrefix(name, ".tmp-") || strings.HasPrefix(name, ".old-") {
				if err := removeTree(dir, true); err != nil {
					errs = append(errs, err)
				}
			}
			continue
		}
		if err := discard(l.dir, name); err != nil {
			errs = append(errs, err)
			continue
		}
		removed++
	}
	return removed, errors.Join(errs...)
}

// usage is the allocated size of every layer together, each inode counted once:
// what the layer cache really costs on disk.
func (l *layerStore) usage() (int64, error) {
	if _, err := os.Stat(l.dir); errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	return diskUsage(l.dir)
}
