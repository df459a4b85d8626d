package interp

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/testenv"
)

func hostNodeOptions(t testing.TB) Options {
	t.Helper()
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=/root", "LANG=C.UTF-8"}
	if lookPath(env, "node") == "" {
		testenv.Missing(t, "no node on this host")
	}
	dir := t.TempDir()
	return Options{
		Language: "javascript",
		Cwd:      dir,
		UID:      uint32(os.Getuid()),
		GID:      uint32(os.Getgid()),
		Home:     "/root",
		Env:      env,
		RunDir:   dir,
	}
}

// templateTypeScript is the TypeScript compiler of the built
// code-interpreter-v1 template (Debian node-typescript 4.8), used read-only by
// the host's node, so TS tests run wherever the templates are built.
func templateTypeScript(t testing.TB) string {
	t.Helper()
	dataDir := os.Getenv("AIRLOCK_TEST_DATA_DIR")
	if dataDir == "" {
		dataDir = "/var/lib/airlock-test"
	}
	data, err := os.ReadFile(filepath.Join(dataDir, "templates", "code-interpreter-v1", "template.json"))
	var rec struct {
		Key string `json:"key"`
	}
	if err == nil {
		err = json.Unmarshal(data, &rec)
	}
	dir := filepath.Join(dataDir, "layers", rec.Key, "rootfs", "usr/share/nodejs/typescript")
	if err == nil {
		_, err = os.Stat(filepath.Join(dir, "package.json"))
	}
	if err != nil || rec.Key == "" {
		testenv.Missing(t, "code-interpreter-v1 template not built in %s (its TypeScript compiler is needed): %s", dataDir, errString(err))
	}
	return dir
}

func errString(err error) string {
	if err == nil {
		return "no key"
	}
	return err.Error()
}

func startTestNode(t testing.TB, opts Options, cfg nodeConfig) Kernel {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	k, err := startNode(ctx, opts, cfg)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() { k.Close() })
	return k
}

type cell struct {
	events []Event
	err    error
}

func (c cell) main() string {
	for _, e := range c.events {
		if e.Type == "result" && e.IsMainResult {
			s, _ := e.Data["text/plain"].(string)
			return s
		}
	}
	return "<no result>"
}

func (c cell) errorEvent() *ExecError {
	for _, e := range c.events {
		if e.Type == "error" {
			return e.Error
		}
	}
	return nil
}

func runNode(t testing.TB, k Kernel, code string, env map[string]string) cell {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var c cell
	_, c.err = k.Execute(ctx, code, env, func(e Event) { c.events = append(c.events, e) })
	return c
}

// want runs code and checks the cell's text/plain value.
func want(t *testing.T, k Kernel, code, value string) cell {
	t.Helper()
	c := runNode(t, k, code, nil)
	if c.err != nil {
		t.Fatalf("%q: %v", code, c.err)
	}
	if e := c.errorEvent(); e != nil {
		t.Fatalf("%q: %s: %s\n%s", code, e.Name, e.Value, e.Traceback)
	}
	if got := c.main(); got != value {
		t.Fatalf("%q = %s, want %s (events %+v)", code, got, value, c.events)
	}
	return c
}

// What is the node driver's own; the shared contract is kerneltest's, run by
// TestJavaScriptConformance and TestTypeScriptConformance.
func TestNodeKernelSemantics(t *testing.T) {
	k := startTestNode(t, hostNodeOptions(t), nodeConfig{})

	t.Run("redeclare", func(t *testing.T) {
		for range 2 {
			want(t, k, "const c1 = 1; let l1 = 2; class K1 { v() { return 3 } }", "<no result>")
		}
		want(t, k, "c1 + l1 + new K1().v()", "6")
	})
	t.Run("await", func(t *testing.T) {
		want(t, k, "const tla = await new Promise(r => setTimeout(() => r(41), 10)); tla", "41")
		want(t, k, "tla + 1", "42")
		want(t, k, "Promise.resolve(99)", "99")
		want(t, k, "'x' // a trailing comment after an await-free cell", "'x'")
		want(t, k, "await 1 // a trailing comment", "1")
	})
	t.Run("import", func(t *testing.T) {
		want(t, k, "import * as os from 'node:os'\nimport path, { join as j } from 'path'\nimport 'fs'", "<no result>")
		want(t, k, "[typeof os.cpus, path.sep, j('a', 'b')]", "[ 'function', '/', 'a/b' ]")
	})
	t.Run("output order", func(t *testing.T) {
		c := want(t, k, "console.log('a'); console.error('b'); process.stdout.write('c\\n'); console.log('d'); 5", "5")
		var got []string
		for _, e := range c.events {
			got = append(got, e.Type+":"+strings.TrimSpace(e.Text))
		}
		if w := []string{"stdout:a", "stderr:b", "stdout:c", "stdout:d", "result:"}; !slices.Equal(got, w) {
			t.Fatalf("events %v, want %v", got, w)
		}
	})
	t.Run("error", func(t *testing.T) {
		c := runNode(t, k, "function boom() { throw new TypeError('bad thing') }\nboom()", nil)
		e := c.errorEvent()
		if c.err != nil || e == nil {
			t.Fatalf("err %v, events %+v", c.err, c.events)
		}
		if e.Name != "TypeError" || e.Value != "bad thing" || !strings.Contains(e.Traceback, "at boom (<cell-") || strings.Contains(e.Traceback, "driver") {
			t.Fatalf("error %+v", e)
		}
		c = runNode(t, k, "let = ;", nil)
		if e := c.errorEvent(); e == nil || e.Name != "SyntaxError" {
			t.Fatalf("syntax error: %+v", c.events)
		}
	})
	t.Run("display", func(t *testing.T) {
		c := want(t, k, "display('<b>hi</b>', 'text/html'); display({toHTML() { return '<i>o</i>' }}); 3", "3")
		var html []string
		for _, e := range c.events {
			if e.Type == "result" && !e.IsMainResult {
				h, _ := e.Data["text/html"].(string)
				html = append(html, h)
			}
		}
		if !slices.Equal(html, []string{"<b>hi</b>", "<i>o</i>"}) {
			t.Fatalf("displays %+v", c.events)
		}
		c = want(t, k, "display(Buffer.from([1, 2, 3]), 'image/png')", "<no result>")
		if png := c.events[0].Data["image/png"]; png != "AQID" {
			t.Fatalf("png %v", png)
		}
	})
}

