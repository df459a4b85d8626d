package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/runtime/linux"
	"github.com/airlock-sandbox/airlock/internal/sysservice"
)

func serviceCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "service",
		Short: "Install or remove `airlock serve` as a systemd service that starts at boot",
	}
	var root string
	var noStart bool
	install := &cobra.Command{
		Use:   "install [-- serve flags...]",
		Short: "Write and enable the systemd unit airlock.service, and start it",
		Long: `Write /etc/systemd/system/airlock.service, which runs this airlock binary's
serve with the flags given after --, enable it (it starts at boot) and start it
(restart it when it runs already). It restarts on failure, and stopping it stops
the server only: sandboxes keep running and the next start re-adopts them. Its
log goes to the journal (journalctl -u airlock). AIRLOCK_API_KEY, when set, goes
into /etc/default/airlock (mode 0600), not into the unit.

  sudo bin/airlock service install -- --data-dir /var/lib/airlock --domain example.com`,
		RunE: func(cmd *cobra.Command, args []string) error {
			// Refused here, before anything is written, as serve would refuse them.
			if err := serveCmd().ParseFlags(args); err != nil {
				return fmt.Errorf("serve flags: %w", err)
			}
			bin, err := linux.Executable()
			if err != nil {
				return err
			}
			envd, err := findEnvd()
			if err != nil {
				return err
			}
			did, err := sysservice.Install(sysservice.Options{
				Root: root, Binary: bin, Envd: envd, ServeArgs: args,
				APIKey: os.Getenv("AIRLOCK_API_KEY"), NoStart: noStart,
			})
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), did+".")
			return nil
		},
	}
	install.Flags().BoolVar(&noStart, "no-start", false, "install and enable, but do not start now")
	uninstall := &cobra.Command{
		Use:   "uninstall",
		Short: "Stop and disable airlock.service and remove its unit (the data dir stays)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			did, err := sysservice.Uninstall(sysservice.Options{Root: root})
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), did+".")
			return nil
		},
	}
	for _, c := range []*cobra.Command{install, uninstall} {
		c.Flags().StringVar(&root, "root", "/", "root directory to install under (systemctl --root; the unit then starts at that system's next boot)")
	}
	cmd.AddCommand(install, uninstall)
	return cmd
}
