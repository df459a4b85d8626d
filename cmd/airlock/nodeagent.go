package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"

	"github.com/airlock-sandbox/airlock/internal/kube"
	"github.com/airlock-sandbox/airlock/internal/netpolicy"
	"github.com/airlock-sandbox/airlock/internal/nodeagent"
)

func nodeAgentCmd() *cobra.Command {
	var kubeconfig, namespace, node, table, dnsListen, logLevel, logFormat string
	var upstreams []string
	var allowPrivate []string
	cmd := &cobra.Command{
		Use:   "node-agent",
		Short: "Enforce the egress policy of the sandbox Pods of this Kubernetes node (a DaemonSet with the host's network)",
		Long: `Run on every node of a cluster that serve --backend kubernetes --pod-network agent
uses (deploy/kubernetes runs it as a DaemonSet with the host's network and NET_ADMIN):
it follows the node's sandbox Pods and judges their egress on the node's forward path
as one box judges its sandboxes' (private ranges closed, allowOut and denyOut by
address, CIDR and domain, DNS through its filter), and tells each Pod's replica, in
the Pod's annotations, that its policy is in force. Stopped, it leaves its nftables
table in place: the Pods stay judged by their last policy until it is back.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			lg, err := newLogger(logLevel, logFormat)
			if err != nil {
				return err
			}
			open, err := netpolicy.ParseAllowPrivate(allowPrivate)
			if err != nil {
				return fmt.Errorf("--allow-private: %w", err)
			}
			rc, err := kube.RESTConfig(kubeconfig)
			if err != nil {
				return err
			}
			client, err := kubernetes.NewForConfig(rc)
			if err != nil {
				return fmt.Errorf("kubernetes: %w", err)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if _, err := nodeagent.Start(ctx, nodeagent.Config{
				Client: client, Namespace: namespace, Node: node, Logger: lg,
				Net: netpolicy.PodConfig{Table: table, DNSListen: dnsListen, DNSUpstreams: upstreams, AllowPrivate: open, Logger: lg},
			}); err != nil {
				return err
			}
			<-ctx.Done()
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file of the cluster (default: the in-cluster config)")
	f.StringVar(&namespace, "kube-namespace", "airlock-sandboxes", "namespace of the sandbox Pods")
	f.StringVar(&node, "node-name", os.Getenv("NODE_NAME"), "this node's name (default $NODE_NAME, which the DaemonSet sets from spec.nodeName)")
	f.StringVar(&table, "table", "airlock_pods", "the nftables table (family inet) the agent owns")
	f.StringVar(&dnsListen, "dns-listen", "0.0.0.0:0", "where the DNS filter listens (UDP and TCP); sandbox Pods' DNS is redirected there")
	f.StringSliceVar(&upstreams, "dns-upstream", nil, "DNS servers the filter asks, ip:port (default: the node's /etc/resolv.conf)")
	f.StringSliceVar(&allowPrivate, "allow-private", nil, "private ranges every sandbox Pod may reach (CIDR,...), as serve --allow-private")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&logFormat, "log-format", "text", `"text" or "json"`)
	return cmd
}
