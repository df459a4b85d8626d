package envd

import (
	"bytes"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	pb "github.com/airlock-sandbox/airlock/api/gen/process"
	"github.com/airlock-sandbox/airlock/internal/envdapi"
	"github.com/airlock-sandbox/airlock/internal/sandboxlog"
)

// envd's own warnings and errors reach the sandbox log (with their
// attributes); its info lines stay in envd.log only.
func TestEnvdErrorsInSandboxLog(t *testing.T) {
	dir := t.TempDir()
	var text bytes.Buffer
	srv, err := NewServer(envdapi.Config{LogPath: filepath.Join(dir, envdapi.LogName)}, slog.New(slog.NewTextHandler(&text, nil)))
	if err != nil {
		t.Fatal(err)
	}
	srv.log.Info("envd ready")
	srv.log.With("component", "watch").Error("watch failed", "err", errors.New("inotify limit"))
	srv.log.Warn("default user not found; using root", "user", "ghost")
	got, err := sandboxlog.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("want the error and the warning, got %+v", got)
	}
	if e := got[0]; e.Level != "error" || e.Logger != "envd" || e.Message != "watch failed" || e.Fields["err"] != "inotify limit" || e.Fields["component"] != "watch" {
		t.Fatalf("error entry: %+v", e)
	}
	if e := got[1]; e.Level != "warn" || e.Fields["user"] != "ghost" {
		t.Fatalf("warn entry: %+v", e)
	}
	if !strings.Contains(text.String(), "envd ready") || !strings.Contains(text.String(), "watch failed") {
		t.Fatalf("envd's own log lost lines: %s", text.String())
	}
}

// The start command's output is logged line by line, unfinished lines at
// its end, and cut after maxOutputLines.
func TestStartCmdOutputLog(t *testing.T) {
	dir := t.TempDir()
	w := sandboxlog.NewWriter(filepath.Join(dir, sandboxlog.FileName))
	o := newOutputLog(w, 42, startCmdTag)
	o.write("stdout", []byte("one\ntw"))
	o.write("stderr", []byte("bad\n"))
	o.write("stdout", []byte("o\nthree"))
	o.flush()
	got, _ := sandboxlog.Read(dir)
	var lines []string
	for _, e := range got {
		lines = append(lines, e.Level+":"+e.Fields["stream"]+":"+e.Message)
	}
	if want := "info:stdout:one|warn:stderr:bad|info:stdout:two|info:stdout:three"; strings.Join(lines, "|") != want {
		t.Fatalf("got %q, want %q", strings.Join(lines, "|"), want)
	}
	for range maxOutputLines + 10 {
		o.write("stdout", []byte("spam\n"))
	}
	got, _ = sandboxlog.Read(dir)
	if n := len(got); n != maxOutputLines+1 || !strings.Contains(got[n-1].Message, "further output is not logged") {
		t.Fatalf("%d entries after the flood, last %+v", n, got[n-1])
	}
}

func TestCommandLine(t *testing.T) {
	cfg := &pb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", "echo 'hi there'", ""}}
	if got, want := commandLine(cfg), `/bin/bash -l -c "echo 'hi there'" ""`; got != want {
		t.Fatalf("commandLine = %s, want %s", got, want)
	}
}
