package interp

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/testenv"
)

func hostJavaOptions(t testing.TB, extraEnv ...string) Options {
	t.Helper()
	env := append([]string{"PATH=" + os.Getenv("PATH"), "HOME=/root", "LANG=C.UTF-8"}, extraEnv...)
	if lookPath(env, "java") == "" {
		testenv.Missing(t, "no java on this host (scripts/setup-test.sh installs default-jdk-headless)")
	}
	dir := t.TempDir()
	return Options{
		Language: "java",
		Cwd:      dir,
		UID:      uint32(os.Getuid()),
		GID:      uint32(os.Getgid()),
		Home:     "/root",
		Env:      env,
		RunDir:   dir,
	}
}

func startTestJava(t testing.TB, opts Options, classDir string) Kernel {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	k, err := startJavaWith(ctx, opts, classDir)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() { k.Close() })
	return k
}

// wantError runs code that must fail with an error event named name.
func wantError(t *testing.T, k Kernel, code, name string) *ExecError {
	t.Helper()
	c := runNode(t, k, code, nil)
	if c.err != nil {
		t.Fatalf("%q: %v", code, c.err)
	}
	e := c.errorEvent()
	if e == nil {
		t.Fatalf("%q: no error event: %+v", code, c.events)
	}
	if e.Name != name {
		t.Fatalf("%q: error %q: %q, want name %q\n%s", code, e.Name, e.Value, name, e.Traceback)
	}
	return e
}

