package sandbox

// Volumes (internal/volume): storage that outlives sandboxes. A sandbox
// mounts the volumes its create names (CreateRequest.VolumeMounts), each
// read-write at its path, through an idmapped bind (runtime.Mount.IDMapped:
// a volume's files carry the ids sandboxes see, so every sandbox of any key
// sees the same owners). The mounts are part of the sandbox's Info and
// record: every boot of it (create, resume, a fork's or a snapshot's start)
// finds each volume again by its ID, so pause/resume, snapshots and forks
// keep them; a fork mounts the same volumes, never a copy.
//
// A volume is leased (Volumes.Acquire) from the moment a create or a start
// resolves it until the sandbox is published, after which SandboxesMounting
// lists the sandbox: at no moment can a destroy without force take a volume
// that a sandbox is about to mount or mounts.

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/envdapi"
	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/volume"
)

// Volumes is what the manager needs of the volume service.
type Volumes interface {
	// Acquire finds owner's volume by name or ID and holds it against a
	// destroy until release is called; volume.ErrNotFound if there is none.
	Acquire(ctx context.Context, owner, ref string) (v volume.Volume, release func(), err error)
}

// VolumeMount is a volume mounted in a sandbox: its ID (by which every boot
// finds it again; empty in a CreateRequest, which names volumes by Name),
// its Name, and the Path where the sandbox sees it (absolute and clean).
// The record keeps it as it is.
type VolumeMount = store.VolumeMount

// reservedPaths are the sandbox's own mounts and kernel filesystems, which a
// volume must not cover (nor sit inside).
var reservedPaths = []string{"/proc", "/sys", "/dev", envdapi.RunDir, envdapi.BinaryPath, envdapi.MCPGatewayPath, "/usr/bin/sudo", "/etc/resolv.conf", "/etc/hosts"}

// checkMountPath says what is wrong with p as a volume's mount path, or "".
func checkMountPath(p string) string {
	switch {
	case p == "":
		return "path cannot be empty"
	case !path.IsAbs(p):
		return "path must be absolute"
	case path.Clean(p) != p:
		return "path must not contain any '.' or '..' components (or a trailing '/')"
	case p == "/":
		return "path cannot be '/'"
	case strings.ContainsAny(p, ",:\x00"):
		return "path must not contain ',', ':' or NUL"
	}
	for _, r := range reservedPaths {
		if p == r || strings.HasPrefix(p, r+"/") {
			return fmt.Sprintf("path %s is the sandbox's own (%s)", p, r)
		}
	}
	return ""
}

// leaseVolumes resolves a create's volume mounts for owner: it checks every
// path, finds every volume and leases it. The error lists every mount that
// is wrong, as E2B's does ("invalid mounts: ... volume mount #i: reason").
// release ends the leases (call it once the sandbox is published, or on
// failure).
func (m *Manager) leaseVolumes(ctx context.Context, owner string, req []VolumeMount) (out []VolumeMount, release func(), err error) {
	var releases []func()
	release = func() {
		for _, r := range releases {
			r()
		}
	}
	if len(req) == 0 {
		return nil, release, nil
	}
	if m.opts.Volumes == nil {
		return nil, release, fmt.Errorf("%w: volume mounts need volumes, which are off on this server (no disk pool)", ErrInvalid)
	}
	var bad []string
	used := map[string]bool{}
	for i, vm := range req {
		ref := vm.ID
		if ref == "" {
			ref = vm.Name
		}
		if why := checkMountPath(vm.Path); why != "" {
			bad = append(bad, fmt.Sprintf("\t- volume mount #%d: %s", i, why))
			continue
		}
		if used[vm.Path] {
			bad = append(bad, fmt.Sprintf("\t- volume mount #%d: path '%s' is already used", i, vm.Path))
			continue
		}
		used[vm.Path] = true
		v, rel, err := m.opts.Volumes.Acquire(ctx, owner, ref)
		switch {
		case errors.Is(err, volume.ErrNotFound):
			bad = append(bad, fmt.Sprintf("\t- volume mount #%d: volume '%s' not found", i, ref))
			continue
		case err != nil:
			release()
			return nil, func() {}, fmt.Errorf("volume mount #%d: %w", i, err)
		}
		releases = append(releases, rel)
		out = append(out, VolumeMount{ID: v.ID, Name: v.Name, Path: vm.Path})
	}
	if len(bad) > 0 {
		release()
		return nil, func() {}, fmt.Errorf("%w: invalid mounts:\n%s", ErrInvalid, strings.Join(bad, "\n"))
	}
	return out, release, nil
}

// volumeRuntimeMounts are the runtime mounts of e's volumes, each found again
// by its ID (a boot of a sandbox created earlier: a resume, a fork's start).
// A volume destroyed since (with force) fails the boot, saying which.
func (m *Manager) volumeRuntimeMounts(ctx context.Context, info Info) ([]runtime.Mount, error) {
	if len(info.VolumeMounts) == 0 {
		return nil, nil
	}
	if m.opts.Volumes == nil {
		return nil, fmt.Errorf("%w: sandbox %s mounts volumes, which are off on this server (no disk pool)", ErrInvalid, info.ID)
	}
	out := make([]runtime.Mount, 0, len(info.VolumeMounts))
	for _, vm := range info.VolumeMounts {
		v, release, err := m.opts.Volumes.Acquire(ctx, info.Owner, vm.ID)
		if err != nil {
			if errors.Is(err, volume.ErrNotFound) {
				return nil, fmt.Errorf("%w: volume %q (%s), mounted at %s, no longer exists", ErrInvalid, vm.Name, vm.ID, vm.Path)
			}
			return nil, fmt.Errorf("volume %q: %w", vm.Name, err)
		}
		// The sandbox holds it from here through SandboxesMounting: it is
		// in the manager's map (a resume), or its start holds a lease until
		// it is (leaseVolumes).
		release()
		out = append(out, runtime.Mount{Source: v.Path, Target: vm.Path, IDMapped: true})
	}
	return out, nil
}

// SandboxesMounting implements volume.MountChecker: the sandboxes, running
// or paused (a resume mounts it again), that mount volume id.
func (m *Manager) SandboxesMounting(volumeID string) []string {
	m.mu.Lock()
	entries := make([]*entry, 0, len(m.sandboxes))
	for _, e := range m.sandboxes {
		entries = append(entries, e)
	}
	m.mu.Unlock()
	var out []string
	for _, e := range entries {
		e.mu.Lock()
		for _, vm := range e.info.VolumeMounts {
			if vm.ID == volumeID {
				out = append(out, e.id)
				break
			}
		}
		e.mu.Unlock()
	}
	return out
}

var _ volume.MountChecker = (*Manager)(nil)
