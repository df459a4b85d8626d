package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/bench"
	"github.com/airlock-sandbox/airlock/internal/netpolicy"
)

func benchCmd() *cobra.Command {
	var (
		dataDir                     string
		tpl                         string
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
				maxTimeout: time.Hour, templates: []string{tpl}, warmPool: 0,
				// Sandboxes get their networks as under serve; egress stays
				// off so the bench never changes the host's ip_forward.
				network: true, egress: false,
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
				NetRound:  netRound(inst),
			})
			if err != nil {
				return err
			}
			fmt.Printf("\nAirlock bench, template %s, %s\n\n", tpl, time.Now().UTC().Format(time.DateOnly))
			bench.Print(os.Stdout, rows)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dataDir, "data-dir", "/var/lib/airlock", "data dir (templates are built there if needed)")
	f.StringVar(&tpl, "template", "base", "template to create sandboxes from")
	f.IntVar(&sequential, "sequential", 100, "creates measured one after another")
	f.IntVar(&concurrent, "concurrent", 20, "creates measured all at once")
	f.IntVar(&rtt, "round-trips", 200, "commands.run('true') round trips in one sandbox")
	return cmd
}

// netRound measures one sandbox network's setup and teardown directly on the
// server's netpolicy.Network (ids of their own, never a live sandbox's).
func netRound(inst *instance) func(ctx context.Context, i int) (time.Duration, time.Duration, error) {
	if inst.net == nil {
		return nil
	}
	return func(ctx context.Context, i int) (time.Duration, time.Duration, error) {
		id := fmt.Sprintf("benchnet%012d", i)
		t0 := time.Now()
		if _, err := inst.net.Setup(ctx, id, netpolicy.Policy{}); err != nil {
			return 0, 0, err
		}
		setup := time.Since(t0)
		t0 = time.Now()
		if err := inst.net.Teardown(id); err != nil {
			return 0, 0, err
		}
		return setup, time.Since(t0), nil
	}
}