// What is Java's own, as E2B's Java kernel (IJava) behaves; the shared
// contract is kerneltest's, run by TestJavaConformance.
func TestJavaKernelSemantics(t *testing.T) {
	classes := hostJavaKernel(t)
	k := startTestJava(t, hostJavaOptions(t, "TEST_ENV_VAR=supertest"), classes)

	t.Run("results", func(t *testing.T) {
		want(t, k, "1 + 1", "2")
		// A String is itself, not its literal.
		want(t, k, `"a \"b\"" + 'c'`, `a "b"c`)
		want(t, k, "new int[] {1, 2, 3}", "int[3] { 1, 2, 3 }")
		// Only the last snippet counts, and only an expression.
		want(t, k, "int r1 = 5;", "<no result>")
		want(t, k, "r1", "5")
		want(t, k, "r1 * 2;\nint r2 = 3;", "<no result>")
		want(t, k, "System.out.println(r1)", "<no result>")
		want(t, k, "Object none = null;\nnone", "<no result>")
	})
	t.Run("state", func(t *testing.T) {
		want(t, k, "int twice(int x) { return 2 * x; }", "<no result>")
		want(t, k, "record Point(int x, int y) { int sum() { return x + y; } }", "<no result>")
		want(t, k, "import java.util.concurrent.atomic.AtomicInteger;", "<no result>")
		want(t, k, "var counter = new AtomicInteger(20);", "<no result>")
		want(t, k, "twice(new Point(1, counter.incrementAndGet()).sum())", "44")
		// A method redefined keeps its callers working.
		want(t, k, "int twice(int x) { return 3 * x; }", "<no result>")
		want(t, k, "twice(2)", "6")
		// Default imports, as in the jshell tool.
		want(t, k, "List.of(1, 2).stream().map(String::valueOf).collect(Collectors.joining(\"+\"))", "1+2")
	})
	t.Run("stdout", func(t *testing.T) {
		c := want(t, k, "System.out.println(\"Hello, World!\");\nSystem.err.print(\"e\");\n7", "7")
		var out, errs string
		for _, e := range c.events {
			switch e.Type {
			case "stdout":
				out += e.Text
			case "stderr":
				errs += e.Text
			}
		}
		if out != "Hello, World!\n" || errs != "e" {
			t.Errorf("stdout %q, stderr %q", out, errs)
		}
	})
	t.Run("compile error", func(t *testing.T) {
		e := wantError(t, k, "int ok = 1;\nString s = 5;\nint notReached = 2;", "CompilationException")
		if e.Value != "incompatible types: int cannot be converted to java.lang.String" {
			t.Errorf("value %q", e.Value)
		}
		if !strings.Contains(e.Traceback, "String s = 5;\n           ^\n") {
			t.Errorf("traceback does not point at the error:\n%s", e.Traceback)
		}
		want(t, k, "ok", "1")
		wantError(t, k, "notReached", "CompilationException")
		e = wantError(t, k, "undefinedThing + 1", "CompilationException")
		if !strings.Contains(e.Value, "cannot find symbol") {
			t.Errorf("value %q", e.Value)
		}
		wantError(t, k, "for (int i = 0; i < 3; i++) {", "CompilationException")
	})
	t.Run("exception", func(t *testing.T) {
		e := wantError(t, k, "void fail() { throw new IllegalArgumentException(\"deep\", new RuntimeException(\"root\")); }\nfail();", "java.lang.IllegalArgumentException")
		if e.Value != "deep" {
			t.Errorf("value %q", e.Value)
		}
		for _, line := range []string{"java.lang.IllegalArgumentException: deep\n", "\tat fail (#", "Caused by: java.lang.RuntimeException: root\n"} {
			if !strings.Contains(e.Traceback, line) {
				t.Errorf("traceback lacks %q:\n%s", line, e.Traceback)
			}
		}
		e = wantError(t, k, "int z = 1 / 0;", "java.lang.ArithmeticException")
		if e.Value != "/ by zero" {
			t.Errorf("value %q", e.Value)
		}
		// A null message is an empty value.
		if e := wantError(t, k, "throw new NullPointerException()", "java.lang.NullPointerException"); e.Value != "" {
			t.Errorf("value %q", e.Value)
		}
	})
	t.Run("env vars as system properties", func(t *testing.T) {
		want(t, k, `System.getProperty("TEST_ENV_VAR")`, "supertest")
		c := runNode(t, k, `System.getProperty("FOO") + "/" + System.getProperty("TEST_ENV_VAR") + "/" + System.getenv("FOO")`,
			map[string]string{"FOO": "bar", "TEST_ENV_VAR": "overwrite"})
		if got := c.main(); c.err != nil || got != "bar/overwrite/bar" {
			t.Fatalf("with the execution's env: %q (%v)", got, c.err)
		}
		want(t, k, `System.getProperty("FOO", "default") + "/" + System.getProperty("TEST_ENV_VAR") + "/" + System.getenv("FOO")`, "default/supertest/null")
		// The JVM's own properties are not shadowed by the env (HOME is in it).
		want(t, k, `System.getProperty("user.home")`, "/root")
	})
	t.Run("cwd", func(t *testing.T) {
		want(t, k, `System.getProperty("user.dir").equals(new java.io.File(".").getAbsoluteFile().getParent())`, "true")
	})
}

// An interrupted cell keeps the kernel and its state, also when the code
// swallows the first stop (the interrupt is sent again).
func TestJavaKernelInterruptCaught(t *testing.T) {
	k := startTestJava(t, hostJavaOptions(t), hostJavaKernel(t))
	want(t, k, "int kept = 7;", "<no result>")
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err := k.Execute(ctx, "try { Thread.sleep(3_600_000L); } catch (Throwable t) { }\nThread.sleep(3_600_000L);", nil, func(Event) {})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("interrupted: %v, want DeadlineExceeded", err)
	}
	want(t, k, "kept", "7")
}

func TestJavaUnavailable(t *testing.T) {
	opts := hostJavaOptions(t)
	if _, err := startJavaWith(context.Background(), opts, t.TempDir()); !errors.Is(err, ErrUnavailable) {
		t.Errorf("no kernel classes: %v, want ErrUnavailable", err)
	}
	opts.Env = []string{"PATH=" + t.TempDir()}
	if _, err := startJava(context.Background(), opts); !errors.Is(err, ErrUnavailable) {
		t.Errorf("no java: %v, want ErrUnavailable", err)
	}
}
