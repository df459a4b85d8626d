package interp

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"
)

// These tests run the real backends on the host's Debian /usr/bin/python3 as the current
// user. ipykernel tests need python3-ipykernel, python3-matplotlib, python3-pandas (see
// scripts/setup.sh); the stdlib driver needs only python3 (matplotlib/pandas cases are skipped
// without them).

type pyBackend struct {
	name  string
	start Starter
	need  []string // Python modules required by the backend itself
}

var pyBackends = []pyBackend{
	{"ipykernel", StartIPykernel, []string{"ipykernel", "zmq"}},
	{"driver", StartPythonDriver, nil},
}

func havePyModules(t *testing.T, mods ...string) bool {
	t.Helper()
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		return false
	}
	for _, m := range mods {
		if exec.Command("/usr/bin/python3", "-c", "import "+m).Run() != nil {
			return false
		}
	}
	return true
}

func testPyOptions(t *testing.T) Options {
	t.Helper()
	home := t.TempDir()
	return Options{
		Language: "python",
		Cwd:      t.TempDir(),
		UID:      uint32(os.Getuid()),
		GID:      uint32(os.Getgid()),
		Home:     home,
		// Like a template's env: MPLBACKEND=Agg must not stop figures from being displayed.
		Env:    []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + home, "LANG=C.UTF-8", "MPLBACKEND=Agg"},
		RunDir: t.TempDir(),
	}
}

