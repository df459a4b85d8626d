package daemon_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/daemon"
	"github.com/airlock-sandbox/airlock/internal/daemon/daemontest"
	"github.com/airlock-sandbox/airlock/internal/e2bclient"
	"github.com/airlock-sandbox/airlock/internal/e2bwire"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// scrape reads the server's metrics page.
func scrape(t *testing.T, d *daemon.Daemon) string {
	t.Helper()
	resp, err := http.Get(d.MetricsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d, %v", d.MetricsURL, resp.StatusCode, err)
	}
	return string(body)
}

// sample is the value of the series whose line starts with series (its name
// and labels exactly as exposed), or -1 when there is none.
func sample(page, series string) float64 {
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindStringSubmatch(page)
	if m == nil {
		return -1
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// The admin listener serves metrics that count every sandbox operation by
// outcome (whoever asked: here the manager directly, as the MCP server and
// timeouts do), show the sandboxes by state and template, the host's
// headroom and, on request, each sandbox's use; and the page passes
// Prometheus' own lint.
func TestMetrics(t *testing.T) {
	d := daemontest.Start(t, func(c *daemon.Config) {
		c.MetricsAddr = "127.0.0.1:0"
		c.MetricsPerSandbox = true
	})
	if d.MetricsURL == "" {
		t.Fatal("no MetricsURL with MetricsAddr set")
	}
	ctx := context.Background()
	before := scrape(t, d)
	for _, s := range []string{
		`airlock_sandbox_operations_total{operation="create",outcome="ok"}`,
		`airlock_sandbox_operations_total{operation="kill",outcome="client_error"}`,
	} {
		if v := sample(before, s); v != 0 {
			t.Errorf("%s before any operation = %v, want 0", s, v)
		}
	}

	// A sandbox made over the API, and traffic to it through the proxy: a
	// file written and read back.
	c := e2bclient.New(e2bclient.Config{APIURL: d.APIURL, SandboxURL: d.SandboxURL, APIKey: daemontest.Key})
	sb, err := c.Create(ctx, e2bwire.NewSandbox{TemplateID: "base"})
	if err != nil {
		t.Fatal(err)
	}
	info, err := d.Manager.Get(ctx, sb.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	content := make([]byte, 64<<10) // random: a compressed transfer would be smaller
	if _, err := rand.Read(content); err != nil {
		t.Fatal(err)
	}
	s := c.Sandbox(sb.SandboxID, sb.EnvdAccessToken)
	if err := s.WriteFile(ctx, "/tmp/metrics-test", bytes.NewReader(content)); err != nil {
		t.Fatal(err)
	}
	rc, err := s.ReadFile(ctx, "/tmp/metrics-test")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := io.ReadAll(rc); err != nil || !bytes.Equal(got, content) {
		t.Fatalf("read back %d bytes, %v", len(got), err)
	}
	rc.Close()
	if err := d.Manager.Kill(ctx, "nosuchsandbox00000000"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("Kill of an unknown sandbox: %v", err)
	}
	if _, err := d.Manager.Create(ctx, sandbox.CreateRequest{Template: "nosuchtemplate", Timeout: time.Minute}); err == nil {
		t.Fatal("Create of an unknown template succeeded")
	}
	page := scrape(t, d)
	for s, want := range map[string]float64{
		`airlock_sandbox_operations_total{operation="create",outcome="ok"}`:           1,
		`airlock_sandbox_operations_total{operation="create",outcome="client_error"}`: 1,
		`airlock_sandbox_operations_total{operation="kill",outcome="client_error"}`:   1,
		`airlock_sandbox_operation_duration_seconds_count{operation="create"}`:        2,
		`airlock_sandboxes{state="running",template="` + info.TemplateID + `"}`:       1,
	} {
		if got := sample(page, s); got != want {
			t.Errorf("%s = %v, want %v", s, got, want)
		}
	}
	if v := sample(page, `airlock_proxy_requests_total{kind="envd"}`); v < 2 {
		t.Errorf("envd requests through the proxy = %v, want at least the write and the read", v)
	}
	for _, dir := range []string{"to_sandbox", "from_sandbox"} {
		if v := sample(page, `airlock_proxy_bytes_total{direction="`+dir+`"}`); v < float64(len(content)) {
			t.Errorf("proxy bytes %s = %v, want at least the %d of the file", dir, v, len(content))
		}
	}
	for _, s := range []string{"airlock_host_memory_available_bytes", "airlock_host_data_dir_free_bytes", "airlock_host_cpus"} {
		if v := sample(page, s); v <= 0 {
			t.Errorf("%s = %v, want a positive value", s, v)
		}
	}
	// Per-sandbox series appear once the sandbox has a sample.
	testenv.Eventually(t, 20*time.Second, "a memory sample of the sandbox in the metrics", func() bool {
		page = scrape(t, d)
		return sample(page, `airlock_sandbox_memory_used_bytes{sandbox_id="`+info.ID+`",template="`+info.TemplateID+`"}`) > 0
	})

	if err := d.Manager.Kill(ctx, info.ID); err != nil {
		t.Fatal(err)
	}
	page = scrape(t, d)
	if v := sample(page, `airlock_sandbox_operations_total{operation="kill",outcome="ok"}`); v != 1 {
		t.Errorf("kills ok after one kill = %v", v)
	}
	if strings.Contains(page, `airlock_sandboxes{state="running"`) || strings.Contains(page, info.ID) {
		t.Errorf("a killed sandbox is still in the metrics:\n%s", grepLines(page, "airlock_sandbox"))
	}
	promtoolCheck(t, page)
}

// promtoolCheck lints an exposition with `promtool check metrics` (Debian's
// prometheus package; scripts/setup-test.sh installs it).
func promtoolCheck(t *testing.T, page string) {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		testenv.Missing(t, "promtool is not installed (scripts/setup-test.sh installs Debian's prometheus)")
		return
	}
	cmd := exec.Command(path, "check", "metrics")
	cmd.Stdin = strings.NewReader(page)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Errorf("promtool check metrics: %v\n%s", err, out.String())
	}
}

func grepLines(page, prefix string) string {
	var out []string
	for _, l := range strings.Split(page, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// Without MetricsAddr there is no admin listener.
func TestNoMetricsListener(t *testing.T) {
	d := daemontest.Start(t, nil)
	if d.MetricsURL != "" {
		t.Errorf("MetricsURL %q without MetricsAddr", d.MetricsURL)
	}
}
