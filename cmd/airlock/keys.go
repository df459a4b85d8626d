package main

import (
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/e2bclient"
	"github.com/airlock-sandbox/airlock/internal/e2bwire"
	"github.com/airlock-sandbox/airlock/internal/layout"
)

// adminFlags are how the keys and audit commands reach a running server:
// its API, with a key that holds keys:admin (by default the bootstrap key).
type adminFlags struct{ url, key, dataDir string }

func (a *adminFlags) add(cmd *cobra.Command) {
	f := cmd.PersistentFlags()
	f.StringVar(&a.url, "url", envOr([]string{"AIRLOCK_URL", "E2B_API_URL"}, "http://127.0.0.1:3000"), "Airlock API URL (env AIRLOCK_URL or E2B_API_URL)")
	f.StringVar(&a.key, "api-key", "", "a key holding keys:admin (env AIRLOCK_API_KEY or E2B_API_KEY; default: the bootstrap key in <data-dir>/api-key)")
	f.StringVar(&a.dataDir, "data-dir", layout.DefaultRoot, "data directory of a local server, to read its api-key file")
}

func (a *adminFlags) client() (*e2bclient.Client, error) {
	key, err := mcpAPIKey(a.key, a.dataDir)
	if err != nil {
		return nil, err
	}
	return e2bclient.New(e2bclient.Config{APIURL: a.url, APIKey: key}), nil
}

