package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/airlock-sandbox/airlock/internal/daemon"
	"github.com/airlock-sandbox/airlock/internal/kube"
	"github.com/airlock-sandbox/airlock/internal/layout"
	"github.com/airlock-sandbox/airlock/internal/replica"
)

// kubeFlags are serve's flags for --backend kubernetes.
type kubeFlags struct {
	backend                    string
	kubeconfig, namespace      string
	runtimeClass               string
	registryAddr, registryHost string
	store, identity            string
	ready                      time.Duration
	cpuRequest, memoryRequest  float64
	pools                      map[string]int
	podNetwork                 string
}

// kubeOnly are the flags only the kubernetes backend reads.
var kubeOnly = []string{"kubeconfig", "kube-namespace", "runtime-class", "registry-addr", "registry-host", "store", "replica-id", "pod-ready-timeout", "pod-cpu-request", "pod-memory-request", "warm-pools", "pod-network"}

func (k *kubeFlags) add(f *pflag.FlagSet) {
	f.StringVar(&k.backend, "backend", "local", `where sandboxes run: "local" (this machine) or "kubernetes" (a Pod each; README: Kubernetes)`)
	f.StringVar(&k.kubeconfig, "kubeconfig", "", "kubeconfig file of the cluster (--backend kubernetes; default: the in-cluster config)")
	f.StringVar(&k.namespace, "kube-namespace", "airlock-sandboxes", "namespace of the sandbox Pods (--backend kubernetes)")
	f.StringVar(&k.runtimeClass, "runtime-class", "gvisor", `RuntimeClass of the sandbox Pods (--backend kubernetes; "" for the nodes' default runtime)`)
	f.StringVar(&k.registryAddr, "registry-addr", "127.0.0.1:3003", "listen address of the registry the nodes pull template images from (--backend kubernetes)")
	f.StringVar(&k.registryHost, "registry-host", "", "host:port the nodes reach that registry at, in image references (default: --registry-addr, 127.0.0.1 for an unspecified host)")
	f.StringVar(&k.store, "store", "", "shared state of the replicas (--backend kubernetes): a postgres:// URL, or a SQLite file (default <data-dir>/airlock.db; one replica only)")
	f.StringVar(&k.identity, "replica-id", "", "this replica's name in the reconciler's election (default: host name and a random suffix)")
	f.DurationVar(&k.ready, "pod-ready-timeout", 2*time.Minute, "longest a sandbox Pod may take to run and answer (--backend kubernetes)")
	f.StringToIntVar(&k.pools, "warm-pools", nil, "warm pool sizes of some templates (name=N,...), in place of --warm-pool for them (--backend kubernetes)")
	f.StringVar(&k.podNetwork, "pod-network", "agent", `who enforces sandbox Pods' egress policy (--backend kubernetes): "agent", the node agent on every node (airlock node-agent, deploy/kubernetes), for which creates wait; "none": the cluster's NetworkPolicy alone, and creates asking for a policy are refused`)
	f.Float64Var(&k.cpuRequest, "pod-cpu-request", kube.DefaultCPURequest, "fraction of a sandbox's vCPUs its Pod requests; the limit is the whole (--backend kubernetes)")
	f.Float64Var(&k.memoryRequest, "pod-memory-request", kube.DefaultMemoryRequest, "fraction of a sandbox's memory its Pod requests; the limit is the whole (--backend kubernetes)")
}

// refuseWithLocal fails when a kubernetes-only flag is given without
// --backend kubernetes: it would be silently ignored.
func (k *kubeFlags) refuseWithLocal(cmd *cobra.Command) error {
	for _, name := range kubeOnly {
		if cmd.Flags().Changed(name) {
			return fmt.Errorf("--%s is for --backend kubernetes", name)
		}
	}
	return nil
}

// kubeReads are the flags --backend kubernetes reads; any other given
// with it is refused rather than silently ignored.
var kubeReads = append([]string{"backend", "api-addr", "sandbox-addr", "data-dir", "template-data-dir", "templates",
	"max-timeout", "rate-limit", "rate-burst", "create-rate-limit", "create-burst", "max-sandboxes-per-key", "warm-pool",
	"webhook-allow-private", "webhook-retry-max", "webhook-give-up", "log-level", "log-format"}, kubeOnly...)

