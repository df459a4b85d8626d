package main

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/bench"
	"github.com/airlock-sandbox/airlock/internal/e2b"
	"github.com/airlock-sandbox/airlock/internal/layout"
)

func benchVolumesCmd() *cobra.Command {
	var (
		dataDir, tpl       string
		mib, files, rounds int
		volumeMiB          int
	)
	cmd := &cobra.Command{
		Use:   "volumes",
		Short: "Measure a volume against the sandbox's root filesystem: sequential write and read, small-file creates",
		Long: `Start an Airlock server in this process, create a volume, and in one sandbox
that mounts it measure sequential write and read throughput (dd, fsync'd writes,
direct reads) and the time to create many small files, on the volume and on the
sandbox's root filesystem, interleaved round by round in the same run.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			d, err := startBench(ctx, benchConfig(dataDir, []string{tpl}, "linux", slog.LevelWarn, false))
			if err != nil {
				return err
			}
			defer d.Close()
			if d.Volumes == nil {
				return fmt.Errorf("volumes need the disk pool, which did not start")
			}
			name := fmt.Sprintf("bench-%d", time.Now().UnixNano())
			v, err := d.Volumes.Create(ctx, e2b.OwnerOf(d.APIKeys[0]), name, int64(volumeMiB)<<20)
			if err != nil {
				return err
			}
			defer func() { _ = d.Volumes.Destroy(ctx, v.Owner, v.ID, true) }()
			rows, err := bench.RunVolumes(ctx, bench.VolumesConfig{
				Config: bench.Config{
					APIURL: d.APIURL, SandboxURL: d.SandboxURL, APIKey: d.APIKeys[0], Template: tpl,
					Progress: os.Stderr,
				},
				Volume: name, MiB: mib, Files: files, Rounds: rounds,
			})
			if err != nil {
				return err
			}
			fmt.Printf("\nAirlock bench volumes, template %s, %s\n\n", tpl, time.Now().UTC().Format(time.DateOnly))
			bench.Print(os.Stdout, rows)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dataDir, "data-dir", layout.DefaultRoot, "data dir (templates are built there if needed)")
	f.StringVar(&tpl, "template", "base", "template of the sandbox")
	f.IntVar(&mib, "mib", 256, "MiB written and read sequentially per round")
	f.IntVar(&files, "files", 2000, "small files created per round")
	f.IntVar(&rounds, "rounds", 5, "rounds of each measurement, volume and rootfs interleaved")
	f.IntVar(&volumeMiB, "volume-mib", 1024, "the bench volume's size")
	return cmd
}
