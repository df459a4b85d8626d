package interp

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/testenv"
	"github.com/airlock-sandbox/airlock/templates"
)

// javaKernelSource is the kernel's one source, in the template that compiles it.
const javaKernelSource = "code-interpreter-v1/java-kernel/AirlockKernel.java"

// JavaStarter returns the java Starter with the kernel compiled on the host
// from the template's source, for the kernels t and its subtests start; it
// skips when the host has no JDK.
func JavaStarter(t testing.TB) Starter {
	t.Helper()
	dir := hostJavaKernel(t)
	return func(ctx context.Context, opts Options) (Kernel, error) {
		return startJavaWith(ctx, opts, dir)
	}
}

// hostJavaKernel compiles the kernel into a directory removed after t.
func hostJavaKernel(t testing.TB) string {
	t.Helper()
	if _, err := exec.LookPath("javac"); err != nil {
		testenv.Missing(t, "no javac on this host (scripts/setup-test.sh installs default-jdk-headless)")
	}
	src, err := templates.FS.ReadFile(javaKernelSource)
	if err != nil {
		t.Fatal(err)
	}
	// Not t.TempDir: its parent is private to the test's user, and a kernel
	// may run as another.
	root, err := os.MkdirTemp("", "airlock-java-kernel-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(root, "AirlockKernel.java")
	if err := os.WriteFile(file, src, 0o644); err != nil {
		t.Fatal(err)
	}
	classes := filepath.Join(root, "classes")
	// The same command as the template's Dockerfile.
	if out, err := exec.Command("javac", "-nowarn", "-XDignore.symbol.file", "-d", classes, file).CombinedOutput(); err != nil {
		t.Fatalf("compile the java kernel: %v\n%s", err, out)
	}
	return classes
}
