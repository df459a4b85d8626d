package buildstep

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/envdapi"
	"github.com/airlock-sandbox/airlock/internal/unixuser"
)

func stepDB(t *testing.T) *unixuser.EtcUserDB {
	t.Helper()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	passwd := "root:x:0:0:root:/root:/bin/bash\n" +
		"user:x:1000:1000::/home/user:/bin/bash\n" +
		"svc:x:998:997::/var/lib/svc:/usr/sbin/nologin\n" +
		"nohome:x:1500:1500:::/bin/sh\n"
	group := "root:x:0:\nusers:x:100:user,svc\nuser:x:1000:\nsudo:x:27:user\nsvc:x:997:\ndocker:x:999:\n"
	if err := os.WriteFile(filepath.Join(root, "etc", "passwd"), []byte(passwd), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc", "group"), []byte(group), 0o644); err != nil {
		t.Fatal(err)
	}
	return &unixuser.EtcUserDB{Root: root}
}

func TestResolveUser(t *testing.T) {
	db := stepDB(t)
	cases := []struct {
		spec   string
		uid    uint32
		gid    uint32
		groups []uint32
		home   string
		name   string
	}{
		{"", 0, 0, []uint32{0}, "/root", "root"},
		{"root", 0, 0, []uint32{0}, "/root", "root"},
		{"user", 1000, 1000, []uint32{1000, 100, 27}, "/home/user", "user"},
		{"1000", 1000, 1000, []uint32{1000, 100, 27}, "/home/user", "user"},
		{"user:docker", 1000, 999, []uint32{999}, "/home/user", "user"},
		{"user:4242", 1000, 4242, []uint32{4242}, "/home/user", "user"},
		{"1000:100", 1000, 100, []uint32{100}, "/home/user", "user"},
		{"svc", 998, 997, []uint32{997, 100}, "/var/lib/svc", "svc"},
		{"4321", 4321, 0, []uint32{0}, "/", ""},
		{"4321:55", 4321, 55, []uint32{55}, "/", ""},
		{"nohome", 1500, 1500, []uint32{1500}, "/", "nohome"},
	}
	for _, c := range cases {
		got, err := ResolveUser(db, c.spec)
		if err != nil {
			t.Errorf("%q: %v", c.spec, err)
			continue
		}
		if got.UID != c.uid || got.GID != c.gid || got.Home != c.home || got.Name != c.name {
			t.Errorf("%q = %+v, want uid %d gid %d home %s name %q", c.spec, got, c.uid, c.gid, c.home, c.name)
		}
		g := slices.Clone(got.Groups)
		w := slices.Clone(c.groups)
		slices.Sort(g)
		slices.Sort(w)
		if !slices.Equal(g, w) {
			t.Errorf("%q groups = %v, want %v", c.spec, got.Groups, c.groups)
		}
	}
	for _, bad := range []string{"nosuch", "user:nosuchgroup", "user:", ":100", "nosuch:100"} {
		if _, err := ResolveUser(db, bad); err == nil {
			t.Errorf("%q resolved; want an error", bad)
		}
	}
}

func TestEnv(t *testing.T) {
	cred := &Cred{Name: "user", UID: 1000, Home: "/home/user"}
	env := Env([]string{"PATH=/opt/bin", "FOO=bar"}, cred)
	want := []string{"PATH=/opt/bin", "FOO=bar", "HOME=/home/user", "USER=user", "LOGNAME=user"}
	if !slices.Equal(env, want) {
		t.Errorf("Env = %v, want %v", env, want)
	}
	env = Env([]string{"HOME=/x"}, &Cred{UID: 4321, Home: "/"})
	want = []string{"HOME=/x", "PATH=" + envdapi.DefaultPath, "USER=4321", "LOGNAME=4321"}
	if !slices.Equal(env, want) {
		t.Errorf("Env = %v, want %v", env, want)
	}
}

func TestStepLookPath(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tool"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "noexec"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if p, err := lookPath("tool", []string{"PATH=/nonexistent:" + dir}); err != nil || p != filepath.Join(dir, "tool") {
		t.Errorf("lookPath(tool) = %q, %v", p, err)
	}
	if _, err := lookPath("noexec", []string{"PATH=" + dir}); err == nil {
		t.Errorf("a non-executable file was found")
	}
	if p, _ := lookPath("/abs/x", nil); p != "/abs/x" {
		t.Errorf("absolute path changed: %q", p)
	}
}

// TestRunStepResult runs a step in the test process (as root, so that the
// credential switch to root works) and reads the result file.
func TestRunStepResult(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	for _, c := range []struct {
		args []string
		cwd  string
		want envdapi.StepResult
	}{
		{[]string{"sh", "-c", "exit 3"}, "", envdapi.StepResult{ExitCode: 3}},
		{[]string{"sh", "-c", "test \"$(pwd)\" = /tmp && test \"$USER\" = root"}, "/tmp", envdapi.StepResult{}},
		{[]string{"sh", "-c", "kill -TERM $$"}, "", envdapi.StepResult{ExitCode: 143, Signal: 15}},
		{[]string{"true"}, "/no/such/dir", envdapi.StepResult{Error: "working directory /no/such/dir does not exist"}},
		{[]string{"no-such-command-xyz"}, "", envdapi.StepResult{Error: "no-such-command-xyz: command not found in PATH"}},
	} {
		exit := filepath.Join(t.TempDir(), "step.exit")
		spec, _ := json.Marshal(envdapi.StepSpec{Args: c.args, Cwd: c.cwd, ExitFile: exit})
		Run(bytes.NewReader(spec), slog.Default())
		got, err := envdapi.ReadStepResult(exit)
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		if got != c.want {
			t.Errorf("%v = %+v, want %+v", c.args, got, c.want)
		}
	}
	if code := Run(strings.NewReader("not json"), slog.Default()); code != 2 {
		t.Errorf("bad spec: status %d, want 2", code)
	}
}