func startPyBackend(t *testing.T, b pyBackend) Kernel {
	t.Helper()
	if !havePyModules(t, b.need...) {
		t.Skipf("/usr/bin/python3 lacks %v", b.need)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	k, err := b.start(ctx, testPyOptions(t))
	if err != nil {
		t.Fatalf("start %s: %v", b.name, err)
	}
	t.Cleanup(func() { k.Close() })
	return k
}

type pyRunOut struct {
	events []Event
	err    error
}

func (r pyRunOut) text(typ string) string {
	var b strings.Builder
	for _, e := range r.events {
		if e.Type == typ {
			b.WriteString(e.Text)
		}
	}
	return b.String()
}

func (r pyRunOut) results() []Event {
	var out []Event
	for _, e := range r.events {
		if e.Type == "result" {
			out = append(out, e)
		}
	}
	return out
}

func (r pyRunOut) main(t *testing.T) map[string]any {
	t.Helper()
	for _, e := range r.events {
		if e.Type == "result" && e.IsMainResult {
			return e.Data
		}
	}
	t.Fatalf("no main result in %+v", r.events)
	return nil
}

func pyRun(t *testing.T, k Kernel, code string, env map[string]string) pyRunOut {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out pyRunOut
	_, out.err = k.Execute(ctx, code, env, func(e Event) { out.events = append(out.events, e) })
	return out
}

func pyMustRun(t *testing.T, k Kernel, code string) pyRunOut {
	t.Helper()
	out := pyRun(t, k, code, nil)
	if out.err != nil {
		t.Fatalf("execute %q: %v", code, out.err)
	}
	for _, e := range out.events {
		if e.Type == "error" {
			t.Fatalf("execute %q: %s: %s\n%s", code, e.Error.Name, e.Error.Value, e.Error.Traceback)
		}
	}
	return out
}

// What is Python's own (rich results, charts, tracebacks, top-level await);
// the shared contract is kerneltest's, run by TestPythonConformance.
func TestPythonBackends(t *testing.T) {
	for _, b := range pyBackends {
		t.Run(b.name, func(t *testing.T) {
			k := startPyBackend(t, b)
			hasMPL := havePyModules(t, "matplotlib")
			hasPandas := havePyModules(t, "pandas")

			t.Run("main result", func(t *testing.T) {
				if got := pyMustRun(t, k, "x = 41\nx + 1").main(t)["text/plain"]; got != "42" {
					t.Errorf("x + 1 = %v, want 42", got)
				}
			})
			t.Run("error", func(t *testing.T) {
				out := pyRun(t, k, "def f():\n    return 1/0\nf()", nil)
				if out.err != nil {
					t.Fatal(out.err)
				}
				var e *ExecError
				for _, ev := range out.events {
					if ev.Type == "error" {
						e = ev.Error
					}
				}
				if e == nil {
					t.Fatalf("no error event: %+v", out.events)
				}
				if e.Name != "ZeroDivisionError" || e.Value != "division by zero" {
					t.Errorf("error %s: %s", e.Name, e.Value)
				}
				if !strings.Contains(e.Traceback, "return 1/0") || strings.Contains(e.Traceback, "airlock_driver") {
					t.Errorf("traceback:\n%s", e.Traceback)
				}
			})
			t.Run("await", func(t *testing.T) {
				out := pyMustRun(t, k, "import asyncio\nawait asyncio.sleep(0.01)\n6 * 7")
				if got := out.main(t)["text/plain"]; got != "42" {
					t.Errorf("await cell = %v", got)
				}
			})
			t.Run("display", func(t *testing.T) {
				code := "class H:\n    def _repr_html_(self): return '<b>hi</b>'\ndisplay(H())\n"
				if havePyModules(t, "IPython") {
					code += "from IPython.display import display as d2, HTML, Markdown\nd2(HTML('<i>x</i>'))\nd2(Markdown('**y**'))\n"
				}
				code += "7"
				out := pyMustRun(t, k, code)
				res := out.results()
				if res[0].Data["text/html"] != "<b>hi</b>" || res[0].IsMainResult {
					t.Errorf("first display %+v", res[0])
				}
				if havePyModules(t, "IPython") {
					if len(res) != 4 || res[1].Data["text/html"] != "<i>x</i>" || res[2].Data["text/markdown"] != "**y**" {
						t.Errorf("IPython displays %+v", res)
					}
				}
				if last := res[len(res)-1]; !last.IsMainResult || last.Data["text/plain"] != "7" {
					t.Errorf("main result %+v", last)
				}
			})
			t.Run("plots", func(t *testing.T) {
				if !hasMPL {
					t.Skip("no matplotlib")
				}
				cases := []struct {
					kind, code string
					check      func(t *testing.T, chart map[string]any)
				}{
					{"line", "plt.figure()\nplt.plot([1, 2, 3], [4, 5, 6], label='l1')\nplt.title('T')\nplt.xlabel('Time (s)')\nplt.ylabel('v')\nplt.show()", func(t *testing.T, c map[string]any) {
						if c["title"] != "T" || c["x_label"] != "Time (s)" || c["x_unit"] != "s" || c["y_label"] != "v" {
							t.Errorf("labels %v", c)
						}
						els := c["elements"].([]any)
						el := els[0].(map[string]any)
						pts := el["points"].([]any)
						if el["label"] != "l1" || len(pts) != 3 || pts[2].([]any)[1] != 6.0 {
							t.Errorf("line element %v", el)
						}
						if c["x_scale"] != "linear" || len(c["x_ticks"].([]any)) == 0 {
							t.Errorf("ticks/scale %v %v", c["x_scale"], c["x_ticks"])
						}
					}},
					{"scatter", "plt.figure()\nplt.scatter([1, 2], [3, 4], label='s')", func(t *testing.T, c map[string]any) {
						el := c["elements"].([]any)[0].(map[string]any)
						if el["label"] != "s" || len(el["points"].([]any)) != 2 {
							t.Errorf("scatter element %v", el)
						}
					}},
					{"bar", "plt.figure()\nplt.bar(['a', 'b', 'c'], [3, 1, 2])\nplt.show()", func(t *testing.T, c map[string]any) {
						els := c["elements"].([]any)
						if len(els) != 3 {
							t.Fatalf("bar elements %v", els)
						}
						el := els[0].(map[string]any)
						if el["label"] != "a" || el["value"] != 3.0 {
							t.Errorf("bar element %v", el)
						}
					}},
					{"pie", "plt.figure()\nplt.pie([1, 3], labels=['p', 'q'])\nplt.show()", func(t *testing.T, c map[string]any) {
						els := c["elements"].([]any)
						if len(els) != 2 || els[1].(map[string]any)["label"] != "q" || els[1].(map[string]any)["angle"].(float64) != 270 {
							t.Errorf("pie elements %v", els)
						}
					}},
					{"box_and_whisker", "plt.figure()\nplt.boxplot([[1, 2, 3, 4, 50]], labels=['g'])\nplt.show()", func(t *testing.T, c map[string]any) {
						els := c["elements"].([]any)
						el := els[0].(map[string]any)
						if el["label"] != "g" || el["median"] != 3.0 || len(el["outliers"].([]any)) != 1 {
							t.Errorf("box element %v", el)
						}
					}},
				}
				pyMustRun(t, k, "import matplotlib.pyplot as plt")
				for _, c := range cases {
					t.Run(c.kind, func(t *testing.T) {
						out := pyMustRun(t, k, c.code)
						var figs []Event
						for _, r := range out.results() {
							if _, ok := r.Data["image/png"]; ok {
								figs = append(figs, r)
							}
						}
						if len(figs) != 1 {
							t.Fatalf("%d png results, want 1: %+v", len(figs), out.results())
						}
						png, _ := figs[0].Data["image/png"].(string)
						if !strings.HasPrefix(png, "iVBORw0KGgo") {
							t.Errorf("image/png is not a base64 PNG: %.20q", png)
						}
						chart, ok := figs[0].Data["e2b/chart"].(map[string]any)
						if !ok {
							t.Fatalf("no e2b/chart in %v", pyKeys(figs[0].Data))
						}
						if chart["type"] != c.kind {
							t.Fatalf("chart type %v, want %s: %v", chart["type"], c.kind, chart)
						}
						c.check(t, chart)
					})
				}
			})
			t.Run("dataframe", func(t *testing.T) {
				if !hasPandas {
					t.Skip("no pandas")
				}
				data := pyMustRun(t, k, "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})").main(t)
				html, _ := data["text/html"].(string)
				text, _ := data["text/plain"].(string)
				if !strings.Contains(html, "<table") || !strings.Contains(text, "a  b") {
					t.Errorf("DataFrame bundle: html %q text %q", html, text)
				}
				// result.data: the columns, as E2B's; missing values and timestamps
				// made JSON.
				cols, _ := data["e2b/data"].(map[string]any)
				if got := fmt.Sprint(cols["a"], cols["b"]); got != "[1 2] [x y]" {
					t.Errorf("DataFrame e2b/data = %#v, want columns a [1 2] and b [x y]", data["e2b/data"])
				}
				data = pyMustRun(t, k, "import pandas as pd\npd.DataFrame({'t': pd.to_datetime(['2024-01-02', None]), 'f': [1.5, float('nan')]})").main(t)
				cols, _ = data["e2b/data"].(map[string]any)
				if got := fmt.Sprint(cols["t"], cols["f"]); got != "[2024-01-02T00:00:00 <nil>] [1.5 <nil>]" {
					t.Errorf("DataFrame with NaT and NaN: e2b/data = %#v", data["e2b/data"])
				}
				if data := pyMustRun(t, k, "[1, 2]").main(t); data["e2b/data"] != nil {
					t.Errorf("a list got e2b/data %v", data["e2b/data"])
				}
			})
			t.Run("json", func(t *testing.T) {
				data := pyMustRun(t, k, "{'a': [1, 2], 'b': None}").main(t)
				if got := fmt.Sprint(data["application/json"]); got != "map[a:[1 2] b:<nil>]" {
					t.Errorf("a dict's application/json = %#v", data["application/json"])
				}
				if data := pyMustRun(t, k, "'text'").main(t); data["application/json"] != nil {
					t.Errorf("a str got application/json %v", data["application/json"])
				}
			})
			t.Run("saved image", func(t *testing.T) {
				if !havePyModules(t, "PIL") {
					t.Skip("no PIL")
				}
				out := pyMustRun(t, k, "from PIL import Image\nImage.new('RGB', (4, 4), 'red').save('red.png')")
				var png bool
				for _, r := range out.results() {
					_, png = r.Data["image/png"].(string)
				}
				if !png {
					t.Errorf("saving a PIL image to a file displayed no png: %+v", out.events)
				}
			})
			t.Run("latency", func(t *testing.T) {
				var ds []time.Duration
				for range 50 {
					start := time.Now()
					pyMustRun(t, k, "1+1")
					ds = append(ds, time.Since(start))
				}
				pySortDurations(ds)
				t.Logf("%s trivial execute: p50 %v p90 %v", b.name, ds[len(ds)/2], ds[len(ds)*9/10])
			})
		})
	}
}

func pyKeys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func TestStartPythonPicksBackend(t *testing.T) {
	if !havePyModules(t) {
		t.Skip("no /usr/bin/python3")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	k, err := StartPython(ctx, testPyOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	_, isJupyter := k.(*jupyterKernel)
	if want := havePyModules(t, "ipykernel", "zmq"); isJupyter != want {
		t.Errorf("StartPython gave %T with ipykernel available = %v", k, want)
	}
}

// A kernel whose process lives on but stops answering (here: SIGSTOPped) is declared dead
// by the heartbeat, and its process group is killed.
func TestJupyterHeartbeatDeath(t *testing.T) {
	every, limit := jupyterHeartbeatEvery, jupyterHeartbeatLimit
	jupyterHeartbeatEvery, jupyterHeartbeatLimit = 200*time.Millisecond, 2*time.Second
	defer func() { jupyterHeartbeatEvery, jupyterHeartbeatLimit = every, limit }()
	k := startPyBackend(t, pyBackends[0])
	pid := k.(*jupyterKernel).cmd.Process.Pid
	out := pyRun(t, k, "import os, signal\nos.kill(os.getpid(), signal.SIGSTOP)", nil)
	if !errors.Is(out.err, ErrKernelDied) || !strings.Contains(out.err.Error(), "heartbeat") {
		t.Fatalf("err %v, want ErrKernelDied by heartbeat", out.err)
	}
	select {
	case <-k.(*jupyterKernel).waitDone:
	case <-time.After(10 * time.Second):
		syscall.Kill(-pid, syscall.SIGKILL)
		t.Fatal("stopped kernel not killed")
	}
}

func pySortDurations(ds []time.Duration) { slices.Sort(ds) }

// A kernelspec that is not installed is a language the sandbox lacks. (The
// kernelspec path itself passes the conformance suite with Debian's python3
// kernelspec: TestPythonConformance/kernelspec.)
func TestJupyterKernelspecMissing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if _, err := StartKernelspec("no-such-kernel")(ctx, testPyOptions(t)); !errors.Is(err, ErrUnavailable) {
		t.Errorf("missing kernelspec: %v, want ErrUnavailable", err)
	}
}

// A cell that swallows interrupts: Execute gives up after its grace period, and the next
// execution waits for that cell and gets only its own output.
func TestPythonAbandonedCell(t *testing.T) {
	for _, b := range pyBackends {
		t.Run(b.name, func(t *testing.T) {
			k := startPyBackend(t, b)
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(300*time.Millisecond, cancel)
			code := "import time\nt0 = time.time()\nwhile time.time() - t0 < 8:\n    try:\n        time.sleep(0.05)\n    except KeyboardInterrupt:\n        pass\nprint('late')"
			start := time.Now()
			_, err := k.Execute(ctx, code, map[string]string{"AB_ENV": "1"}, func(Event) {})
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("err %v, want context.Canceled", err)
			}
			t.Logf("gave up after %v", time.Since(start))
			out := pyRun(t, k, "import os\nprint('next', os.environ.get('AB_ENV'))", nil)
			if out.err != nil || out.text("stdout") != "next None\n" {
				t.Fatalf("next execution: %q %v %+v", out.text("stdout"), out.err, out.events)
			}
		})
	}
}

func TestPythonDriverRealStreams(t *testing.T) {
	k := startPyBackend(t, pyBackends[1])
	out := pyMustRun(t, k, "import sys\nsys.__stdout__.write('direct\\n')\nprint('via', file=sys.__stderr__)")
	if out.text("stdout") != "direct\n" || out.text("stderr") != "via\n" {
		t.Errorf("stdout %q stderr %q", out.text("stdout"), out.text("stderr"))
	}
}
