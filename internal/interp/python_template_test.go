package interp

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// templateRootfs returns a built template's rootfs in the test data dir, or skips.
func pyTemplateRootfs(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(testenv.DataDir(), "templates", name, "template.json"))
	if err != nil {
		t.Skipf("template %s not built in %s: %v", name, testenv.DataDir(), err)
	}
	var rec struct {
		Key string `json:"key"`
	}
	if err := json.Unmarshal(data, &rec); err != nil || rec.Key == "" {
		t.Fatalf("template %s record: %v", name, err)
	}
	rootfs := filepath.Join(testenv.DataDir(), "layers", rec.Key, "rootfs")
	if _, err := os.Stat(rootfs); err != nil {
		t.Skipf("template %s rootfs: %v", name, err)
	}
	return rootfs
}

// chrootPython points the backends at the python3 of a template rootfs: a wrapper that, in
// a private mount namespace, makes the rootfs read-only (templates are shared), mounts the
// host's /tmp (the test's RunDir, Cwd, HOME), /dev and /proc into it and chroots. All are
// execs, so the kernel keeps the wrapper's pid and process group.
func chrootPython(t *testing.T, rootfs string) {
	t.Helper()
	testenv.NeedRoot(t)
	wrapper := filepath.Join(t.TempDir(), "python3")
	script := `#!/bin/sh
set -e
r=` + rootfs + `
d=$(pwd)
exec /usr/bin/unshare -m --propagation private sh -c '
r=$1; d=$2; shift 2
/bin/mount --bind "$r" "$r"
/bin/mount -o remount,bind,ro "$r"
/bin/mount --rbind /tmp "$r/tmp"
/bin/mount --rbind /dev "$r/dev"
/bin/mount -t proc proc "$r/proc"
exec /usr/sbin/chroot "$r" /bin/sh -c "cd \"\$0\" && exec /usr/bin/python3 \"\$@\"" "$d" "$@"
' sh "$r" "$d" "$@"
`
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	saved := pythonCandidates
	pythonCandidates = []string{wrapper}
	t.Cleanup(func() { pythonCandidates = saved })
}

// TestPythonInTemplates runs StartPython on the templates' own Python: code-interpreter-v1
// must get ipykernel (with matplotlib charts and pandas), base the stdlib driver.
func TestPythonInTemplates(t *testing.T) {
	for _, tc := range []struct {
		template string
		jupyter  bool
	}{{"code-interpreter-v1", true}, {"base", false}} {
		t.Run(tc.template, func(t *testing.T) {
			chrootPython(t, pyTemplateRootfs(t, tc.template))
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			opts := testPyOptions(t)
			start := time.Now()
			k, err := StartPython(ctx, opts)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { k.Close() })
			t.Logf("%s: started %T in %v", tc.template, k, time.Since(start))
			if _, isJupyter := k.(*jupyterKernel); isJupyter != tc.jupyter {
				t.Fatalf("StartPython gave %T", k)
			}
			pyMustRun(t, k, "x = 20")
			if got := pyMustRun(t, k, "x * 2 + 2").main(t)["text/plain"]; got != "42" {
				t.Errorf("x*2+2 = %v", got)
			}
			if tc.jupyter {
				// IPython keeps In, Out and _ in memory; only its SQLite
				// history file is off (StartIPykernel).
				if got := pyMustRun(t, k, "(_, In[-2], len(Out) > 0)").main(t)["text/plain"]; got != "(42, 'x * 2 + 2', True)" {
					t.Errorf("in-memory history: %v", got)
				}
			}
			out := pyRun(t, k, "import os\nprint(os.environ.get('E1'))", map[string]string{"E1": "v"})
			if strings.TrimSpace(out.text("stdout")) != "v" {
				t.Errorf("env: %q %v", out.text("stdout"), out.err)
			}
			if tc.jupyter {
				out := pyMustRun(t, k, "import matplotlib.pyplot as plt\nplt.bar(['a', 'b'], [1, 2])\nplt.show()")
				res := out.results()
				if len(res) != 1 || res[0].Data["image/png"] == nil {
					t.Fatalf("plot results %d: %+v", len(res), res)
				}
				if c, _ := res[0].Data["e2b/chart"].(map[string]any); c == nil || c["type"] != "bar" {
					t.Errorf("chart %v", res[0].Data["e2b/chart"])
				}
				html, _ := pyMustRun(t, k, "import pandas as pd\npd.DataFrame({'a': [1]})").main(t)["text/html"].(string)
				if !strings.Contains(html, "<table") {
					t.Errorf("DataFrame html %q", html)
				}
			}
			ictx, icancel := context.WithCancel(context.Background())
			time.AfterFunc(300*time.Millisecond, icancel)
			if _, err := k.Execute(ictx, "import time\ntime.sleep(30)", nil, func(Event) {}); err != context.Canceled {
				t.Fatalf("interrupt: %v", err)
			}
			if got := pyMustRun(t, k, "x").main(t)["text/plain"]; got != "20" {
				t.Errorf("x after interrupt = %v", got)
			}
			var ds []time.Duration
			for range 30 {
				s := time.Now()
				pyMustRun(t, k, "1+1")
				ds = append(ds, time.Since(s))
			}
			pySortDurations(ds)
			t.Logf("%s: trivial execute p50 %v", tc.template, ds[len(ds)/2])
		})
	}
}
