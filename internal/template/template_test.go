package template_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/ociimage"
	"github.com/airlock-sandbox/airlock/internal/ociimage/ocitest"
	"github.com/airlock-sandbox/airlock/internal/runtime/linux"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/template"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

func init() { linux.MaybeInit() }

func TestMain(m *testing.M) { os.Exit(m.Run()) }

// These tests build real templates (FROM the built base template, in the test data
// dir, under unique names removed at the end) with real build sandboxes, and check
// the results inside real sandboxes.

// storeFor opens the test data dir's template store with envd for RUN steps.
func storeFor(t *testing.T) *template.Store {
	t.Helper()
	testenv.NeedRoot(t)
	testenv.BaseRootfs(t)
	s, err := template.Open(template.Options{DataDir: testenv.DataDir(), EnvdPath: testenv.EnvdBinary(t)})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// uniqueName gives a test template a name no other run uses, removed at cleanup.
func uniqueName(t *testing.T, s *template.Store, prefix string) string {
	t.Helper()
	name := fmt.Sprintf("test-%s-%d", prefix, time.Now().UnixNano()%1_000_000_000)
	t.Cleanup(func() {
		if err := s.Remove(context.Background(), name, nil); err != nil && !errors.Is(err, template.ErrNotFound) {
			t.Errorf("remove %s: %v", name, err)
		}
	})
	return name
}

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		mode := os.FileMode(0o644)
		if strings.HasPrefix(content, "#!") {
			mode = 0o755
		}
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
	}
}

func tarGz(t *testing.T, files map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for name, content := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(content)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(content))
	}
	tw.Close()
	zw.Close()
	return buf.Bytes()
}

func build(t *testing.T, s *template.Store, req template.BuildRequest) (template.Template, string) {
	t.Helper()
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tpl, err := s.Build(ctx, req, &out)
	if err != nil {
		t.Fatalf("build %s: %v\noutput:\n%s", req.Name, err, out.String())
	}
	return tpl, out.String()
}

