package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/bench"
	"github.com/airlock-sandbox/airlock/internal/daemon"
	"github.com/airlock-sandbox/airlock/internal/layout"
	"github.com/airlock-sandbox/airlock/internal/netpolicy"
	"github.com/airlock-sandbox/airlock/internal/template"
)

func benchCmd() *cobra.Command {
	var (
		dataDir                     string
		tpl, rtName                 string
		sequential, concurrent, rtt int
		cpuProfile                  string
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure time to interactive and command round trip against baselines, and print a table",
		Long: `Start an Airlock server in this process (loopback, ephemeral ports), then measure
over the E2B wire protocol: create + first commands.run (time to interactive),
sequential and concurrent, and the round trip of commands.run('true'). In the
same run, measure plain fork+exec and 'runc run' of /bin/true on the same
template rootfs as baselines.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			d, err := startBench(cmd.Context(), benchConfig(dataDir, []string{tpl}, rtName, slog.LevelWarn, true))
			if err != nil {
				return err
			}
			defer d.Close()
			t, err := d.Templates.Get(tpl)
			if err != nil {
				return err
			}
			cfg := bench.Config{
				APIURL: d.APIURL, SandboxURL: d.SandboxURL, APIKey: d.APIKeys[0],
				Template: tpl, Rootfs: t.RootFS,
				Sequential: sequential, Concurrent: concurrent, RoundTrips: rtt,
				Progress:    os.Stderr,
				SetWarmPool: warmPoolSetter(cmd.Context(), d, tpl),
				WarmCount:   func() int { return d.Manager.WarmCount(t.ID) },
				NetRound:    netRound(d),
			}
			if cpuProfile != "" {
				f, err := os.Create(cpuProfile)
				if err != nil {
					return err
				}
				defer f.Close()
				cfg.CPUProfile = f
			}
			rows, err := bench.Run(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			fmt.Printf("\nAirlock bench, template %s, runtime %s, %s\n\n", tpl, rtName, time.Now().UTC().Format(time.DateOnly))
			bench.Print(os.Stdout, rows)
			for _, r := range rows {
				bench.PrintBreakdown(os.Stdout, r)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dataDir, "data-dir", layout.DefaultRoot, "data dir (templates are built there if needed)")
	f.StringVar(&tpl, "template", "base", "template to create sandboxes from")
	f.StringVar(&rtName, "runtime", "linux", `isolation backend the sandboxes run on: "linux" or "gvisor"`)
	f.IntVar(&sequential, "sequential", 100, "creates measured one after another")
	f.IntVar(&concurrent, "concurrent", 20, "creates measured all at once")
	f.IntVar(&rtt, "round-trips", 200, "commands.run('true') round trips in one sandbox")
	f.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the server (in this process) during the sequential cold creates to this file")
	cmd.AddCommand(benchAttacksCmd(), benchTemplatesCmd(), benchInterpCmd(), benchPersistCmd(), benchEventsCmd(), benchWebhooksCmd(), benchVolumesCmd(), benchEgressCmd(), benchDomainCmd(), benchMCPGatewayCmd(), benchDensityCmd(), benchKeysCmd(), benchKubeCmd())
	return cmd
}

func benchAttacksCmd() *cobra.Command {
	var (
		dataDir, tpl string
		rtt          int
		settle       time.Duration
	)
	cmd := &cobra.Command{
		Use:   "attacks",
		Short: "Measure a neighbour sandbox's command round trip while another sandbox attacks its limits",
		Long: `Start an Airlock server in this process, create a neighbour sandbox, and measure
its commands.run('true') round trip (p50/p99) while idle and while a second
sandbox runs each attack in turn: fork bomb, memory bomb (OOM loop), CPU spin on
all cores, disk fill to its quota, output flood through commands.run, and fd
exhaustion. The ratio to idle is the isolation figure (goal: p99 under 2x).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			d, err := startBench(cmd.Context(), benchConfig(dataDir, []string{tpl}, "linux", slog.LevelError, false))
			if err != nil {
				return err
			}
			defer d.Close()
			rows, err := bench.RunAttacks(cmd.Context(), bench.AttacksConfig{
				APIURL: d.APIURL, SandboxURL: d.SandboxURL, APIKey: d.APIKeys[0],
				Template: tpl, RoundTrips: rtt, Settle: settle, Progress: os.Stderr,
			})
			if err != nil {
				return err
			}
			fmt.Printf("\nAirlock bench attacks, template %s, %s\n\n", tpl, time.Now().UTC().Format(time.DateOnly))
			bench.PrintAttacks(os.Stdout, rows)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dataDir, "data-dir", layout.DefaultRoot, "data dir (templates are built there if needed)")
	f.StringVar(&tpl, "template", "base", "template to create sandboxes from")
	f.IntVar(&rtt, "round-trips", 200, "neighbour commands.run('true') round trips per attack")
	f.DurationVar(&settle, "settle", 3*time.Second, "how long each attack runs before the neighbour is measured")
	return cmd
}

