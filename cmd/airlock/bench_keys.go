package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/apikey"
	"github.com/airlock-sandbox/airlock/internal/bench"
	"github.com/airlock-sandbox/airlock/internal/layout"
)

func benchKeysCmd() *cobra.Command {
	var (
		dataDir, tpl                   string
		teams, perTeam, creates, calls int
	)
	cmd := &cobra.Command{
		Use:   "keys",
		Short: "Measure create and command round trip with one key in the store, then with many keys and teams",
		Long: `Start an Airlock server in this process; time creates and commands.run round trips
with its one key; then make --teams teams of --keys-per-team keys each and time them again,
through one of the keys made and, interleaved, through the first key.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			d, err := startBench(cmd.Context(), benchConfig(dataDir, []string{tpl}, "linux", slog.LevelWarn, true))
			if err != nil {
				return err
			}
			defer d.Close()
			added := fmt.Sprintf("%d keys in %d teams more", teams*perTeam, teams)
			rows, err := bench.RunKeys(cmd.Context(), bench.KeysConfig{
				Config: bench.Config{APIURL: d.APIURL, SandboxURL: d.SandboxURL, APIKey: d.APIKeys[0], Template: tpl, Progress: os.Stderr},
				Added:  added, Creates: creates, Commands: calls,
				AddKeys: func(ctx context.Context) (string, error) {
					var last string
					for t := range teams {
						team, err := d.Keys.EnsureTeam(ctx, fmt.Sprintf("bench-%d", t))
						if err != nil {
							return "", err
						}
						for k := range perTeam {
							c, err := d.Keys.Create(ctx, apikey.CreateRequest{TeamID: team.ID, Name: fmt.Sprintf("bench-%d-%d", t, k)})
							if err != nil {
								return "", err
							}
							last = c.Key
						}
					}
					return last, nil
				},
			})
			if err != nil {
				return err
			}
			fmt.Printf("\nAirlock bench keys, template %s, %s (the store held 1 key, then %s)\n\n", tpl, time.Now().UTC().Format(time.DateOnly), added)
			bench.Print(os.Stdout, rows)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dataDir, "data-dir", layout.DefaultRoot, "data dir (templates are built there if needed)")
	f.StringVar(&tpl, "template", "base", "template to create sandboxes from")
	f.IntVar(&teams, "teams", 100, "teams to make")
	f.IntVar(&perTeam, "keys-per-team", 10, "keys to make in each team")
	f.IntVar(&creates, "creates", 40, "creates in each series")
	f.IntVar(&calls, "commands", 200, "commands.run round trips in each series")
	return cmd
}