// sandboxes is a real sandbox manager over the store (what serve wires).
func sandboxes(t *testing.T, s *template.Store) *sandbox.Manager {
	t.Helper()
	dataDir := t.TempDir()
	db, err := store.OpenSQLite(filepath.Join(dataDir, "airlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	rt, err := linux.New(filepath.Join(dataDir, "runtime"), nil)
	if err != nil {
		t.Fatal(err)
	}
	m := sandbox.New(sandbox.Options{
		Runtime: rt, Store: db, Templates: template.Resolver{Store: s}, DataDir: dataDir,
		EnvdPath: testenv.EnvdBinary(t), MaxTimeout: time.Hour,
	})
	m.Start()
	t.Cleanup(func() {
		m.KillAll(context.Background())
		m.Close()
	})
	return m
}

func createFrom(t *testing.T, m *sandbox.Manager, name string) sandbox.Info {
	t.Helper()
	info, err := m.Create(context.Background(), sandbox.CreateRequest{Template: name, Timeout: 5 * time.Minute, Secure: true})
	if err != nil {
		t.Fatalf("create from %s: %v", name, err)
	}
	return info
}

func runIn(t *testing.T, m *sandbox.Manager, info sandbox.Info, cmd string) string {
	t.Helper()
	tr, err := m.EnvdTransport(info.ID)
	if err != nil {
		t.Fatal(err)
	}
	out, code := testenv.RunCommand(t, tr, info.AccessToken, cmd)
	if code != 0 {
		t.Fatalf("%q exited %d: %s", cmd, code, out)
	}
	return strings.TrimSpace(out)
}

const everyInstruction = `# A template that uses every instruction Airlock supports.
ARG PARENT=base
FROM ${PARENT}
ARG GREETING=hello
ENV APP_HOME=/opt/app \
    MODE=test
ENV LEGACY value with spaces
WORKDIR $APP_HOME
COPY app/ ./
COPY --chown=user:user notes.txt /home/user/notes.txt
ADD bundle.tar.gz /opt/bundle/
RUN echo "$GREETING from $(whoami) in $(pwd)" > built.txt \
 && ./bin/tool > tool.out
USER user
WORKDIR /home/user/work
RUN echo "$GREETING as $(id -u) mode $MODE" > whoami.txt
`

func everyInstructionContext(t *testing.T, notes string) string {
	t.Helper()
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"Dockerfile":     everyInstruction,
		"app/bin/tool":   "#!/bin/sh\necho tool-ok\n",
		"app/readme.txt": "read me\n",
		"notes.txt":      notes,
	})
	if err := os.WriteFile(filepath.Join(dir, "bundle.tar.gz"), tarGz(t, map[string]string{"inner/file.txt": "from the bundle\n"}), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestBuildEveryInstructionAndCache(t *testing.T) {
	s := storeFor(t)
	name := uniqueName(t, s, "every")
	dir := everyInstructionContext(t, "first notes\n")
	req := template.BuildRequest{
		Name: name, Dockerfile: []byte(everyInstruction), DockerfilePath: filepath.Join(dir, "Dockerfile"),
		ContextDir: dir, Settings: template.Settings{MemoryMB: 256, BuildArgs: map[string]string{"GREETING": "hi"}},
	}
	tpl, out := build(t, s, req)
	t.Logf("first build:\n%s", out)
	if tpl.Settings.DefaultUser != "user" || tpl.Settings.DefaultWorkdir != "/home/user/work" || tpl.Settings.MemoryMB != 256 {
		t.Errorf("settings: %+v", tpl.Settings)
	}
	env := strings.Join(tpl.Config.Env, "\n")
	for _, want := range []string{"APP_HOME=/opt/app", "MODE=test", "LEGACY=value with spaces"} {
		if !strings.Contains(env, want) {
			t.Errorf("image env lacks %s: %v", want, tpl.Config.Env)
		}
	}
	if strings.Contains(env, "GREETING") {
		t.Errorf("an ARG leaked into the image env: %v", tpl.Config.Env)
	}

	m := sandboxes(t, s)
	info := createFrom(t, m, name)
	checks := map[string]string{
		"cat /opt/app/built.txt":                                  "hi from root in /opt/app",
		"cat /opt/app/tool.out":                                   "tool-ok",
		"cat /opt/app/readme.txt; stat -c %U /opt/app/readme.txt": "read me\nroot",
		"stat -c %U:%G /home/user/notes.txt":                      "user:user",
		"cat /opt/bundle/inner/file.txt":                          "from the bundle",
		"cat /home/user/work/whoami.txt":                          "hi as 1000 mode test",
		"whoami; pwd":                                             "user\n/home/user/work",
		`echo "$APP_HOME|$MODE|$LEGACY|${GREETING:-unset}"`:       "/opt/app|test|value with spaces|unset",
		"stat -c %U /home/user/work":                              "user",
		"test -L /bin && echo merged-usr intact":                  "merged-usr intact",
	}
	for cmd, want := range checks {
		if got := runIn(t, m, info, cmd); got != want {
			t.Errorf("%s: got %q, want %q", cmd, got, want)
		}
	}
	if err := m.Kill(context.Background(), info.ID); err != nil {
		t.Fatal(err)
	}

	// Unchanged: every layer from the cache.
	again, out := build(t, s, req)
	for i, l := range again.Layers[len(again.Layers)-8:] {
		if !l.Cached {
			t.Errorf("unchanged rebuild remade layer %d (%s)\n%s", i, l.Text, out)
		}
	}
	if again.Key != tpl.Key {
		t.Errorf("unchanged rebuild changed the top layer: %s -> %s", tpl.Key, again.Key)
	}

	// notes.txt changed: steps before its COPY come from the cache, it and all
	// after it are rebuilt.
	writeFiles(t, dir, map[string]string{"notes.txt": "second notes\n"})
	changed, out := build(t, s, req)
	var texts []string
	sawMiss := false
	for _, l := range changed.Layers {
		texts = append(texts, fmt.Sprintf("%v %s", l.Cached, l.Text))
		if strings.Contains(l.Text, "notes.txt") {
			sawMiss = true
			if l.Cached {
				t.Errorf("the changed COPY came from the cache")
			}
			continue
		}
		if sawMiss && l.Cached {
			t.Errorf("a step after the changed one came from the cache: %s", l.Text)
		}
		if !sawMiss && !l.Cached {
			t.Errorf("a step before the changed one was rebuilt: %s", l.Text)
		}
	}
	if !sawMiss {
		t.Fatalf("no COPY notes.txt layer in %v\n%s", texts, out)
	}
	info = createFrom(t, m, name)
	if got := runIn(t, m, info, "cat /home/user/notes.txt"); got != "second notes" {
		t.Errorf("notes after rebuild: %q", got)
	}
}

func TestBuildRejectsBadInput(t *testing.T) {
	s := storeFor(t)
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"ok.txt": "x"})
	outside := t.TempDir()
	writeFiles(t, outside, map[string]string{"secret.txt": "secret"})
	if err := os.Symlink(filepath.Join(outside, "secret.txt"), filepath.Join(dir, "link.txt")); err != nil {
		t.Fatal(err)
	}
	name := uniqueName(t, s, "bad")
	cases := []struct {
		name, dockerfile string
		want             []string
		is               error
	}{
		{"malformed", "FROM base\nRUN true\nENV\n", []string{"line 3"}, template.ErrInvalid},
		{"unknown instruction", "FROM base\n\n# comment\nEXPOSE 80\n", []string{"line 4", "EXPOSE"}, template.ErrInvalid},
		{"unknown from", "FROM no-such-template-here\n", []string{"line 1", "no-such-template-here"}, template.ErrInvalid},
		{"other debian", "FROM debian:buster\n", []string{"line 1", "bookworm"}, template.ErrInvalid},
		{"copy outside", "FROM base\nCOPY ../../etc/passwd /x\n", []string{"outside"}, template.ErrInvalid},
		{"copy through symlink", "FROM base\nCOPY link.txt /x\n", []string{"outside"}, template.ErrInvalid},
		{"no from", "RUN true\n", []string{"FROM"}, template.ErrInvalid},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := s.Build(context.Background(), template.BuildRequest{
				Name: name, Dockerfile: []byte(c.dockerfile), DockerfilePath: filepath.Join(dir, "Dockerfile"), ContextDir: dir,
			}, nil)
			if err == nil {
				t.Fatal("build succeeded")
			}
			if !errors.Is(err, c.is) {
				t.Errorf("error %v is not %v", err, c.is)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
	if _, err := s.Get(name); !errors.Is(err, template.ErrNotFound) {
		t.Errorf("failed builds left a template behind: %v", err)
	}

	for _, bad := range []string{"Bad_Name", "", "-x", strings.Repeat("a", 70), "a/b"} {
		_, err := s.Build(context.Background(), template.BuildRequest{Name: bad, Dockerfile: []byte("FROM base\n")}, nil)
		if !errors.Is(err, template.ErrInvalid) {
			t.Errorf("name %q: %v", bad, err)
		}
	}
	for _, taken := range []string{"base", "python"} {
		_, err := s.Build(context.Background(), template.BuildRequest{Name: taken, Dockerfile: []byte("FROM base\n")}, nil)
		if !errors.Is(err, template.ErrNameTaken) {
			t.Errorf("built-in name %q: %v", taken, err)
		}
	}
	// A name built from one Dockerfile is not silently replaced by another's.
	build(t, s, template.BuildRequest{Name: name, Dockerfile: []byte("FROM base\nENV A=1\n"), DockerfilePath: "/one/Dockerfile"})
	_, err := s.Build(context.Background(), template.BuildRequest{Name: name, Dockerfile: []byte("FROM base\nENV A=2\n"), DockerfilePath: "/two/Dockerfile"}, nil)
	if !errors.Is(err, template.ErrNameTaken) || !strings.Contains(err.Error(), "--replace") {
		t.Errorf("other Dockerfile, same name: %v", err)
	}
	tpl, _ := build(t, s, template.BuildRequest{Name: name, Dockerfile: []byte("FROM base\nENV A=2\n"), DockerfilePath: "/two/Dockerfile", Replace: true})
	if !strings.Contains(strings.Join(tpl.Config.Env, " "), "A=2") {
		t.Errorf("replaced template env: %v", tpl.Config.Env)
	}
}

func TestFailedStepReportsAndLeavesNothing(t *testing.T) {
	s := storeFor(t)
	name := uniqueName(t, s, "fail")
	layersBefore := layerDirs(t)
	df := "FROM base\nRUN echo one && echo two\nRUN echo 'about to fail' && echo 'last words' >&2 && exit 7\nRUN echo never\n"
	_, err := s.Build(context.Background(), template.BuildRequest{Name: name, Dockerfile: []byte(df)}, nil)
	var se *template.StepError
	if !errors.As(err, &se) {
		t.Fatalf("error %v is not a StepError", err)
	}
	if se.Step != 2 || se.Steps != 3 || se.Line != 3 || se.ExitCode != 7 {
		t.Errorf("step error %+v", se)
	}
	for _, want := range []string{"step 2/3", "line 3", "code 7", "about to fail", "last words"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q:\n%v", want, err)
		}
	}
	if _, err := s.Get(name); !errors.Is(err, template.ErrNotFound) {
		t.Errorf("a failed build left a template: %v", err)
	}
	for _, d := range layerDirs(t) {
		if strings.HasPrefix(d, ".tmp-") && !contains(layersBefore, d) {
			t.Errorf("failed build left %s", d)
		}
	}

	// Cancelled in the middle of a step: the step's sandbox dies, nothing stays.
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		time.Sleep(2 * time.Second)
		cancel()
	}()
	start := time.Now()
	_, err = s.Build(ctx, template.BuildRequest{Name: name, Dockerfile: []byte("FROM base\nRUN sleep 600\n")}, nil)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled build: %v", err)
	}
	if d := time.Since(start); d > time.Minute {
		t.Errorf("cancel took %s", d)
	}
	for _, d := range layerDirs(t) {
		if strings.HasPrefix(d, ".tmp-") && !contains(layersBefore, d) {
			t.Errorf("cancelled build left %s", d)
		}
	}
}

