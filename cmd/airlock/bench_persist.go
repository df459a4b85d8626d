package main

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/bench"
	"github.com/airlock-sandbox/airlock/internal/layout"
	"github.com/airlock-sandbox/airlock/internal/template"
)

// benchPythonTemplate is the python3 template with room for --big-mib: the
// built-in python3 is limited to 1 GiB, which a process holding 1 GiB
// exceeds. It has no build steps, so it shares python3's layers.
const benchPythonTemplate = "bench-persist-python3"

func benchPersistCmd() *cobra.Command {
	var (
		dataDir, rtName, base, python string
		network, noBaseline           bool
		iterations, bigIterations     int
		snapshots, fork10             int
		smallMiB, bigMiB              int
	)
	cmd := &cobra.Command{
		Use:   "persist",
		Short: "Measure pause, resume, snapshots and fork, and the memory a paused sandbox returns, against runc checkpoint/restore",
		Long: `Start an Airlock server in this process, then measure through its sandbox
manager (the calls the E2B handlers make): pause and resume of an idle sandbox
and of one whose Python process holds --small-mib and --big-mib (every page
touched); the host memory a paused sandbox gives back; CreateSnapshot, create
from a snapshot, fork of 1 and of 10. Each pause row says which mode the pause
really took (memory to disk, frozen in place, filesystem only), read from the
data dir. Baseline in the same run: runc checkpoint and runc restore, with the
same CRIU, of a container on the same root filesystem holding the same memory.
The targets of issue 13 are printed beside the figures.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			d, err := startBench(ctx, benchConfig(dataDir, []string{base, python}, rtName, slog.LevelWarn, network))
			if err != nil {
				return err
			}
			defer d.Close()
			bt, err := d.Templates.Get(base)
			if err != nil {
				return err
			}
			cfg := bench.PersistConfig{
				Manager: d.Manager, DataDir: d.Layout.Root,
				SandboxURL: d.SandboxURL, APIKey: d.APIKeys[0], Keys: d.Keys,
				Base: base, BaseRootfs: bt.RootFS,
				SmallMiB: smallMiB, BigMiB: bigMiB,
				Iterations: iterations, BigIterations: bigIterations,
				Snapshots: snapshots, Fork10: fork10,
				NoBaseline: noBaseline, Progress: os.Stderr,
			}
			if smallMiB > 0 || bigMiB > 0 {
				if _, err := d.Templates.Ensure(ctx, python, os.Stderr); err != nil {
					return err
				}
				pt, err := d.Templates.Build(ctx, template.BuildRequest{
					Name:       benchPythonTemplate,
					Dockerfile: []byte("FROM " + python + "\n"),
					Settings:   template.Settings{MemoryMB: max(smallMiB, bigMiB) + 512},
					Replace:    true,
				}, os.Stderr)
				if err != nil {
					return err
				}
				cfg.Python, cfg.PythonRootfs = pt.Name, pt.RootFS
			}
			res, err := bench.Persist(ctx, cfg)
			if err != nil {
				return err
			}
			fmt.Printf("\nAirlock bench persist, runtime %s, sandbox network %v, %s\n\n", rtName, network, time.Now().UTC().Format(time.DateOnly))
			bench.PrintPersist(os.Stdout, res)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dataDir, "data-dir", layout.DefaultRoot, "data dir (templates are built there if needed)")
	f.StringVar(&rtName, "runtime", "linux", `isolation backend the sandboxes run on: "linux" or "gvisor"`)
	f.BoolVar(&network, "network", true, "give each sandbox its own network namespace, as serve does")
	f.StringVar(&base, "template", "base", "template of the idle sandboxes, snapshots and forks")
	f.StringVar(&python, "python-template", "python3", "template with python3 for the memory-holding rows (rebuilt as "+benchPythonTemplate+" with room for --big-mib)")
	f.IntVar(&iterations, "iterations", 5, "pauses and resumes of the idle and --small-mib sandboxes")
	f.IntVar(&bigIterations, "big-iterations", 2, "pauses and resumes of the --big-mib sandbox")
	f.IntVar(&smallMiB, "small-mib", 100, "MiB the Python process holds in the small row (0 skips it)")
	f.IntVar(&bigMiB, "big-mib", 1024, "MiB the Python process holds in the big row (0 skips it)")
	f.IntVar(&snapshots, "snapshots", 3, "snapshots, creates from a snapshot, and forks of 1 (0 skips them and forks of 10)")
	f.IntVar(&fork10, "fork10", 1, "forks of 10")
	f.BoolVar(&noBaseline, "no-baseline", false, "skip the runc checkpoint/restore baseline")
	return cmd
}
