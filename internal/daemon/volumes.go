package daemon

import (
	"context"
	"fmt"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/volume"
)

// VolumeConfig bounds volumes (serve --volume-*). Sizes are in MiB; zero
// DefaultMB and MaxMB take volume's defaults, zero per-key limits mean no
// limit.
type VolumeConfig struct {
	DefaultMB, MaxMB int64
	PerKey           int
	SizePerKeyMB     int64
}

// startVolumes starts the volume service on the disk pool and lets it finish
// or undo what a crash interrupted. Without a pool there are no volumes (the
// API answers 501): a volume's quota is a qgroup of the pool.
func (d *Daemon) startVolumes(ctx context.Context) error {
	if d.Disk == nil {
		d.log.Info("volumes are off: they need the disk pool (--disk-quota)")
		return nil
	}
	c := d.cfg.Volumes
	lim := store.VolumeLimits{MaxCount: c.PerKey, MaxBytes: c.SizePerKeyMB << 20}
	if lim.MaxCount == 0 {
		lim.MaxCount = -1 // volume.Options reads 0 as its default, serve's flags as no limit
	}
	if lim.MaxBytes == 0 {
		lim.MaxBytes = -1
	}
	svc, err := volume.New(volume.Options{
		Pool: d.Disk, Store: d.Store, Logger: d.log,
		DefaultSize: c.DefaultMB << 20, MaxSize: c.MaxMB << 20, PerOwner: lim,
		SpaceFor: func(owner string) int64 { return int64(d.Keys.Quotas(owner).VolumesMB) << 20 },
	})
	if err != nil {
		return fmt.Errorf("volumes: %w", err)
	}
	if err := svc.Recover(ctx); err != nil {
		return err
	}
	d.Volumes = svc
	d.push("volumes", svc.Close)
	return nil
}

// checkVolumeMounts lets a destroy ask the manager which sandboxes mount a
// volume. The manager needs the volume service (to mount) and the service
// the manager (to refuse destroying what is mounted), so this is set once
// both exist, before the API listener serves a destroy.
func (d *Daemon) checkVolumeMounts() {
	if d.Volumes != nil {
		d.Volumes.SetMountChecker(d.Manager)
	}
}

// managerVolumes is what the manager mounts volumes from: nil (not a typed
// nil) without the volume service.
func (d *Daemon) managerVolumes() sandbox.Volumes {
	if d.Volumes == nil {
		return nil
	}
	return d.Volumes
}