func TestStartAndReadyCommands(t *testing.T) {
	s := storeFor(t)
	ready := uniqueName(t, s, "ready")
	never := uniqueName(t, s, "never")
	m := sandboxes(t, s) // after the names: cleanups run last-first, sandboxes die before their templates go
	build(t, s, template.BuildRequest{
		Name: ready, Dockerfile: []byte("FROM base\nRUN mkdir -p /srv/www && echo served > /srv/www/index.html\n"),
		Settings: template.Settings{
			StartCmd: "sleep 1; exec python3 -m http.server 8080 --directory /srv/www",
			ReadyCmd: "curl -sf http://127.0.0.1:8080/index.html",
		},
	})
	info := createFrom(t, m, ready)
	// No waiting here: create returned, so the server answers.
	if got := runIn(t, m, info, "curl -sf http://127.0.0.1:8080/index.html"); got != "served" {
		t.Errorf("server after create: %q", got)
	}

	build(t, s, template.BuildRequest{
		Name: never, Dockerfile: []byte("FROM base\n"),
		Settings: template.Settings{StartCmd: "sleep 600", ReadyCmd: "test -e /nonexistent", ReadyTimeoutSec: 2},
	})
	start := time.Now()
	_, err := m.Create(context.Background(), sandbox.CreateRequest{Template: never, Timeout: time.Minute, Secure: true})
	if err == nil {
		t.Fatal("create from a never-ready template succeeded")
	}
	if !strings.Contains(err.Error(), "ready") || !strings.Contains(err.Error(), "test -e /nonexistent") {
		t.Errorf("error does not say which ready command failed: %v", err)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("failing took %s with a 2 s deadline", d)
	}
	list, err := m.List(context.Background(), sandbox.ListFilter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range list {
		if sb.TemplateID == never {
			t.Errorf("the failed sandbox is still listed: %+v", sb)
		}
	}
}

func TestRemoveRefusedWhileInUse(t *testing.T) {
	s := storeFor(t)
	name := uniqueName(t, s, "rm")
	m := sandboxes(t, s)
	tpl, _ := build(t, s, template.BuildRequest{Name: name, Dockerfile: []byte("FROM base\nRUN echo x > /x\n")})
	info := createFrom(t, m, name)
	err := s.Remove(context.Background(), name, nil)
	if !errors.Is(err, template.ErrInUse) {
		t.Fatalf("remove while a sandbox runs on it: %v", err)
	}
	if err := m.Kill(context.Background(), info.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(context.Background(), name, nil); err != nil {
		t.Fatalf("remove after kill: %v", err)
	}
	if _, err := os.Stat(tpl.RootFS); !os.IsNotExist(err) {
		t.Errorf("its own layer survived the removal: %v", err)
	}
	base, err := s.Get("base")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(base.RootFS); err != nil {
		t.Errorf("removing a child removed base's layer: %v", err)
	}
}

// TestBuildFromOCIImages imports images made here (never a public registry): the
// built base rootfs as an image in an in-process registry, checked inside a
// sandbox, and a small image from a docker-archive tarball and an OCI layout.
func TestBuildFromOCIImages(t *testing.T) {
	s := storeFor(t)
	base, err := s.Get("base")
	if err != nil {
		t.Fatal(err)
	}
	img := ocitest.ImageFromDir(t, base.RootFS, ociimage.Config{
		Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "FROM_IMAGE=yes"},
		WorkingDir: "/srv",
	}, map[string]string{"srv/marker.txt": "from the image\n", "etc/.wh.motd": ""})
	ref := ocitest.Push(t, ocitest.Registry(t), "airlock/test-base:1", img)
	name := uniqueName(t, s, "oci")
	tpl, out := build(t, s, template.BuildRequest{Name: name, Dockerfile: []byte("FROM " + ref + "\nRUN cat /srv/marker.txt > /srv/copied.txt\n")})
	t.Logf("build from %s:\n%s", ref, out)
	if tpl.Settings.DefaultWorkdir != "/srv" || tpl.Source.From != ref {
		t.Errorf("template from image: %+v", tpl)
	}
	m := sandboxes(t, s)
	info := createFrom(t, m, name)
	for cmd, want := range map[string]string{
		"cat /srv/copied.txt":                            "from the image",
		"echo $FROM_IMAGE; pwd; whoami":                  "yes\n/srv\nuser",
		"test -e /etc/motd && echo present || echo gone": "gone",
	} {
		if got := runIn(t, m, info, cmd); got != want {
			t.Errorf("%s: got %q, want %q", cmd, got, want)
		}
	}

	small := ocitest.Build(t, ociimage.Config{Env: []string{"PATH=/bin", "SMALL=1"}, User: "1000:1000"},
		ocitest.FilesLayer(t, map[string]string{"data/a.txt": "a\n", "etc/passwd": "root:x:0:0::/root:/bin/sh\n"}))
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"extra.txt": "extra\n"})
	for _, ref := range []string{
		ocitest.WriteDockerArchive(t, filepath.Join(t.TempDir(), "small.tar"), "small:1", small),
		ocitest.WriteLayout(t, t.TempDir(), "v1", small),
	} {
		name := uniqueName(t, s, "small")
		tpl, out := build(t, s, template.BuildRequest{
			Name: name, Dockerfile: []byte("FROM " + ref + "\nCOPY extra.txt /data/\n"), ContextDir: dir,
		})
		for file, want := range map[string]string{"data/a.txt": "a\n", "data/extra.txt": "extra\n", "usr/local/bin/envd": ""} {
			got, err := os.ReadFile(filepath.Join(tpl.RootFS, file))
			if err != nil || string(got) != want {
				t.Errorf("%s: /%s = %q, %v; want %q\n%s", ref, file, got, err, want, out)
			}
		}
		if tpl.Settings.DefaultUser != "1000" || !contains(tpl.Config.Env, "SMALL=1") {
			t.Errorf("%s: image config not carried: %+v %+v", ref, tpl.Settings, tpl.Config)
		}
	}
}

