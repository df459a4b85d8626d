package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/bench"
	"github.com/airlock-sandbox/airlock/internal/e2b"
	"github.com/airlock-sandbox/airlock/internal/layout"
	"github.com/airlock-sandbox/airlock/internal/netpolicy/netpolicytest"
)

func benchEgressCmd() *cobra.Command {
	var (
		dataDir, tpl             string
		requests, rounds, warmup int
	)
	cmd := &cobra.Command{
		Use:   "egress",
		Short: "Measure what the egress proxy adds to an HTTPS request: a rule host, a host without rules, no policy",
		Long: `Start a stand-in HTTPS server in a network namespace of the bench's own
(documentation addresses with host routes of their own, as the network tests
use; nothing leaves the machine), then an Airlock server in this process whose
sandboxes resolve through the stand-in's DNS and whose egress trusts the
stand-in's CA, and in the same run three sandboxes that call the server:
with no policy (direct), with rules for another name on the same address (the
connection is redirected to the egress proxy and spliced through untouched),
and to the rule host (TLS terminated, a header with a secret from the secret
store filled in, re-encrypted upstream). A python3 client inside each sandbox
times every request itself, on a new TLS connection each and on one kept-alive
connection. Issue 18's target: at most 2 ms added at p50 for the rule host.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// An interrupt still runs the defers: the sandboxes, the
			// stand-in's namespace, veth and routes go.
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			tmp, err := os.MkdirTemp("", "airlock-bench-egress-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(tmp)
			in, err := netpolicytest.Open(filepath.Join(tmp, "internet"), func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) })
			if err != nil {
				return err
			}
			defer in.Close() // after the server's close (defers run last first): no sandbox is left to use it
			es, err := in.Egress()
			if err != nil {
				return err
			}
			caFile := filepath.Join(tmp, "server-ca.pem")
			if err := os.WriteFile(caFile, es.CAPEM, 0o600); err != nil {
				return err
			}
			c := benchConfig(dataDir, []string{tpl}, "linux", slog.LevelWarn, true)
			c.Network.Egress = true
			c.Network.DNSUpstreams = []string{in.DNSUpstream()}
			c.Network.EgressUpstreamCA = caFile
			d, err := startBench(ctx, c)
			if err != nil {
				return err
			}
			defer d.Close()
			if d.Secrets == nil {
				return errors.New("the server has no secret store")
			}
			owner := e2b.OwnerOf(d.APIKeys[0])
			b := make([]byte, 16)
			_, _ = rand.Read(b)
			name, value := fmt.Sprintf("bench_egress_%d", time.Now().UnixNano()), "bench-"+hex.EncodeToString(b)
			s, err := d.Secrets.Create(ctx, owner, name, value, nil)
			if err != nil {
				return err
			}
			defer func() { _ = d.Secrets.Destroy(context.WithoutCancel(ctx), owner, s.ID) }()
			res, err := bench.RunEgress(ctx, bench.EgressConfig{
				Config: bench.Config{
					APIURL: d.APIURL, SandboxURL: d.SandboxURL, APIKey: d.APIKeys[0], Template: tpl,
					Progress: os.Stderr,
				},
				RuleHost: netpolicytest.RulesHost, PlainHost: netpolicytest.PlainHost, ServerCA: es.CAPEM,
				SecretName: name, WantAuth: "Bearer " + value,
				Requests: requests, Rounds: rounds, Warmup: warmup,
				Received: func() []bench.EgressRequest {
					var out []bench.EgressRequest
					for _, r := range es.Requests() {
						out = append(out, bench.EgressRequest{Path: r.Path, SNI: r.SNI, Authorization: r.Header.Get("Authorization")})
					}
					return out
				},
			})
			if err != nil {
				return err
			}
			fmt.Printf("\nAirlock bench egress, template %s, %d requests per row, %s\n\n", tpl, requests, time.Now().UTC().Format(time.DateOnly))
			bench.PrintEgress(os.Stdout, res)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dataDir, "data-dir", layout.DefaultRoot, "data dir (templates are built there if needed)")
	f.StringVar(&tpl, "template", "base", "template of the sandboxes (needs python3)")
	f.IntVar(&requests, "requests", 200, "requests measured per configuration and mode")
	f.IntVar(&rounds, "rounds", 4, "rounds the requests are split over, the configurations' order rotating")
	f.IntVar(&warmup, "warmup", 5, "requests per client process made first and not counted")
	return cmd
}
