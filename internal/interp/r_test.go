package interp

import (
	"context"
	"encoding/base64"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// What only the R backend has; the contract is checked by TestRConformance.

// startRTest starts IRkernel as the test's user with env as the sandbox's env.
func startRTest(t *testing.T, env []string) Kernel {
	t.Helper()
	if _, err := exec.LookPath("R"); err != nil {
		testenv.Missing(t, "no R on this host (scripts/setup-test.sh installs r-base-core and r-cran-irkernel)")
	}
	if _, err := readKernelspec("ir"); err != nil {
		testenv.Missing(t, "no IRkernel kernelspec on this host: %v", err)
	}
	home := t.TempDir()
	opts := Options{
		Language: "r", Cwd: t.TempDir(), UID: uint32(os.Getuid()), GID: uint32(os.Getgid()), Home: home,
		Env: append([]string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + home}, env...), RunDir: t.TempDir(),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	k, err := StartR(ctx, opts)
	if err != nil {
		t.Fatalf("start R: %v", err)
	}
	t.Cleanup(func() { k.Close() })
	return k
}

func runR(t *testing.T, k Kernel, code string, env map[string]string) []Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var events []Event
	if _, err := k.Execute(ctx, code, env, func(e Event) { events = append(events, e) }); err != nil {
		t.Fatalf("execute %q: %v", code, err)
	}
	return events
}

func rStdout(events []Event) string {
	var b strings.Builder
	for _, e := range events {
		if e.Type == "stdout" {
			b.WriteString(e.Text)
		}
	}
	return b.String()
}

func rResults(events []Event) []Event {
	var out []Event
	for _, e := range events {
		if e.Type == "result" {
			out = append(out, e)
		}
	}
	return out
}

// Values, plots and data frames come in IRkernel's shapes, which E2B's R tests expect.
func TestRResults(t *testing.T) {
	k := startRTest(t, []string{"LANG=C.UTF-8"})
	if got := rStdout(runR(t, k, `print("Hello, World!")`, nil)); got != "[1] \"Hello, World!\"\n" {
		t.Errorf("print: stdout %q", got)
	}
	res := rResults(runR(t, k, "x <- 41\nx + 1", nil))
	if len(res) != 1 || res[0].Data["text/plain"] != "[1] 42" {
		t.Errorf("a visible value: %v", res)
	}
	res = rResults(runR(t, k, "plot(1:10)", nil))
	if len(res) != 1 {
		t.Fatalf("plot: %d results, want 1: %v", len(res), res)
	}
	png, _ := res[0].Data["image/png"].(string)
	if b, err := base64.StdEncoding.DecodeString(png); err != nil || !strings.HasPrefix(string(b), "\x89PNG") {
		t.Errorf("plot: image/png is no PNG (%v)", err)
	}
	res = rResults(runR(t, k, `data.frame(a = 1:2, b = c("x", "y"))`, nil))
	if len(res) != 1 {
		t.Fatalf("data.frame: %d results, want 1", len(res))
	}
	for _, mime := range []string{"text/plain", "text/html", "text/markdown", "text/latex"} {
		if _, ok := res[0].Data[mime].(string); !ok {
			t.Errorf("data.frame: no %s in %v", mime, res[0].Data)
		}
	}
}

// An execution's env reaches R byte for byte, whatever it holds.
func TestREnvValues(t *testing.T) {
	k := startRTest(t, []string{"LANG=C.UTF-8"})
	values := []string{
		`it's "q" \n \\ $HOME`, "line\nbreak\ttab\rcr", "é ü 日本 🙂", "\x01\x1b[0m", "`backtick` %s %% {}",
	}
	for _, v := range values {
		got := rStdout(runR(t, k, `cat(Sys.getenv("AIRLOCK_R_VALUE"))`, map[string]string{"AIRLOCK_R_VALUE": v}))
		if got != v {
			t.Errorf("env value %q reads %q", v, got)
		}
	}
	if got := rStdout(runR(t, k, `cat(Sys.getenv("AIRLOCK_R_VALUE", unset = "unset"))`, nil)); got != "unset" {
		t.Errorf("after the executions: %q, want it unset", got)
	}
}

// Without a locale in the sandbox's env R still speaks UTF-8, as in E2B's image.
func TestRDefaultsToUTF8(t *testing.T) {
	k := startRTest(t, nil)
	if got := rStdout(runR(t, k, `cat("é\n"); cat(Sys.getenv("LANG"), "\n")`, nil)); got != "é\nC.UTF-8 \n" {
		t.Errorf("stdout %q", got)
	}
}

// IRkernel answers heartbeats only between requests: a cell that runs longer than the
// heartbeat limit is not a dead kernel.
func TestRLongCellIsNotDeath(t *testing.T) {
	every, limit := jupyterHeartbeatEvery, jupyterHeartbeatLimit
	jupyterHeartbeatEvery, jupyterHeartbeatLimit = 50*time.Millisecond, 300*time.Millisecond
	t.Cleanup(func() { jupyterHeartbeatEvery, jupyterHeartbeatLimit = every, limit })
	k := startRTest(t, []string{"LANG=C.UTF-8"})
	if got := rStdout(runR(t, k, "Sys.sleep(1.5)\ncat(\"done\\n\")", nil)); got != "done\n" {
		t.Errorf("stdout %q", got)
	}
	if got := rStdout(runR(t, k, `cat("alive\n")`, nil)); got != "alive\n" {
		t.Errorf("next cell: stdout %q", got)
	}
}
