package nodeagent_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/airlock-sandbox/airlock/internal/kube"
	"github.com/airlock-sandbox/airlock/internal/kube/kubetest"
	"github.com/airlock-sandbox/airlock/internal/netpolicy"
	"github.com/airlock-sandbox/airlock/internal/netpolicy/netpolicytest"
	"github.com/airlock-sandbox/airlock/internal/nodeagent"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// TestEgressPolicy: real gVisor Pods on the test cluster, the node agent
// judging their egress, and a stand-in internet in a network namespace of
// the test's own (public-looking hosts in the documentation ranges, private
// hosts, a DNS server for *.test), reached through the node's forward path
// as a node reaches the world. A sandbox reaches public hosts and no private
// one, nor the node itself; allowOut and denyOut work by address, CIDR and
// domain (a denied-all sandbox resolves only its allowed domains); an update
// takes effect on the running Pod; a warm Pod claimed with a policy runs
// under it; a policy a node cannot enforce (network rules) is refused, and
// with no agent a create fails within the wait saying so.
func TestEgressPolicy(t *testing.T) {
	c := kubetest.Start(t)
	ns := c.Namespace(t)
	ctx := context.Background()
	in := netpolicytest.Start(t)
	if err := in.RouteBack(netip.MustParsePrefix(kubetest.PodCIDR)); err != nil {
		t.Fatal(err)
	}
	forwarding(t)
	nodes, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil || len(nodes.Items) != 1 {
		t.Fatalf("the test cluster's node: %v (%d nodes)", err, len(nodes.Items))
	}
	node := nodes.Items[0].Name

	actx, stopAgent := context.WithCancel(ctx)
	defer stopAgent()
	table := "airlock_pods_test"
	agent, err := nodeagent.Start(actx, nodeagent.Config{Client: c.Client, Namespace: ns, Node: node,
		Net: netpolicy.PodConfig{Table: table, DNSUpstreams: []string{in.DNSUpstream()}}})
	if err != nil {
		t.Fatal(err)
	}
	defer removeTable(t, agent)

	b := backend(t, c, ns, true)
	ref := kubetest.BaseImage(t)
	b.Templates = baseTemplate(ref)
	b.SetPool("base", 1)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	if err := b.Start(wctx); err != nil {
		t.Fatal(err)
	}
	go b.RunReconciler(wctx, "test")

	create := func(req sandbox.CreateRequest) sandbox.Info {
		t.Helper()
		req.Template, req.Timeout, req.Secure = "base", 5*time.Minute, true
		info, err := b.Create(ctx, req)
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		return info
	}
	// reach says whether the sandbox opens a TCP connection to addr:port
	// within 3 s (bash's /dev/tcp: no tool the template may lack).
	reach := func(info sandbox.Info, host string, port int) bool {
		t.Helper()
		tr, err := b.EnvdTransport(info.ID)
		if err != nil {
			t.Fatal(err)
		}
		out, _ := testenv.RunCommand(t, tr, info.AccessToken,
			fmt.Sprintf("timeout 3 bash -c 'exec 3<>/dev/tcp/%s/%d' 2>/dev/null && echo open || echo closed", host, port))
		return strings.TrimSpace(out) == "open"
	}
	resolve := func(info sandbox.Info, name string) string {
		t.Helper()
		tr, _ := b.EnvdTransport(info.ID)
		out, _ := testenv.RunCommand(t, tr, info.AccessToken, "getent ahostsv4 "+name+" | head -n 1 | cut -d' ' -f1")
		return strings.TrimSpace(out)
	}
	expect := func(info sandbox.Info, what string, host string, port int, open bool) {
		t.Helper()
		if got := reach(info, host, port); got != open {
			t.Errorf("sandbox %s, %s (%s:%d): reached=%v, want %v", info.ID, what, host, port, got, open)
		}
	}

	// The default policy: public open, private and the node closed.
	def := create(sandbox.CreateRequest{})
	expect(def, "a public host", netpolicytest.Web1.String(), 80, true)
	for _, a := range netpolicytest.PrivateHosts {
		expect(def, "a private host", a.String(), 80, false)
	}
	expect(def, "the metadata look-alike", netpolicytest.Metadata.String(), 80, false)
	// The node itself: a listener of the test's on every host address.
	l, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	expect(def, "the node", kubetest.Gateway, l.Addr().(*net.TCPAddr).Port, false)
	if got := resolve(def, "allowed.test"); got != netpolicytest.Allowed.String() {
		t.Errorf("DNS through the agent's filter: allowed.test is %q", got)
	}

	// allowOut wins over a denied-all: an allowed domain (resolved and
	// opened), an allowed private address; nothing else, not even DNS of
	// other names.
	no := false
	closed := create(sandbox.CreateRequest{AllowInternetAccess: &no,
		Network: &sandbox.NetworkConfig{AllowOut: []string{"allowed.test", netpolicytest.Private192.String()}}})
	if got := resolve(closed, "allowed.test"); got != netpolicytest.Allowed.String() {
		t.Errorf("a denied-all sandbox's allowed domain resolves to %q", got)
	}
	expect(closed, "its allowed domain", "allowed.test", 80, true)
	expect(closed, "its allowed private address", netpolicytest.Private192.String(), 80, true)
	expect(closed, "a public host", netpolicytest.Web1.String(), 80, false)
	if got := resolve(closed, "blocked.test"); got != "" {
		t.Errorf("a denied-all sandbox resolved blocked.test to %q", got)
	}
	expect(closed, "another domain's address", netpolicytest.Blocked.String(), 80, false)

	// denyOut by CIDR, beside public hosts left open.
	denied := create(sandbox.CreateRequest{Network: &sandbox.NetworkConfig{DenyOut: []string{netpolicytest.Web1.String() + "/32"}}})
	expect(denied, "its denied address", netpolicytest.Web1.String(), 80, false)
	expect(denied, "another public host", netpolicytest.Web2.String(), 80, true)

	// An update reaches the running Pod; the record and the event say it.
	if err := b.UpdateNetwork(ctx, def.ID, sandbox.NetworkUpdate{AllowInternetAccess: &no}); err != nil {
		t.Fatal(err)
	}
	expect(def, "a public host after the update", netpolicytest.Web1.String(), 80, false)
	if got, err := b.Get(ctx, def.ID); err != nil || got.AllowInternetAccess == nil || *got.AllowInternetAccess {
		t.Errorf("the record after the update: %+v, %v", got, err)
	}
	if pol, ok := agent.Network().Policy(def.ID); !ok || len(pol.DenyOut) != 1 || pol.DenyOut[0] != netpolicy.AllTraffic {
		t.Errorf("the agent's policy of %s after the update: %+v (%v)", def.ID, pol, ok)
	}

	// A warm Pod claimed with a policy (the pool's one was made and judged
	// by the default policy first).
	testenv.Eventually(t, 2*time.Minute, "the warm Pod ready", func() bool { return b.WarmReady(ctx, "base") == 1 })
	warm := create(sandbox.CreateRequest{Network: &sandbox.NetworkConfig{DenyOut: []string{netpolicytest.Web2.String()}}})
	if pod, err := c.Client.CoreV1().Pods(ns).Get(ctx, kube.PodName(warm.ID), metav1.GetOptions{}); err != nil || pod.Labels[kube.LabelWarm] != "" || pod.Annotations[kube.AnnotationNetworkApplied] == "" {
		t.Fatalf("the claimed warm Pod: %v %+v", err, pod)
	}
	expect(warm, "its denied address", netpolicytest.Web2.String(), 80, false)
	expect(warm, "another public host", netpolicytest.Web1.String(), 80, true)
	if err := b.UpdateNetwork(ctx, warm.ID, sandbox.NetworkUpdate{AllowInternetAccess: &no}); err != nil {
		t.Fatal(err)
	}
	if pod, err := c.Client.CoreV1().Pods(ns).Get(ctx, kube.PodName(warm.ID), metav1.GetOptions{}); err != nil || pod.Annotations[kube.AnnotationNetwork] != `{"denyOut":["0.0.0.0/0"]}` {
		t.Fatalf("the claimed warm Pod after an update: %v %v", err, pod.Annotations)
	}
	expect(warm, "another public host after the update", netpolicytest.Web1.String(), 80, false)

	// What a node cannot enforce is refused before anything is made.
	_, err = b.Create(ctx, sandbox.CreateRequest{Template: "base", Timeout: time.Minute,
		Network: &sandbox.NetworkConfig{Rules: map[string][]netpolicy.Rule{"api.test": {{}}}}})
	if !errors.Is(err, sandbox.ErrNotSupported) {
		t.Errorf("network rules on a Pod: %v", err)
	}

	// Kills leave no elements behind in the agent's table.
	for _, info := range []sandbox.Info{def, closed, denied, warm} {
		if err := b.Kill(ctx, info.ID); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, time.Minute, "the killed Pods' elements removed", func() bool {
		for id := range agent.Network().Pods() {
			if id == def.ID || id == closed.ID || id == denied.ID || id == warm.ID {
				return false
			}
		}
		return true
	})

	// Without an agent a create fails within the wait, saying so, and
	// leaves nothing.
	stop()
	stopAgent()
	other := c.Namespace(t)
	lone := backend(t, c, other, true)
	lone.Templates = baseTemplate(ref)
	lctx, lstop := context.WithCancel(ctx)
	defer lstop()
	if err := lone.Start(lctx); err != nil {
		t.Fatal(err)
	}
	_, err = lone.Create(ctx, sandbox.CreateRequest{Template: "base", Timeout: time.Minute})
	if err == nil || !strings.Contains(err.Error(), "no node agent applied its network policy") {
		t.Fatalf("a create with no agent: %v", err)
	}
	testenv.Eventually(t, time.Minute, "nothing left of the refused create", func() bool {
		pods, err := c.Client.CoreV1().Pods(other).List(ctx, metav1.ListOptions{})
		return err == nil && len(pods.Items) == 0
	})
}