// Interrupts that land well into a cell. The conformance suite's interrupt
// points are known bugs of this backend (nodeKnownBugs in
// conformance_test.go); this test goes once they pass.
func TestNodeKernelInterrupt(t *testing.T) {
	k := startTestNode(t, hostNodeOptions(t), nodeConfig{})
	want(t, k, "var keep = 7", "<no result>")
	for _, code := range []string{"while (true) {}", "await new Promise(() => {})"} {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		_, err := k.Execute(ctx, code, nil, func(Event) {})
		late := time.Since(deadlineOf(ctx))
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s: err %v", code, err)
		}
		t.Logf("%s: returned %v after the deadline", code, late)
		if late > time.Second {
			t.Fatalf("%s: interrupt took %v", code, late)
		}
		want(t, k, "keep", "7")
	}
}

func deadlineOf(ctx context.Context) time.Time {
	d, _ := ctx.Deadline()
	return d
}

func TestNodeKernelUnavailable(t *testing.T) {
	opts := hostNodeOptions(t)
	_, err := startNode(context.Background(), opts, nodeConfig{typeScript: true, typeScriptDir: "/nonexistent/typescript"})
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "code-interpreter-v1") {
		t.Fatalf("typescript without a compiler: %v", err)
	}
	opts.Env = []string{"PATH=/nonexistent"}
	_, err = startJavaScript(context.Background(), opts)
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("javascript without node: %v", err)
	}
	for _, lang := range []string{"javascript", "typescript"} {
		if _, ok := Lookup(lang); !ok {
			t.Fatalf("%s not registered", lang)
		}
	}
}

func TestNodeKernelTypeScript(t *testing.T) {
	opts := hostNodeOptions(t)
	k := startTestNode(t, opts, nodeConfig{typeScript: true, typeScriptDir: templateTypeScript(t)})
	want(t, k, `interface Point { x: number; y: number }
function first<T>(xs: T[]): T { return xs[0] }
const pts: Point[] = [{x: 1, y: 2}]
enum Color { Red = 'r' }
first<Point>(pts).x + first([10]) + Color.Red`, "'11r'")
	want(t, k, "const pts: number = 3; import * as os from 'node:os'\nconst w: string = await Promise.resolve('w'); pts", "3")
	want(t, k, "typeof os.hostname + w", "'functionw'")
	c := runNode(t, k, "const x: number = ;", nil)
	if e := c.errorEvent(); e == nil || e.Name != "SyntaxError" {
		t.Fatalf("syntax error: %+v %v", c.events, c.err)
	}
	c = runNode(t, k, "class A { m(): never { throw new RangeError('r') } }\nnew A().m()", nil)
	if e := c.errorEvent(); e == nil || e.Name != "RangeError" || !strings.Contains(e.Traceback, "<cell-") {
		t.Fatalf("error: %+v %v", c.events, c.err)
	}
}

// TestNodeKernelLatency reports the trivial-execute median (issue 5 asks for
// runCode('1+1') warm p50 ≤ 10 ms end to end; the kernel's share is logged).
func TestNodeKernelLatency(t *testing.T) {
	k := startTestNode(t, hostNodeOptions(t), nodeConfig{})
	var ds []time.Duration
	for range 200 {
		start := time.Now()
		want(t, k, "1+1", "2")
		ds = append(ds, time.Since(start))
	}
	slices.Sort(ds)
	t.Logf("trivial execute: p50 %v, p90 %v, max %v", ds[len(ds)/2], ds[len(ds)*9/10], ds[len(ds)-1])
}