// runKube serves as one replica of the control plane over Kubernetes.
func runKube(ctx context.Context, cmd *cobra.Command, c daemon.Config, k kubeFlags, logLevel, logFormat string) error {
	var unread []string
	cmd.Flags().Visit(func(f *pflag.Flag) {
		if !slices.Contains(kubeReads, f.Name) {
			unread = append(unread, "--"+f.Name)
		}
	})
	if len(unread) > 0 {
		return fmt.Errorf("%s: not used by --backend kubernetes (README: Kubernetes, the feature table; for one domain with TLS put an Ingress in front, deploy/kubernetes/README.md)", strings.Join(unread, ", "))
	}
	lg, err := newLogger(logLevel, logFormat)
	if err != nil {
		return err
	}
	if k.cpuRequest <= 0 || k.cpuRequest > 1 || k.memoryRequest <= 0 || k.memoryRequest > 1 {
		return fmt.Errorf("--pod-cpu-request and --pod-memory-request must be in (0, 1]")
	}
	if k.podNetwork != "agent" && k.podNetwork != "none" {
		return fmt.Errorf(`--pod-network %q: "agent" or "none"`, k.podNetwork)
	}
	keys := []string{}
	if v := os.Getenv("AIRLOCK_API_KEY"); v != "" {
		if keys, err = daemon.ParseAPIKeys(v); err != nil {
			return fmt.Errorf("AIRLOCK_API_KEY: %w", err)
		}
	} else {
		if err := os.MkdirAll(c.DataDir, 0o700); err != nil {
			return fmt.Errorf("data dir: %w", err)
		}
		key, err := daemon.StoredAPIKey(layout.DataDir{Root: c.DataDir})
		if err != nil {
			return err
		}
		keys = []string{key}
	}
	envdPath, err := findEnvd()
	if err != nil {
		return err
	}
	templates := c.Templates
	if !cmd.Flags().Changed("templates") {
		templates = []string{"base"}
	}
	for name, n := range k.pools {
		if !slices.Contains(templates, name) {
			return fmt.Errorf("--warm-pools %s=%d: %s is not among --templates (%s)", name, n, name, strings.Join(templates, ", "))
		}
		if n < 0 {
			return fmt.Errorf("--warm-pools %s=%d: must not be negative", name, n)
		}
	}
	r := replica.New(replica.Config{
		APIAddr: c.APIAddr, SandboxAddr: c.SandboxAddr, RegistryAddr: k.registryAddr, RegistryHost: k.registryHost,
		Kubeconfig: k.kubeconfig, Namespace: k.namespace, RuntimeClass: k.runtimeClass,
		Store: k.store, DataDir: c.DataDir, TemplateDataDir: c.TemplateDataDir, Templates: templates,
		EnvdPath: envdPath, APIKeys: keys, MaxTimeout: c.MaxTimeout, Limits: c.Limits, MaxPerKey: c.MaxPerKey,
		WarmPool: c.WarmPool, WarmPools: k.pools, NodeAgent: k.podNetwork == "agent",
		Webhooks: replica.WebhookConfig{AllowPrivate: c.Webhooks.AllowPrivate, RetryMax: c.Webhooks.RetryMax, GiveUpAfter: c.Webhooks.GiveUpAfter},
		Ready:    k.ready, CPURequest: k.cpuRequest, MemoryRequest: k.memoryRequest, Identity: k.identity, Logger: lg,
	})
	if err := r.Start(ctx); err != nil {
		return err
	}
	fmt.Printf(`
Airlock is serving as a replica over Kubernetes (namespace %s, runtime class %q, templates %s).
For the E2B SDKs:

  export E2B_API_URL=%s
  export E2B_SANDBOX_URL=%s
  export E2B_API_KEY=%s

Template images for the nodes: %s

`, k.namespace, k.runtimeClass, strings.Join(templates, ", "), r.APIURL, r.SandboxURL, keys[0], r.RegistryURL)
	select {
	case <-ctx.Done():
	case err = <-r.Errors():
		lg.Error("listener failed", "err", err)
	}
	lg.Info("shutting down")
	_ = r.Close()
	return err
}