func layerDirs(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(testenv.DataDir(), "layers"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestBuiltins checks what each built-in promises, inside a sandbox of it. They
// are built by `make test` (scripts/test.sh) before the Go tests run.
func TestBuiltins(t *testing.T) {
	s := storeFor(t)
	m := sandboxes(t, s)
	checks := map[string][]string{
		"base":                {`test "$(whoami):$(pwd)" = user:/home/user`, "sudo -n true", "python3 -c 'print(1+1)'", `python --version 2>&1 | grep -q '^Python 3\.' && test "$(python -c 'import sys; print(sys.version_info[0])')" = 3`, "node -e 'console.log(1+1)'", "git --version", "curl --version"},
		"python":              {`python --version 2>&1 | grep -q '^Python 3\.'`, "pip --version", "python3 -c 'import numpy, pandas; print(pandas.DataFrame({\"x\": [1, 2]}).x.sum())'", "python3 -m venv /tmp/venv && /tmp/venv/bin/python -c 'import sys; print(sys.prefix)'", "! pip install --no-index nothing-here 2>&1 | grep -q externally-managed"},
		"node":                {"npm --version", "node -e 'console.log(process.version)'"},
		"code-interpreter-v1": {"python3 -c 'import numpy, pandas, matplotlib, scipy, ipykernel; print(numpy.__version__)'", "python3 -c 'import matplotlib.pyplot as plt; plt.plot([1,2]); plt.savefig(\"/tmp/p.png\")' && test -s /tmp/p.png", "node -e \"console.log(require('/usr/share/nodejs/typescript').transpileModule('let x: number = 1', {}).outputText)\"", "tsc --version"},
	}
	for name, cmds := range checks {
		t.Run(name, func(t *testing.T) {
			if _, err := s.Get(name); err != nil {
				if os.Getenv("AIRLOCK_TEST_REQUIRE") == "1" {
					t.Fatalf("built-in %s: %v", name, err)
				}
				t.Skipf("built-in %s not built here: %v", name, err)
			}
			info := createFrom(t, m, name)
			defer m.Kill(context.Background(), info.ID)
			for _, cmd := range cmds {
				out := runIn(t, m, info, cmd)
				t.Logf("%s: %s → %s", name, cmd, out)
			}
		})
	}
}

// TestBuildNoCacheFromLine: a rebuild with NoCacheFromLine runs that step
// again (a new stamp) while the steps before it still come from the cache.
func TestBuildNoCacheFromLine(t *testing.T) {
	s := storeFor(t)
	name := uniqueName(t, s, "nocache")
	df := []byte("FROM base\nRUN echo one > /one\nRUN date +%s%N > /stamp\n")
	stamp := func(tpl template.Template) string {
		top := tpl.Layers[len(tpl.Layers)-1]
		b, err := os.ReadFile(filepath.Join(testenv.DataDir(), "layers", top.Key, "rootfs", "stamp"))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	// Stamps are read at once: a replaced template's layers are collected.
	first, _ := build(t, s, template.BuildRequest{Name: name, Dockerfile: df})
	firstStamp := stamp(first)
	again, _ := build(t, s, template.BuildRequest{Name: name, Dockerfile: df, Replace: true})
	if stamp(again) != firstStamp || !again.Layers[len(again.Layers)-1].Cached {
		t.Fatalf("a plain rebuild was not cached: %s vs %s", firstStamp, stamp(again))
	}
	forced, out := build(t, s, template.BuildRequest{Name: name, Dockerfile: df, Replace: true, NoCacheFromLine: 3})
	n := len(forced.Layers)
	if !forced.Layers[n-2].Cached || forced.Layers[n-1].Cached {
		t.Errorf("cached: line 2 %v (want true), line 3 %v (want false)\n%s", forced.Layers[n-2].Cached, forced.Layers[n-1].Cached, out)
	}
	if stamp(forced) == firstStamp {
		t.Errorf("the forced step did not run again: stamp %s", stamp(forced))
	}
}
