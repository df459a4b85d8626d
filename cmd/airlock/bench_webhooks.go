package main

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/bench"
	"github.com/airlock-sandbox/airlock/internal/layout"
)

func benchWebhooksCmd() *cobra.Command {
	var (
		dataDir, tpl, rtName string
		creates              int
	)
	cmd := &cobra.Command{
		Use:   "webhooks",
		Short: "Measure create time with one lifecycle webhook subscribed to every event against none, in the same run",
		Long: `Start an Airlock server in this process (webhooks to loopback allowed), then
measure sandbox creates over the E2B API in alternating rounds: with no webhook,
and with one webhook subscribed to every event type whose receiver runs in this
process. Delivery is asynchronous, so the two p50s should be within 1 ms.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c := benchConfig(dataDir, []string{tpl}, rtName, slog.LevelWarn, true)
			c.Webhooks.AllowPrivate = true
			d, err := startBench(cmd.Context(), c)
			if err != nil {
				return err
			}
			defer d.Close()
			rows, err := bench.Webhooks(cmd.Context(), bench.WebhookConfig{
				APIURL: d.APIURL, SandboxURL: d.SandboxURL, APIKey: d.APIKeys[0], Template: tpl,
				Creates: creates, Progress: os.Stderr,
			})
			if err != nil {
				return err
			}
			fmt.Printf("\nAirlock bench webhooks, template %s, runtime %s, %s\n\n", tpl, rtName, time.Now().UTC().Format(time.DateOnly))
			bench.Print(os.Stdout, rows)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dataDir, "data-dir", layout.DefaultRoot, "data dir (templates are built there if needed)")
	f.StringVar(&tpl, "template", "base", "template to create sandboxes from")
	f.StringVar(&rtName, "runtime", "linux", `isolation backend the sandboxes run on: "linux" or "gvisor"`)
	f.IntVar(&creates, "creates", 100, "creates measured in each series")
	return cmd
}
