package main

import (
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/template"
)

func templateCmd() *cobra.Command {
	var dataDir string
	cmd := &cobra.Command{Use: "template", Short: "Build and list sandbox templates"}
	cmd.PersistentFlags().StringVar(&dataDir, "data-dir", "/var/lib/airlock", "directory for templates, sandboxes and state")

	build := &cobra.Command{
		Use:   "build NAME",
		Short: "Build a built-in template ahead of time (no-op when its build is current)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := template.Open(template.Options{DataDir: dataDir})
			if err != nil {
				return err
			}
			t, err := s.Ensure(cmd.Context(), args[0], os.Stderr)
			if err != nil {
				return err
			}
			fmt.Printf("template %s ready: %s\n", t.Name, t.RootFS)
			return nil
		},
	}
	list := &cobra.Command{
		Use:   "list",
		Short: "List templates and whether they are built",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := template.Open(template.Options{DataDir: dataDir})
			if err != nil {
				return err
			}
			ts, err := s.List()
			if err != nil {
				return err
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "NAME\tREADY\tSIZE MB\tBUILT")
			for _, t := range ts {
				built := "-"
				if t.Ready {
					built = t.BuiltAt.Format("2006-01-02 15:04")
				}
				fmt.Fprintf(w, "%s\t%v\t%d\t%s\n", t.Name, t.Ready, t.SizeBytes>>20, built)
			}
			return w.Flush()
		},
	}
	cmd.AddCommand(build, list)
	return cmd
}
