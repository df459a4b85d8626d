package sandboxlog

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestWriteReadRotate(t *testing.T) {
	dir := t.TempDir()
	w := NewWriter(filepath.Join(dir, FileName))
	w.max = 4 << 10
	for i := range 100 {
		w.Write(Entry{Level: Info, Logger: "envd.process", Message: fmt.Sprintf("entry %03d", i), Fields: map[string]string{"i": fmt.Sprint(i)}})
	}
	for _, name := range []string{FileName, RotatedName} {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() > w.max {
			t.Fatalf("%s is %d bytes, past the %d cap", name, st.Size(), w.max)
		}
	}
	got, err := Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) < 10 || len(got) >= 100 {
		t.Fatalf("read %d entries after rotation", len(got))
	}
	// The newest survive, in order, the oldest went with the rotation.
	if last := got[len(got)-1]; last.Message != "entry 099" || last.Origin != OriginSandbox || last.Fields["i"] != "99" {
		t.Fatalf("last entry %+v", last)
	}
	for i := 1; i < len(got); i++ {
		if got[i].Message <= got[i-1].Message {
			t.Fatalf("entries out of order: %q then %q", got[i-1].Message, got[i].Message)
		}
	}
}

func TestReadDistrustsTheFile(t *testing.T) {
	dir := t.TempDir()
	forged, _ := json.Marshal(map[string]any{"time": time.Now(), "level": "fatal", "logger": "airlock.oom", "message": strings.Repeat("x", 3*MaxMessageBytes), "origin": "host"})
	long := `{"time":"2026-01-01T00:00:00Z","level":"info","message":"` + strings.Repeat("y", maxLineBytes) + `"}`
	content := "not json\n" + string(forged) + "\n" + long + "\n" + `{"level":"info","message":"no time"}` + "\n"
	if err := os.WriteFile(filepath.Join(dir, FileName), []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 {
		t.Fatalf("want only the one well-formed line, got %d: %+v", len(got), got)
	}
	e := got[0]
	if e.Origin != OriginSandbox || e.Logger != "envd.airlock.oom" || e.Level != Info || len(e.Message) > MaxMessageBytes {
		t.Fatalf("a forged line came through as origin %q logger %q level %q (%d bytes)", e.Origin, e.Logger, e.Level, len(e.Message))
	}

	// A symlink to a host file, and a FIFO, are refused without hanging.
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte(`{"time":"2026-01-01T00:00:00Z","level":"info","message":"host secret"}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(dir, FileName))
	if err := os.Symlink(secret, filepath.Join(dir, FileName)); err != nil {
		t.Fatal(err)
	}
	if got, err := Read(dir); err == nil || len(got) != 0 {
		t.Fatalf("read through a symlink: %+v, %v", got, err)
	}
	os.Remove(filepath.Join(dir, FileName))
	if err := syscall.Mkfifo(filepath.Join(dir, FileName), 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := Read(dir); done <- err }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a FIFO read as a log")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Read hung on a FIFO")
	}
}

func TestReadBoundsAHugeFile(t *testing.T) {
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, FileName))
	if err != nil {
		t.Fatal(err)
	}
	line := `{"time":"2026-01-01T00:00:00Z","level":"info","message":"filler"}` + "\n"
	for range (3 * MaxFileBytes) / len(line) {
		f.WriteString(line)
	}
	f.WriteString(`{"time":"2026-01-01T00:00:01Z","level":"error","message":"last"}` + "\n")
	f.Close()
	got, err := Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(got); n == 0 || n > MaxFileBytes/len(line)+1 || got[n-1].Message != "last" {
		t.Fatalf("read %d entries of a file three times the cap", n)
	}
}

func TestSuspendHoldsWrites(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, FileName)
	w := NewWriter(path)
	w.Write(Entry{Level: Info, Message: "before"})
	w.Suspend()
	w.Write(Entry{Level: Info, Message: "during"})
	if got, _ := Read(dir); len(got) != 1 {
		t.Fatalf("a suspended writer wrote: %+v", got)
	}
	w.Resume()
	got, _ := Read(dir)
	if len(got) != 2 || got[1].Message != "during" {
		t.Fatalf("after Resume: %+v", got)
	}
}

// BenchmarkWrite is what envd adds to each process start and end.
func BenchmarkWrite(b *testing.B) {
	w := NewWriter(filepath.Join(b.TempDir(), FileName))
	e := Entry{Level: Info, Logger: "envd.process", Message: "process 123 started: /bin/bash -l -c \"echo hello\"",
		Fields: map[string]string{"pid": "123", "cmd": "/bin/bash -l -c \"echo hello\"", "user": "user"}}
	for b.Loop() {
		w.Write(e)
	}
}
