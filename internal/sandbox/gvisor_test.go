package sandbox_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/runtime/gvisor"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// twoRuntimes resolves "base" to the server default (linux) and "base-gvisor"
// to the same rootfs with the template setting runtime: gvisor.
type twoRuntimes struct{ tpl sandbox.Template }

func (t twoRuntimes) Resolve(_ context.Context, name string) (sandbox.Template, error) {
	switch name {
	case "base":
		return t.tpl, nil
	case "base-gvisor":
		tpl := t.tpl
		tpl.ID, tpl.Alias, tpl.Runtime = "base-gvisor", "base-gvisor", "gvisor"
		return tpl, nil
	}
	return sandbox.Template{}, sandbox.ErrTemplateNotFound
}

// files reads (GET) or writes (POST) a file through envd's /files endpoint, as
// the SDKs' files.read and files.write do.
func files(t *testing.T, m *sandbox.Manager, info sandbox.Info, method, path, body string) (int, string) {
	t.Helper()
	tr, err := m.EnvdTransport(info.ID)
	if err != nil {
		t.Fatalf("EnvdTransport: %v", err)
	}
	req, _ := http.NewRequest(method, "http://envd/files?username=user&path="+path, strings.NewReader(body))
	req.Header.Set("X-Access-Token", info.AccessToken)
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "application/octet-stream")
	}
	resp, err := (&http.Client{Transport: tr, Timeout: 20 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("%s /files: %v", method, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestGVisorTemplate checks that a template whose runtime is gvisor gives a
// sandbox on gVisor, next to a linux one from the same server, where envd runs
// commands (sudo too) and moves files, that pause, re-adoption after a restart
// and kill work, and that kill leaves nothing of it.
func TestGVisorTemplate(t *testing.T) {
	r := newRig(t)
	testenv.NeedRunsc(t)
	gv, err := gvisor.New(filepath.Join(r.dataDir, "runtime-gvisor"), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	opts := sandbox.Options{
		Runtime: r.rt, Runtimes: []runtime.Runtime{gv}, Store: r.db, Templates: twoRuntimes{r.tpl},
		DataDir: r.dataDir, EnvdPath: r.envd, MaxTimeout: time.Hour,
	}
	first := sandbox.New(opts)
	first.Start()
	closed := false
	t.Cleanup(func() {
		if !closed {
			first.KillAll(ctx)
			first.Close()
		}
	})
	info, err := first.Create(ctx, sandbox.CreateRequest{
		Template: "base-gvisor", Timeout: time.Minute, Secure: true, EnvVars: map[string]string{"FOO": "bar"},
	})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	// Whatever happens below, the sandbox must not outlive the test.
	t.Cleanup(func() {
		if sb, err := gv.Load(info.ID); err == nil {
			_ = sb.Destroy(ctx)
		}
	})
	if _, err := gv.Load(info.ID); err != nil {
		t.Fatalf("the gvisor backend does not hold the sandbox: %v", err)
	}
	if _, err := r.rt.Load(info.ID); err == nil {
		t.Fatalf("the sandbox was created by the linux backend")
	}
	plain := create(t, first, time.Minute)
	if _, err := r.rt.Load(plain.ID); err != nil {
		t.Fatalf("a template without runtime did not get the default backend: %v", err)
	}

	out, code := run(t, first, info, `echo "$FOO $(whoami) $HOME"; dmesg | head -n 1`)
	if code != 0 || !strings.HasPrefix(out, "bar user /home/user\n") {
		t.Fatalf("command output %q (exit %d)", out, code)
	}
	// gVisor's kernel log opens with its own banner: proof of the sentry.
	if !strings.Contains(out, "gVisor") {
		t.Errorf("dmesg does not show gVisor: %q", out)
	}
	if code, body := files(t, first, info, http.MethodPost, "up.txt", "uploaded"); code != http.StatusOK {
		t.Fatalf("upload: %d %s", code, body)
	}
	if out, _ := run(t, first, info, "cat ~/up.txt; echo made > ~/down.txt"); out != "uploaded" {
		t.Fatalf("uploaded file reads %q", out)
	}
	if code, body := files(t, first, info, http.MethodGet, "down.txt", ""); code != http.StatusOK || body != "made\n" {
		t.Fatalf("download: %d %q", code, body)
	}

	if err := first.Pause(ctx, info.ID, sandbox.PauseOptions{}); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if _, resumed, err := first.Connect(ctx, info.ID, time.Minute); err != nil || !resumed {
		t.Fatalf("Connect after Pause: resumed=%v err=%v", resumed, err)
	}

	// A restart: the next server finds the sandbox in the gvisor backend.
	first.Close()
	closed = true
	second := sandbox.New(opts)
	t.Cleanup(func() {
		second.KillAll(ctx)
		second.Close()
	})
	if err := second.Recover(ctx); err != nil {
		t.Fatalf("Recover: %v", err)
	}
	second.Start()
	if out, _ := run(t, second, info, "cat ~/down.txt"); out != "made\n" {
		t.Fatalf("re-adopted gvisor sandbox: %q", out)
	}

	if err := second.Kill(ctx, info.ID); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if _, err := gv.Load(info.ID); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("runsc still holds the sandbox after Kill: %v", err)
	}
	if _, err := os.Stat(filepath.Join(r.dataDir, "sandboxes", info.ID)); !os.IsNotExist(err) {
		t.Errorf("sandbox dir survived Kill: %v", err)
	}
	for _, ctrl := range []string{"memory", "cpu", "pids"} {
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", ctrl, gvisor.CgroupParent, info.ID)); !os.IsNotExist(err) {
			t.Errorf("%s cgroup survived Kill: %v", ctrl, err)
		}
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), info.ID) {
		t.Errorf("a mount of the sandbox survived Kill")
	}
}
