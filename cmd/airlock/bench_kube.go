package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/airlock-sandbox/airlock/internal/bench"
	"github.com/airlock-sandbox/airlock/internal/layout"
	"github.com/airlock-sandbox/airlock/internal/netpolicy"
	"github.com/airlock-sandbox/airlock/internal/nodeagent"
	"github.com/airlock-sandbox/airlock/internal/replica"
)

func benchKubeCmd() *cobra.Command {
	var (
		dataDir, tpl, boxRuntime string
		kubeconfig, storeURL     string
		runtimeClass             string
		creates, burst           int
	)
	cmd := &cobra.Command{
		Use:   "kube",
		Short: "Measure create + first command on one box and on two Kubernetes replicas, cold and warm, and creates per second",
		Long: `Start an Airlock server in this process and two replicas of serve --backend
kubernetes over --store (a PostgreSQL URL; both replicas share it) on the cluster of
--kubeconfig, in a namespace of the bench's own (deleted at the end), with the node
agent of the cluster's one node in this process (creates wait for it, as deployed).
Measure, in the
same run: create + first commands.run, cold and from a warm pool, on the box (--runtime)
and on the cluster (API of one replica, sandbox traffic through the other); then
--burst creates at once, half through each replica.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			d, err := startBench(ctx, benchConfig(dataDir, []string{tpl}, boxRuntime, slog.LevelWarn, true))
			if err != nil {
				return err
			}
			defer d.Close()
			bt, err := d.Templates.Get(tpl)
			if err != nil {
				return err
			}
			envdPath, err := findEnvd()
			if err != nil {
				return err
			}
			work, err := os.MkdirTemp("", "airlock-bench-kube-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(work)
			suffix := make([]byte, 4)
			_, _ = rand.Read(suffix)
			ns := "airlock-bench-" + hex.EncodeToString(suffix)
			lg := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
			start := func(name, registryAddr, registryHost string) (*replica.Replica, error) {
				r := replica.New(replica.Config{
					APIAddr: "127.0.0.1:0", SandboxAddr: "127.0.0.1:0", RegistryAddr: registryAddr, RegistryHost: registryHost,
					Kubeconfig: kubeconfig, Namespace: ns, RuntimeClass: runtimeClass, Store: storeURL,
					DataDir: filepath.Join(work, name), TemplateDataDir: dataDir, Templates: []string{tpl},
					EnvdPath: envdPath, APIKeys: d.APIKeys, MaxTimeout: time.Hour, Identity: "bench-" + name, Logger: lg,
					NodeAgent: true,
				})
				return r, r.Start(ctx)
			}
			a, err := start("a", "127.0.0.1:0", "")
			if a != nil {
				defer a.Close()
			}
			if err != nil {
				return err
			}
			// The namespace after the first replica has the client; before its
			// informer would matter (its first create).
			if _, err := a.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
				return err
			}
			defer func() {
				_ = a.Client.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
			}()
			// The node agent of this machine's node, in this process: creates
			// wait for it to enforce each Pod's egress policy, as deployed.
			nodes, err := a.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
			if err != nil {
				return err
			}
			if len(nodes.Items) != 1 {
				return fmt.Errorf("bench kube runs the node agent of this machine: the cluster must have one node, it has %d", len(nodes.Items))
			}
			actx, stopAgent := context.WithCancel(ctx)
			defer stopAgent()
			agent, err := nodeagent.Start(actx, nodeagent.Config{Client: a.Client, Namespace: ns, Node: nodes.Items[0].Name, Logger: lg,
				Net: netpolicy.PodConfig{Table: "airlock_pods_bench", Logger: lg}})
			if err != nil {
				return err
			}
			defer func() { _ = agent.Network().RemoveTable() }()
			b, err := start("b", "", a.RegistryURL[len("http://"):])
			if b != nil {
				defer b.Close()
			}
			if err != nil {
				return err
			}
			if err := waitImage(ctx, a, tpl); err != nil {
				return err
			}
			kubeSet := func(n int) { a.Backend.SetPool(tpl, n); b.Backend.SetPool(tpl, n) }
			rows, err := bench.RunKube(ctx, bench.KubeConfig{
				Box: bench.Config{APIURL: d.APIURL, SandboxURL: d.SandboxURL, APIKey: d.APIKeys[0], Template: tpl, Progress: os.Stderr,
					SetWarmPool: warmPoolSetter(ctx, d, tpl), WarmCount: func() int { return d.Manager.WarmCount(bt.ID) }},
				Kube: bench.Config{APIURL: a.APIURL, SandboxURL: b.SandboxURL, APIKey: d.APIKeys[0], Template: tpl, Progress: os.Stderr,
					SetWarmPool: kubeSet, WarmCount: func() int { return a.Backend.WarmReady(ctx, tpl) }},
				Other:    bench.Config{APIURL: b.APIURL, SandboxURL: a.SandboxURL, APIKey: d.APIKeys[0], Template: tpl},
				BoxName:  "one box (" + boxRuntime + ")",
				KubeName: "kubernetes (" + runtimeClass + " Pods)",
				Creates:  creates, Burst: burst,
			})
			if err != nil {
				return err
			}
			fmt.Printf("\nAirlock bench kube, template %s, %s\n\n", tpl, time.Now().UTC().Format(time.DateOnly))
			bench.Print(os.Stdout, rows)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dataDir, "data-dir", layout.DefaultRoot, "data dir (templates are built there if needed; the replicas serve its templates)")
	f.StringVar(&tpl, "template", "base", "template to create sandboxes from")
	f.StringVar(&boxRuntime, "runtime", "gvisor", `the box's isolation backend ("linux" or "gvisor"; gvisor matches the Pods')`)
	f.StringVar(&kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig of the cluster")
	f.StringVar(&storeURL, "store", "", "the replicas' shared store: a postgres:// URL (required)")
	f.StringVar(&runtimeClass, "runtime-class", "gvisor", "RuntimeClass of the sandbox Pods")
	f.IntVar(&creates, "creates", 30, "creates in each sequential series")
	f.IntVar(&burst, "burst", 20, "creates started at once through the two replicas")
	_ = cmd.MarkFlagRequired("store")
	return cmd
}

// waitImage waits until the replica's registry has made the template's
// image (creates answer 503 until then).
func waitImage(ctx context.Context, r *replica.Replica, tpl string) error {
	deadline := time.Now().Add(15 * time.Minute)
	for {
		if _, err := r.Backend.Templates(ctx, tpl); err == nil {
			return nil
		} else if time.Now().After(deadline) {
			return fmt.Errorf("the image of %s: %w", tpl, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}
