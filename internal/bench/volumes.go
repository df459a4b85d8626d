package bench

// `airlock bench volumes`: what a volume costs next to the sandbox's own
// root filesystem, measured in one sandbox that mounts a volume: sequential
// write and read throughput and the rate of small-file creates, on the
// volume and on the root filesystem, interleaved round by round so both see
// the same machine. Both sit on the same btrfs pool (the root filesystem's
// writes through overlayfs into the sandbox's subvolume, the volume's
// through an idmapped bind of its own subvolume); the target is a
// volume within 80% of the root filesystem.

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/airlock-sandbox/airlock/internal/e2bwire"
)

// VolumesConfig says what to measure.
type VolumesConfig struct {
	Config
	// Volume is the name of a volume of APIKey's, mounted at MountPath.
	Volume string
	// MiB is the size of each sequential write and read, Files how many
	// small files each create round makes, Rounds how many rounds of each.
	MiB, Files, Rounds int
}

// volumeMountPath is where the bench's sandbox mounts the volume; rootfsDir
// is the root filesystem's directory it writes beside it.
const (
	volumeMountPath = "/bench-volume"
	rootfsDir       = "/home/user/bench-rootfs"
)

// RunVolumes measures; its rows come in pairs (volume, root filesystem),
// the volume's note saying how it compares.
func RunVolumes(ctx context.Context, cfg VolumesConfig) ([]Row, error) {
	c := newClient(cfg.Config)
	timeout := int64(3600)
	sb, err := c.c.Create(ctx, e2bwire.NewSandbox{
		TemplateID: cfg.Template, Timeout: &timeout,
		VolumeMounts: []e2bwire.SandboxVolumeMount{{Name: cfg.Volume, Path: volumeMountPath}},
	})
	if err != nil {
		return nil, fmt.Errorf("create with volume %s: %w", cfg.Volume, err)
	}
	s := c.c.Sandbox(sb.SandboxID, sb.EnvdAccessToken)
	defer c.kill(context.WithoutCancel(ctx), s)
	if code, err := c.run(ctx, s, "mkdir -p "+rootfsDir); err != nil || code != 0 {
		return nil, fmt.Errorf("prepare: exit %d: %w", code, err)
	}
	type probe struct {
		name string
		cmd  func(dir string) string
	}
	// conv=fsync and iflag=direct: the rows measure the disk path, not the
	// page cache (a read right after a write would otherwise come from RAM).
	probes := []probe{
		{fmt.Sprintf("sequential write %d MiB", cfg.MiB), func(dir string) string {
			return fmt.Sprintf("dd if=/dev/zero of=%s/seq bs=1M count=%d conv=fsync status=none", dir, cfg.MiB)
		}},
		{fmt.Sprintf("sequential read %d MiB", cfg.MiB), func(dir string) string {
			return fmt.Sprintf("dd if=%s/seq of=/dev/null bs=1M iflag=direct status=none", dir)
		}},
		{fmt.Sprintf("create %d small files", cfg.Files), func(dir string) string {
			return fmt.Sprintf("rm -rf %[1]s/small && mkdir %[1]s/small && for i in $(seq 1 %[2]d); do echo x > %[1]s/small/f$i; done && sync -f %[1]s/small", dir, cfg.Files)
		}},
	}
	var rows []Row
	for _, p := range probes {
		onVolume, onRootfs := Row{Name: p.name + ", volume"}, Row{Name: p.name + ", rootfs"}
		for range cfg.Rounds {
			for _, side := range []struct {
				row *Row
				dir string
			}{{&onVolume, volumeMountPath}, {&onRootfs, rootfsDir}} {
				start := time.Now()
				code, err := c.run(ctx, s, p.cmd(side.dir))
				if err != nil || code != 0 {
					return nil, fmt.Errorf("%s in %s: exit %d: %v", p.name, side.dir, code, err)
				}
				side.row.Samples = append(side.row.Samples, time.Since(start))
			}
		}
		onVolume.Note = compareNote(onVolume.Samples, onRootfs.Samples)
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, "measured %s (%d rounds)\n", p.name, cfg.Rounds)
		}
		rows = append(rows, onVolume, onRootfs)
	}
	_, _ = c.run(ctx, s, fmt.Sprintf("rm -rf %s/seq %s/small", volumeMountPath, volumeMountPath))
	return rows, nil
}

// compareNote says how the volume's median compares: its speed as a share
// of the root filesystem's (time on the rootfs / time on the volume).
func compareNote(volume, rootfs []time.Duration) string {
	v, r := medianDuration(volume), medianDuration(rootfs)
	if v <= 0 {
		return ""
	}
	return fmt.Sprintf("volume at %.0f%% of the rootfs's speed (target ≥ 80%%)", 100*float64(r)/float64(v))
}

func medianDuration(s []time.Duration) time.Duration {
	sorted := slices.Clone(s)
	slices.Sort(sorted)
	return Percentile(sorted, 50)
}
