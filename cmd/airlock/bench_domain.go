package main

import (
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/bench"
	"github.com/airlock-sandbox/airlock/internal/layout"
)

func benchDomainCmd() *cobra.Command {
	var (
		dataDir, tpl        string
		creates, roundTrips int
	)
	cmd := &cobra.Command{
		Use:   "domain",
		Short: "Measure the TLS listener of serve --domain against the plain HTTP listeners, same run",
		Long: `Start an Airlock server in this process with --domain airlock.localhost and a
TLS listener on loopback (its own CA), and measure create + first commands.run and
the commands.run round trip through the plain HTTP listeners and through the TLS
one, alternating request by request, each client keeping its connections.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			c := benchConfig(dataDir, []string{tpl}, "linux", slog.LevelWarn, false)
			c.Domain, c.TLS.Listen = "airlock.localhost", "127.0.0.1:0"
			d, err := startBench(ctx, c)
			if err != nil {
				return err
			}
			defer d.Close()
			if d.DomainCA == nil {
				return fmt.Errorf("the server has no domain CA")
			}
			_, port, _ := strings.Cut(d.ClientDomain, ":")
			rows, err := bench.RunDomain(ctx, bench.DomainConfig{
				Config: bench.Config{
					APIURL: d.APIURL, SandboxURL: d.SandboxURL, APIKey: d.APIKeys[0], Template: tpl,
					Sequential: creates, RoundTrips: roundTrips, Progress: os.Stderr,
				},
				TLSAPIURL: d.DomainAPIURL, TLSSandboxURL: "https://sandbox." + d.ClientDomain,
				Roots: d.DomainCA.Pool(), DialAddr: "127.0.0.1:" + port,
			})
			if err != nil {
				return err
			}
			fmt.Printf("\nAirlock bench domain, template %s, %s\n\n", tpl, time.Now().UTC().Format(time.DateOnly))
			bench.Print(os.Stdout, rows)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dataDir, "data-dir", layout.DefaultRoot, "data dir (templates are built there if needed)")
	f.StringVar(&tpl, "template", "base", "template of the sandboxes")
	f.IntVar(&creates, "creates", 50, "creates measured over each listener")
	f.IntVar(&roundTrips, "round-trips", 300, "commands.run round trips over each listener")
	return cmd
}
