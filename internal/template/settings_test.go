package template

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestParseSettings(t *testing.T) {
	s, err := ParseSettings([]byte(`
template_name = "web"
aliases = ["site"]
cpu_count = 1
memory_mb = 256
disk_mb = 2048
start_cmd = "python3 -m http.server"
ready_cmd = "curl -sf localhost:8000"
ready_timeout = 20
[build_args]
VERSION = "2"
`))
	if err != nil {
		t.Fatal(err)
	}
	if s.Name != "web" || s.CPUCount != 1 || s.MemoryMB != 256 || s.DiskSizeMB != 2048 || s.BuildArgs["VERSION"] != "2" ||
		s.ReadyTimeout() != 20*time.Second || len(s.Aliases) != 1 {
		t.Errorf("parsed %+v", s)
	}
	merged := s.Merge(Settings{MemoryMB: 1024, BuildArgs: map[string]string{"OTHER": "x"}})
	if merged.MemoryMB != 1024 || merged.CPUCount != 1 || merged.BuildArgs["VERSION"] != "2" || merged.BuildArgs["OTHER"] != "x" {
		t.Errorf("merged %+v", merged)
	}
	if d := (Settings{}).withDefaults(); d.CPUCount != DefaultCPUCount || d.MemoryMB != DefaultMemoryMB || d.DiskSizeMB != DefaultDiskSizeMB || d.ReadyTimeout() != DefaultReadyTimeout {
		t.Errorf("defaults %+v", d)
	}
}

func TestParseSettingsRejects(t *testing.T) {
	for _, c := range []struct{ toml, want string }{
		{`memroy_mb = 5`, "unknown keys memroy_mb"},
		{`memory_mb = "lots"`, "memory_mb"},
		{`memory_mb = 10`, "memory_mb 10"},
		{`cpu_count = 100`, "cpu_count 100"},
		{`disk_mb = -1`, "disk_mb -1"},
		{`ready_cmd = "true"`, "ready_cmd needs a start_cmd"},
		{`template_name = "Not Valid"`, "template name"},
		{`aliases = ["ok", "NO"]`, "template name \"NO\""},
		{`workdir = "relative"`, "absolute"},
		{`runtime = "gVisor!"`, "runtime"},
		{`kernels = ["cobol"]`, "kernels: unknown language"},
		{"[build_args]\n\"1X\" = \"y\"", "build arg name"},
		{`ready_timeout = 99999`, "ready_timeout"},
		{`cpu_count = `, "toml"},
	} {
		_, err := ParseSettings([]byte(c.toml))
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want ErrInvalid mentioning %q", c.toml, err, c.want)
		}
	}
}
