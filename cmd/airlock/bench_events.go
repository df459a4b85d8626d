package main

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/bench"
	"github.com/airlock-sandbox/airlock/internal/layout"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
)

func benchEventsCmd() *cobra.Command {
	var (
		dataDir, tpl              string
		records, workers, creates int
	)
	cmd := &cobra.Command{
		Use:   "events",
		Short: "Measure lifecycle events: events the store accepts per second, and create with recording on vs off",
		Long: `Start an Airlock server in this process, then measure its lifecycle event
store (Record one after another, and from several goroutines at once, on the
server's disk while it runs, in a database of its own) and creates through the E2B API with the
manager recording lifecycle events and with recording switched off, interleaved
one by one in the same run.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var gate *bench.EventsGate
			c := benchConfig(dataDir, []string{tpl}, "linux", slog.LevelWarn, true)
			c.WrapEvents = func(l sandbox.EventLog, records store.Store) sandbox.EventLog {
				gate = bench.NewEventsGate(l, records)
				return gate
			}
			d, err := startBench(cmd.Context(), c)
			if err != nil {
				return err
			}
			defer d.Close()
			// The store is measured on a database of its own, beside the
			// server's (same filesystem, same settings): the bench's events
			// must not land among the server's.
			tmp, err := os.MkdirTemp(d.Layout.Root, ".bench-events-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(tmp)
			db, err := store.OpenSQLite(filepath.Join(tmp, "airlock.db"))
			if err != nil {
				return err
			}
			defer db.Close()
			rows, err := bench.RunEvents(cmd.Context(), bench.EventsConfig{
				Config: bench.Config{
					APIURL: d.APIURL, SandboxURL: d.SandboxURL, APIKey: d.APIKeys[0], Template: tpl,
					Progress: os.Stderr,
				},
				Store: store.NewLifecycleEvents(db), Gate: gate, Records: records, Workers: workers, Creates: creates,
			})
			if err != nil {
				return err
			}
			fmt.Printf("\nAirlock bench events, template %s, %s\n\n", tpl, time.Now().UTC().Format(time.DateOnly))
			bench.Print(os.Stdout, rows)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dataDir, "data-dir", layout.DefaultRoot, "data dir (templates are built there if needed)")
	f.StringVar(&tpl, "template", "base", "template to create sandboxes from")
	f.IntVar(&records, "records", 2000, "events recorded one after another, and by each goroutine")
	f.IntVar(&workers, "workers", 8, "goroutines recording at once")
	f.IntVar(&creates, "creates", 30, "creates with recording on, and as many with it off")
	return cmd
}
