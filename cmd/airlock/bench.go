package main

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/bench"
)

func benchCmd() *cobra.Command {
	var (
		dataDir                     string
		tpl, rtName                 string
		sequential, concurrent, rtt int
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure time to interactive and command round trip against baselines, and print a table",
		Long: `Start an Airlock server in this process (loopback, ephemeral ports), then measure
over the E2B wire protocol: create + first commands.run (time to interactive),
sequential and concurrent, and the round trip of commands.run('true'). In the
same run, measure plain fork+exec and 'runc run' of /bin/true on the same
template rootfs as baselines.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
			inst, err := start(cmd.Context(), serveConfig{
				apiAddr: "127.0.0.1:0", sandboxAddr: "127.0.0.1:0", dataDir: dataDir,
				maxTimeout: time.Hour, templates: []string{tpl}, warmPool: 0, runtime: rtName,
			}, log)
			if err != nil {
				return err
			}
			defer inst.close(true)
			t, err := inst.tpls.Get(tpl)
			if err != nil {
				return err
			}
			rows, err := bench.Run(cmd.Context(), bench.Config{
				APIURL: inst.apiURL, SandboxURL: inst.sandboxURL, APIKey: inst.apiKey,
				Template: tpl, Rootfs: t.RootFS,
				Sequential: sequential, Concurrent: concurrent, RoundTrips: rtt,
				Progress: os.Stderr,
				SetWarmPool: func(n int) {
					if st, err := (templateSource{inst.tpls}).Resolve(cmd.Context(), tpl); err == nil {
						inst.mgr.SetWarmPool(st, n)
					}
				},
				WarmCount: func() int { return inst.mgr.WarmCount(t.ID) },
			})
			if err != nil {
				return err
			}
			fmt.Printf("\nAirlock bench, template %s, runtime %s, %s\n\n", tpl, rtName, time.Now().UTC().Format(time.DateOnly))
			bench.Print(os.Stdout, rows)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dataDir, "data-dir", "/var/lib/airlock", "data dir (templates are built there if needed)")
	f.StringVar(&tpl, "template", "base", "template to create sandboxes from")
	f.StringVar(&rtName, "runtime", "linux", `isolation backend the sandboxes run on: "linux" or "gvisor"`)
	f.IntVar(&sequential, "sequential", 100, "creates measured one after another")
	f.IntVar(&concurrent, "concurrent", 20, "creates measured all at once")
	f.IntVar(&rtt, "round-trips", 200, "commands.run('true') round trips in one sandbox")
	return cmd
}