func keysCmd() *cobra.Command {
	var a adminFlags
	cmd := &cobra.Command{
		Use:   "keys",
		Short: "Make, list, change and revoke API keys of teams, on a running server",
		Long: "Teams and their API keys, through the running server's API (/api-keys) with a key that holds\n" +
			"keys:admin, by default the bootstrap key (AIRLOCK_API_KEY or <data-dir>/api-key). A key is\n" +
			"shown once, when it is made, and kept only as a hash. Scopes: sandboxes:read, sandboxes:write,\n" +
			"templates:read, templates:write, volumes:read, volumes:write, webhooks:read, webhooks:write,\n" +
			"secrets:read, secrets:write, keys:admin; \"<area>:*\" for an area's two, \"*\" for all.",
	}
	a.add(cmd)
	var team, name string
	var scopes []string
	create := &cobra.Command{
		Use:   "create --team T --name N [--scopes S,...]",
		Short: "Make a key (and its team, when there is none of that name); prints the key once",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			k, err := c.CreateKey(cmd.Context(), e2bwire.NewTeamAPIKey{Name: &name, Scopes: scopes, Team: team})
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "key %s (%s) of team %s, scopes %s; it is shown this once:\n",
				k.ID, k.Name, k.TeamID, strings.Join(k.Scopes, " "))
			fmt.Println(k.Key)
			return nil
		},
	}
	create.Flags().StringVar(&team, "team", "", "the team, by name or ID (default: the admin key's own)")
	create.Flags().StringVar(&name, "name", "", "the key's name")
	create.Flags().StringSliceVar(&scopes, "scopes", nil, "scopes (default: every scope but keys:admin)")
	_ = create.MarkFlagRequired("name")

	var listTeam string
	list := &cobra.Command{
		Use:   "list [--team T]",
		Short: "List a team's keys (revoked ones too)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			keys, err := c.ListKeys(cmd.Context(), listTeam)
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tKEY\tSCOPES\tCREATED\tLAST USED\tREVOKED")
			for _, k := range keys {
				fmt.Fprintf(tw, "%s\t%s\t%s%s…%s\t%s\t%s\t%s\t%s\n", k.ID, k.Name, k.Mask.Prefix, k.Mask.MaskedValuePrefix,
					k.Mask.MaskedValueSuffix, strings.Join(k.Scopes, " "), k.CreatedAt.Format(time.DateTime), when(k.LastUsed), when(k.RevokedAt))
			}
			return tw.Flush()
		},
	}
	list.Flags().StringVar(&listTeam, "team", "", "the team, by name or ID (default: the admin key's own)")

	var newName string
	var newScopes []string
	update := &cobra.Command{
		Use:   "update ID [--name N] [--scopes S,...]",
		Short: "Rename a key or replace its scopes",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			body := e2bwire.NewTeamAPIKey{Scopes: newScopes}
			if cmd.Flags().Changed("name") {
				body.Name = &newName
			}
			k, err := c.UpdateKey(cmd.Context(), args[0], body)
			if err != nil {
				return err
			}
			fmt.Printf("key %s (%s): %s\n", k.ID, k.Name, strings.Join(k.Scopes, " "))
			return nil
		},
	}
	update.Flags().StringVar(&newName, "name", "", "the new name")
	update.Flags().StringSliceVar(&newScopes, "scopes", nil, "the new scopes")

	revoke := &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke a key: every later request with it is refused",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			if err := c.RevokeKey(cmd.Context(), args[0]); err != nil {
				return err
			}
			fmt.Printf("key %s revoked\n", args[0])
			return nil
		},
	}
	var q e2bwire.TeamQuotas
	quota := &cobra.Command{
		Use:   "quota TEAM [--sandboxes N] [--vcpus N] [--memory-mb N] [--paused N] [--paused-disk-mb N] [--requests-per-second R] [--builds N] [--volumes-mb N]",
		Short: "Set a team's quotas (0: the server's default, or none); with no flag, show them",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			var t e2bwire.Team
			if !anyChanged(cmd, "sandboxes", "vcpus", "memory-mb", "paused", "paused-disk-mb", "requests-per-second", "builds", "volumes-mb") {
				teams, err := c.Teams(cmd.Context())
				if err != nil {
					return err
				}
				found := false
				for _, tm := range teams {
					if tm.TeamID == args[0] || tm.Name == args[0] {
						t, found = tm, true
					}
				}
				if !found {
					return fmt.Errorf("team %q not found", args[0])
				}
			} else if t, err = c.UpdateTeam(cmd.Context(), args[0], q); err != nil {
				return err
			}
			if t.Quotas != nil {
				q = *t.Quotas
			}
			fmt.Printf("team %s (%s): sandboxes %d, vcpus %d, memory %d MiB, paused %d, paused disk %d MiB, requests/s %g, builds %d, volumes %d MiB (0: the server's default, or none)\n",
				t.Name, t.TeamID, q.Sandboxes, q.VCPUs, q.MemoryMB, q.PausedSandboxes, q.PausedDiskMB, q.RequestsPerSecond, q.Builds, q.VolumesMB)
			return nil
		},
	}
	quota.Flags().IntVar(&q.Sandboxes, "sandboxes", 0, "sandboxes alive at once (running, paused or starting)")
	quota.Flags().IntVar(&q.VCPUs, "vcpus", 0, "vCPUs of the running sandboxes together")
	quota.Flags().IntVar(&q.MemoryMB, "memory-mb", 0, "memory of the running sandboxes together, MiB")
	quota.Flags().IntVar(&q.PausedSandboxes, "paused", 0, "paused sandboxes at once")
	quota.Flags().IntVar(&q.PausedDiskMB, "paused-disk-mb", 0, "disk the paused sandboxes hold together (checkpoint images and writable layers), MiB")
	quota.Flags().Float64Var(&q.RequestsPerSecond, "requests-per-second", 0, "API requests per second (bursts of a second's worth)")
	quota.Flags().IntVar(&q.Builds, "builds", 0, "template builds waiting or building at once")
	quota.Flags().IntVar(&q.VolumesMB, "volumes-mb", 0, "total size of the team's volumes, MiB")
	cmd.AddCommand(create, list, update, revoke, quota)
	return cmd
}

func anyChanged(cmd *cobra.Command, names ...string) bool {
	for _, n := range names {
		if cmd.Flags().Changed(n) {
			return true
		}
	}
	return false
}

func when(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.Local().Format(time.DateTime)
}

func auditCmd() *cobra.Command {
	var a adminFlags
	var team string
	var limit int
	cmd := &cobra.Command{
		Use:   "audit [--team T] [--limit N]",
		Short: "Read the audit log of a running server: who did what to what, newest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			entries, err := c.Audit(cmd.Context(), team, limit, 0)
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "TIME\tKEY\tTEAM\tACTION\tTARGET\tSTATUS\tDETAIL")
			for _, e := range entries {
				target := "-"
				if e.TargetID != "" {
					target = e.TargetKind + " " + e.TargetID
				}
				key := e.KeyName
				if key == "" {
					key = "-"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", e.At.Local().Format(time.DateTime), key, e.TeamID, e.Action, target, e.Status, e.Detail)
			}
			return tw.Flush()
		},
	}
	a.add(cmd)
	cmd.Flags().StringVar(&team, "team", "", "one team's entries, by name or ID (default: every team's)")
	cmd.Flags().IntVar(&limit, "limit", 100, "entries at most (1-1000)")
	return cmd
}
