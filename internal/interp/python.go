package interp

import (
	"context"
	"embed"
	"encoding/json"
	"fmt"
	"os"
)

// Python backends. The "python" language runs Debian's ipykernel over ZeroMQ when
// /usr/bin/python3 can import ipykernel (code-interpreter-v1), else the stdlib-only JSON-lines
// driver (base, python3): same events, same chart data, no third-party packages.

//go:embed py/airlock_charts.py py/airlock_results.py py/airlock_ipy_startup.py py/airlock_driver.py
var pyAssets embed.FS

// pythonCandidates are the interpreters tried in order; Debian's comes first because that is
// where the template's python3-* packages (ipykernel, matplotlib, pandas) live.
var pythonCandidates = []string{"/usr/bin/python3", "/usr/local/bin/python3"}

func init() {
	Register("python", StartPython)
}

func findPython() (string, error) {
	for _, p := range pythonCandidates {
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p, nil
		}
	}
	return "", fmt.Errorf("no python3 interpreter: %w", ErrUnavailable)
}

// hasIPykernel reports whether python can import ipykernel and zmq (checked with find_spec,
// ~20 ms, not by importing them). Checked per start, so a pip install in the sandbox counts.
func hasIPykernel(ctx context.Context, python string, opts Options) bool {
	cmd := kernelCmd(opts, []string{python, "-c",
		"import importlib.util as u, sys; sys.exit(0 if u.find_spec('ipykernel') and u.find_spec('zmq') else 1)"})
	cmd.Dir = "/"
	done := make(chan error, 1)
	if err := startKernel(cmd); err != nil {
		return false
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err == nil
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		<-done
		return false
	}
}

// writePyAssets installs the embedded Python files into RunDir.
func writePyAssets(opts Options, names ...string) error {
	if err := prepareRunDir(opts); err != nil {
		return err
	}
	for _, n := range names {
		data, err := pyAssets.ReadFile("py/" + n)
		if err != nil {
			return fmt.Errorf("embedded %s: %w", n, err)
		}
		if _, err := writeKernelFile(opts, n, data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// StartPython is the "python" Starter: ipykernel when available, else the stdlib driver.
func StartPython(ctx context.Context, opts Options) (Kernel, error) {
	python, err := findPython()
	if err != nil {
		return nil, err
	}
	if hasIPykernel(ctx, python, opts) {
		return StartIPykernel(ctx, opts)
	}
	return StartPythonDriver(ctx, opts)
}

// StartIPykernel starts Debian's ipykernel with the Airlock startup script (chart data,
// per-execution env helpers) and the matplotlib-inline backend.
func StartIPykernel(ctx context.Context, opts Options) (Kernel, error) {
	python, err := findPython()
	if err != nil {
		return nil, err
	}
	if err := writePyAssets(opts, "airlock_charts.py", "airlock_results.py", "airlock_ipy_startup.py"); err != nil {
		return nil, err
	}
	startup := opts.RunDir + "/airlock_ipy_startup.py"
	quoted, err := json.Marshal(startup) // a JSON string is a valid Python string literal
	if err != nil {
		return nil, fmt.Errorf("quote startup path: %w", err)
	}
	// exec_lines run in the user namespace; exec() with its own globals keeps it clean, and
	// exec returns None so nothing is displayed.
	execLine := fmt.Sprintf("exec(compile(open(%s).read(), %s, 'exec'), {'__name__': '_airlock_startup', '__file__': %s})",
		quoted, quoted, quoted)
	argv := []string{python, "-Xfrozen_modules=off", "-m", "ipykernel_launcher",
		"--InteractiveShell.colors=NoColor", "--IPKernelApp.exec_lines=" + execLine,
		// No history database: IPython wrote every cell to SQLite from a
		// thread of its own, whose commits held runCode's p99 at 65 ms
		// (p50 6.0 -> 4.6 ms, p99 65 -> 6.6 ms without). In, Out and _
		// are kept in memory all the same.
		"--HistoryManager.enabled=False",
		"-f", "{connection_file}"}
	env := []string{
		// ipykernel only picks the inline backend when MPLBACKEND is unset, and templates set
		// MPLBACKEND=Agg (which never displays): force inline so every figure is one
		// display_data with image/png (and our e2b/chart).
		"MPLBACKEND=module://matplotlib_inline.backend_inline",
		// Keeps debugpy quiet about frozen modules in subprocesses too.
		"PYDEVD_DISABLE_FILE_VALIDATION=1",
	}
	k, err := startJupyter(ctx, opts, "python3", argv, env, jupyterFlavor{envCode: pythonEnvCode})
	if err != nil {
		return nil, err
	}
	return k, nil
}

// pythonEnvCode is the per-execution env of ipykernel: a silent execute that calls the
// startup script's _airlock.apply_env(dict) before the cell and _airlock.restore_env() after.
func pythonEnvCode(env map[string]string) (string, string, error) {
	data, err := json.Marshal(env)
	if err != nil {
		return "", "", fmt.Errorf("encode env: %w", err)
	}
	lit, err := json.Marshal(string(data))
	if err != nil {
		return "", "", fmt.Errorf("encode env: %w", err)
	}
	apply := fmt.Sprintf("__import__('_airlock').apply_env(__import__('json').loads(%s))", lit)
	return apply, "__import__('_airlock').restore_env()", nil
}
