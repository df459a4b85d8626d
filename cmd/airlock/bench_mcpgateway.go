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

func benchMCPGatewayCmd() *cobra.Command {
	var (
		dataDir, tpl        string
		creates, roundTrips int
	)
	cmd := &cobra.Command{
		Use:   "mcp-gateway",
		Short: "Measure the in-sandbox MCP gateway against calling the same stdio server directly, same run",
		Long: `Start an Airlock server in this process and measure, with the mcp-gateway
template: create + first commands.run against create + mcp-gateway --config (one
catalog server, "everything") + the first tool call through the sandbox proxy, as
Sandbox.create({mcp}) and an MCP client do; then the echo tool's round trip over
stdio inside the sandbox (the baseline), through the gateway inside the sandbox,
and through the sandbox proxy and the gateway from the host.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			// With the network: the gateway is a user port the sandbox
			// proxy reaches on the sandbox's address, as for any user.
			c := benchConfig(dataDir, []string{tpl}, "linux", slog.LevelWarn, true)
			d, err := startBench(ctx, c)
			if err != nil {
				return err
			}
			defer d.Close()
			rows, err := bench.RunMCPGateway(ctx, bench.MCPGatewayConfig{
				Config: bench.Config{
					APIURL: d.APIURL, SandboxURL: d.SandboxURL, APIKey: d.APIKeys[0], Template: tpl,
					RoundTrips: roundTrips, Progress: os.Stderr,
				},
				Creates: creates,
			})
			if err != nil {
				return err
			}
			fmt.Printf("\nAirlock bench mcp-gateway, template %s, %s\n\n", tpl, time.Now().UTC().Format(time.DateOnly))
			bench.Print(os.Stdout, rows)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dataDir, "data-dir", layout.DefaultRoot, "data dir (templates are built there if needed)")
	f.StringVar(&tpl, "template", "mcp-gateway", "template of the sandboxes (it must have the catalog's everything server)")
	f.IntVar(&creates, "creates", 10, "creates measured with and without the gateway")
	f.IntVar(&roundTrips, "round-trips", 300, "tool calls in each round-trip series")
	return cmd
}
