package main

import (
	"errors"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/daemon"
	"github.com/airlock-sandbox/airlock/internal/doctor"
	"github.com/airlock-sandbox/airlock/internal/layout"
)

// errDoctorFailed makes `airlock doctor` exit non-zero; the findings were
// printed already.
var errDoctorFailed = errors.New("doctor: serving would fail on this host (see above)")

func doctorCmd() *cobra.Command {
	var o doctor.Options
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check whether this host can run `airlock serve`, and say what to do about each problem",
		Long: `Check the kernel (version, namespaces, overlayfs, cgroups, seccomp, nftables),
the tools Airlock runs (btrfs-progs for the disk pool, CRIU for pause with memory,
runsc for gVisor, lxcfs), pid_max and IP forwarding, free disk and memory, the
ports serve would listen on, the data dir's permissions and the clock. Pass the
flags you pass to serve. Nothing on the host is changed.

Each line is ✔ (fine), ! (serve runs, without what it names) or ✖ (serving or
starting sandboxes would fail), with a fix under each problem. The exit status is
non-zero when anything fails.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			findings := doctor.Run(o)
			doctor.Write(cmd.OutOrStdout(), findings)
			if doctor.Failed(findings) {
				return errDoctorFailed
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.DataDir, "data-dir", layout.DefaultRoot, "data dir serve would use")
	f.StringVar(&o.APIAddr, "api-addr", "127.0.0.1:3000", "serve's --api-addr")
	f.StringVar(&o.SandboxAddr, "sandbox-addr", "127.0.0.1:3001", "serve's --sandbox-addr")
	f.StringVar(&o.MetricsAddr, "metrics-addr", "127.0.0.1:3002", "serve's --metrics-addr (\"\": none)")
	f.StringVar(&o.Domain, "domain", "", "serve's --domain (its TLS listener's port is checked too)")
	f.StringVar(&o.TLSListen, "tls-listen", daemon.DefaultTLSListen, "serve's --tls-listen")
	f.StringVar(&o.Runtime, "runtime", "linux", `serve's --runtime: "linux" or "gvisor"`)
	f.BoolVar(&o.DiskQuota, "disk-quota", true, "serve's --disk-quota")
	f.BoolVar(&o.Network, "sandbox-network", true, "serve's --sandbox-network")
	f.BoolVar(&o.Egress, "sandbox-egress", true, "serve's --sandbox-egress")
	return cmd
}