// netRound measures one sandbox network's setup and teardown directly on the
// server's netpolicy.Network (ids of their own, never a live sandbox's).
func netRound(d *daemon.Daemon) func(ctx context.Context, i int) (time.Duration, time.Duration, error) {
	if d.Network == nil {
		return nil
	}
	return func(ctx context.Context, i int) (time.Duration, time.Duration, error) {
		id := fmt.Sprintf("benchnet%012d", i)
		t0 := time.Now()
		if _, err := d.Network.Setup(ctx, id, netpolicy.Policy{}); err != nil {
			return 0, 0, err
		}
		setup := time.Since(t0)
		t0 = time.Now()
		if err := d.Network.Teardown(id); err != nil {
			return 0, 0, err
		}
		return setup, time.Since(t0), nil
	}
}

func benchTemplatesCmd() *cobra.Command {
	var (
		dataDir, sdkDir string
		templates       []string
		n, builds       int
	)
	cmd := &cobra.Command{
		Use:   "templates",
		Short: "Compare template builds through the E2B API with airlock template build, and create time across templates",
		Long: `Start an Airlock server in this process, then:

Builds: the same three-step template (a RUN writing a file, a COPY of a small
file, an ENV, from the first --templates entry) built through 'airlock template
build' (the template store's Build with a Dockerfile and a context directory)
and through the E2B template build API as the SDK speaks it (POST /v3/templates,
file presence and upload, start, status polling), with Airlock's Go client and,
when node and --sdk-dir/node_modules are there, with the npm SDK's
Template.build. Cold builds change every layer (a fresh nonce in the RUN and the
file); cached builds repeat one template. Each API row says what it adds to
'airlock template build' against issue 15's targets (10% cold, 1 s cached).

Creates: sandboxes from each template in turn (cold, no warm pool), with create
and time-to-interactive percentiles and each template's p50 against the first's.
Sandboxes mount a template read-only and never copy it, so size should not show.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(templates) == 0 {
				return fmt.Errorf("--templates: name at least one template")
			}
			if n < 0 || builds < 0 {
				return fmt.Errorf("--n and --builds must not be negative")
			}
			d, err := startBench(cmd.Context(), benchConfig(dataDir, templates, "linux", slog.LevelWarn, true))
			if err != nil {
				return err
			}
			defer d.Close()
			date := time.Now().UTC().Format(time.DateOnly)
			if builds > 0 {
				rows, err := bench.TemplateBuilds(cmd.Context(), bench.BuildsConfig{
					APIURL: d.APIURL, APIKey: d.APIKeys[0], Store: d.Templates, Base: templates[0],
					Iterations: builds, SDKDir: sdkDir, Progress: os.Stderr,
				})
				if err != nil {
					return err
				}
				fmt.Printf("\nAirlock bench templates: builds of FROM %s + RUN, COPY, ENV, %s\n\n", templates[0], date)
				bench.Print(os.Stdout, rows)
			}
			if n == 0 {
				return nil
			}
			labels := map[string]string{}
			for _, name := range templates {
				t, err := d.Templates.Get(name)
				if err != nil {
					return err
				}
				labels[name] = formatMB(t.SizeBytes)
			}
			rows, err := bench.CompareTemplates(cmd.Context(), bench.Config{
				APIURL: d.APIURL, SandboxURL: d.SandboxURL, APIKey: d.APIKeys[0], Progress: os.Stderr,
			}, templates, labels, n)
			if err != nil {
				return err
			}
			fmt.Printf("\nAirlock bench templates: creates, %s\n\n", date)
			bench.Print(os.Stdout, rows)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dataDir, "data-dir", layout.DefaultRoot, "data dir (templates are built there if needed)")
	f.StringSliceVar(&templates, "templates", []string{"base", "code-interpreter-v1"}, "templates to compare; the first is the baseline and the builds' base")
	f.IntVar(&n, "n", 50, "creates per template (0 skips the creates)")
	f.IntVar(&builds, "builds", 5, "cold and cached builds per build path (0 skips the builds)")
	f.StringVar(&sdkDir, "sdk-dir", "tests/sdk", "directory with node_modules/e2b for the npm SDK's build rows (skipped when missing)")
	return cmd
}

func benchInterpCmd() *cobra.Command {
	var (
		dataDir, tpl string
		rtt, creates int
	)
	cmd := &cobra.Command{
		Use:   "interp",
		Short: "Measure the code interpreter: runCode round trips per language, and create + first runCode",
		Long: `Start an Airlock server in this process, then measure over the calls
@e2b/code-interpreter makes (POST /execute on port 49999 through the sandbox
proxy): runCode('1+1') in a warm context for python, javascript, bash, r and java,
createCodeContext + its first runCode for python, r and java (the kernel's start), and
create + first runCode, cold and from the warm pool. Baselines in the same run:
envd's /health through the proxy, and python3 -c through commands.run.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			d, err := startBench(cmd.Context(), benchConfig(dataDir, []string{tpl}, "linux", slog.LevelWarn, true))
			if err != nil {
				return err
			}
			defer d.Close()
			t, err := d.Templates.Get(tpl)
			if err != nil {
				return err
			}
			rows, err := bench.Interp(cmd.Context(), bench.InterpConfig{
				Config: bench.Config{
					APIURL: d.APIURL, SandboxURL: d.SandboxURL, APIKey: d.APIKeys[0], Template: tpl,
					Progress:    os.Stderr,
					SetWarmPool: warmPoolSetter(cmd.Context(), d, tpl),
					WarmCount:   func() int { return d.Manager.WarmCount(t.ID) },
				},
				RoundTrips: rtt, Creates: creates,
			})
			if err != nil {
				return err
			}
			fmt.Printf("\nAirlock bench interp, template %s, %s\n\n", tpl, time.Now().UTC().Format(time.DateOnly))
			bench.Print(os.Stdout, rows)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dataDir, "data-dir", layout.DefaultRoot, "data dir (templates are built there if needed)")
	f.StringVar(&tpl, "template", "code-interpreter-v1", "template to create sandboxes from")
	f.IntVar(&rtt, "round-trips", 200, "runCode round trips per language in one warm context")
	f.IntVar(&creates, "creates", 20, "create + first runCode, cold and warm")
	return cmd
}

// benchConfig is the server a bench starts in this process: loopback on
// ephemeral ports, no warm pool (each bench sets its own), disk quotas as
// under serve, a network per sandbox unless withNetwork is false, but egress
// off so a bench never changes the host's ip_forward; every sandbox is killed
// when the bench ends.
func benchConfig(dataDir string, templates []string, runtimeName string, level slog.Level, withNetwork bool) daemon.Config {
	return daemon.Config{
		APIAddr: "127.0.0.1:0", SandboxAddr: "127.0.0.1:0", DataDir: dataDir,
		MaxTimeout: time.Hour, Templates: templates, WarmPool: 0, Runtime: runtimeName, DiskQuota: true,
		Network:     daemon.NetworkConfig{Enabled: withNetwork},
		KillOnClose: true,
		Logger:      slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})),
	}
}

// startBench starts the bench's server (building its templates if needed).
func startBench(ctx context.Context, c daemon.Config) (*daemon.Daemon, error) {
	envdPath, err := findEnvd()
	if err != nil {
		return nil, err
	}
	c.EnvdPath = envdPath
	d := daemon.New(c)
	if err := d.Start(ctx); err != nil {
		return nil, err
	}
	return d, nil
}

// warmPoolSetter lets a bench resize the server's warm pool of one template.
func warmPoolSetter(ctx context.Context, d *daemon.Daemon, name string) func(int) {
	return func(n int) {
		if st, err := (template.Resolver{Store: d.Templates}).Resolve(ctx, name); err == nil {
			d.Manager.SetWarmPool(st, n)
		}
	}
}