// TestAgentRestart: a restarted agent installs its table with the node's
// Pods in one go, each under the policy its annotation names.
func TestAgentRestart(t *testing.T) {
	c := kubetest.Start(t)
	ns := c.Namespace(t)
	ctx := context.Background()
	nodes, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil || len(nodes.Items) != 1 {
		t.Fatalf("the test cluster's node: %v", err)
	}
	cfg := nodeagent.Config{Client: c.Client, Namespace: ns, Node: nodes.Items[0].Name,
		Net: netpolicy.PodConfig{Table: "airlock_pods_restart", DNSUpstreams: []string{"127.0.0.1:53"}}}
	actx, stopAgent := context.WithCancel(ctx)
	agent, err := nodeagent.Start(actx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer removeTable(t, agent)
	b := backend(t, c, ns, true)
	b.Templates = baseTemplate(kubetest.BaseImage(t))
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	if err := b.Start(wctx); err != nil {
		t.Fatal(err)
	}
	info, err := b.Create(ctx, sandbox.CreateRequest{Template: "base", Timeout: 5 * time.Minute,
		Network: &sandbox.NetworkConfig{DenyOut: []string{"198.51.100.0/24"}}})
	if err != nil {
		t.Fatal(err)
	}
	stopAgent()
	actx2, stopAgent2 := context.WithCancel(ctx)
	defer stopAgent2()
	again, err := nodeagent.Start(actx2, cfg)
	if err != nil {
		t.Fatal(err)
	}
	pol, ok := again.Network().Policy(info.ID)
	if !ok || len(pol.DenyOut) != 1 || pol.DenyOut[0] != "198.51.100.0/24" {
		t.Fatalf("the restarted agent's policy of %s: %+v (%v)", info.ID, pol, ok)
	}
	if err := b.Kill(ctx, info.ID); err != nil {
		t.Fatal(err)
	}
}

func backend(t *testing.T, c *kubetest.Cluster, ns string, agent bool) *kube.Backend {
	t.Helper()
	st, err := store.OpenSQLite(filepath.Join(t.TempDir(), "airlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return &kube.Backend{
		Records: st, Events: store.NewLifecycleEvents(st), Samples: st, NodeAgent: agent,
		Pods: &kube.Pods{Client: c.Client, Namespace: ns, RuntimeClass: "gvisor", Ready: time.Minute, CPURequest: 0.01},
	}
}

func baseTemplate(ref string) func(context.Context, string) (kube.Template, error) {
	return func(_ context.Context, name string) (kube.Template, error) {
		if name != "base" {
			return kube.Template{}, sandbox.ErrTemplateNotFound
		}
		return kube.Template{ID: "base", Alias: "base", Image: ref, CPUs: 1, MemoryMB: 512, DiskSizeMB: 1024, DefaultUser: "user"}, nil
	}
}

// forwarding turns IPv4 forwarding on for the test if it is off (the node
// forwards its Pods' traffic), and back off after.
func forwarding(t *testing.T) {
	const path = "/proc/sys/net/ipv4/ip_forward"
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(b)) == "1" {
		return
	}
	if err := os.WriteFile(path, []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.WriteFile(path, []byte("0"), 0o644) })
}

// removeTable deletes the agent's table once the test is done (an agent
// leaves it in place on purpose).
func removeTable(t *testing.T, a *nodeagent.Agent) {
	if err := a.Network().RemoveTable(); err != nil {
		t.Errorf("removing the agent's table: %v", err)
	}
}
