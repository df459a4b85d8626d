package tplbuild

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/template"
)

// fakeBuilder stands in for template.Store: builds block until release and
// fail when the Dockerfile says "exit 3".
type fakeBuilder struct {
	release chan struct{}
	got     chan template.BuildRequest

	mu     sync.Mutex
	owners map[string]string // claimed names
	sweeps int
}

func (f *fakeBuilder) Build(ctx context.Context, req template.BuildRequest, progress io.Writer) (template.Template, error) {
	f.got <- req
	select {
	case <-f.release:
	case <-ctx.Done():
		return template.Template{}, ctx.Err()
	}
	fmt.Fprintln(req.Output, "step output line")
	if strings.Contains(string(req.Dockerfile), "exit 3") {
		return template.Template{}, &template.BuildError{Name: req.Name, Tail: []string{"about to fail"},
			Err: &template.StepError{Step: 1, Steps: 1, Line: 3, Text: "RUN exit 3", ExitCode: 3}}
	}
	return template.Template{ID: req.Name}, nil
}

func (f *fakeBuilder) Get(name string) (template.Template, error) {
	if name == "base" {
		return template.Template{ID: "base", Settings: template.Settings{DefaultUser: "user"}}, nil
	}
	return template.Template{}, template.ErrNotFound
}

func (f *fakeBuilder) IsBuiltin(name string) bool { return name == "base" }

func (f *fakeBuilder) Claim(name, owner string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if o, ok := f.owners[name]; ok && o != owner {
		return fmt.Errorf("%w: %s", template.ErrOwned, name)
	}
	f.owners[name] = owner
	return nil
}

func (f *fakeBuilder) SweepBuildBox(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sweeps++
	return nil
}

func (f *fakeBuilder) Unclaim(name, owner string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.owners[name] == owner {
		delete(f.owners, name)
	}
	return nil
}

func newService(t *testing.T, dir string) (*Service, *fakeBuilder) {
	t.Helper()
	return newServiceWith(t, Options{Dir: filepath.Join(dir, "builds"), FilesDir: filepath.Join(dir, "files"), MaxUpload: 1 << 20})
}

func newServiceWith(t *testing.T, opts Options) (*Service, *fakeBuilder) {
	t.Helper()
	fb := &fakeBuilder{release: make(chan struct{}), got: make(chan template.BuildRequest, 4), owners: map[string]string{}}
	s, err := Open(fb, opts)
	if err != nil {
		t.Fatal(err)
	}
	return s, fb
}

func waitStatus(t *testing.T, s *Service, tpl, id, want string) Status {
	t.Helper()
	return waitOwnerStatus(t, s, "", tpl, id, want)
}

func waitOwnerStatus(t *testing.T, s *Service, owner, tpl, id, want string) Status {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := s.Status(owner, tpl, id, 0, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if st.Status == want {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("status %s, want %s", st.Status, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// sdkHash is the npm SDK's calculateFilesHash for one regular file.
func sdkHash(src, dest, rel string, mode int, content string) string {
	h := sha256.New()
	fmt.Fprintf(h, "COPY %s %s%s%d%d%s", src, dest, rel, mode, len(content), content)
	return hex.EncodeToString(h.Sum(nil))
}

func tgz(t *testing.T, name, content string) []byte {
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(content)), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	io.WriteString(tw, content)
	tw.Close()
	gz.Close()
	return buf.Bytes()
}

func TestJobLifecycle(t *testing.T) {
	s, fb := newService(t, t.TempDir())
	defer s.Close()
	// Two builds with a bound of one: the second waits.
	tpl, id, err := s.Request(Request{Name: "my-agent", CPUCount: 1})
	if err != nil || tpl != "my-agent" {
		t.Fatal(tpl, err)
	}
	hash := sdkHash("f.txt", "/f.txt", "f.txt", 0o100644, "hello")
	if ok, err := s.FilePresent("", tpl, hash); ok || err != nil {
		t.Fatal(ok, err)
	}
	if err := s.PutFile("", hash, bytes.NewReader(tgz(t, "f.txt", "hello"))); err != nil {
		t.Fatal(err)
	}
	if ok, _ := s.FilePresent("", tpl, hash); !ok {
		t.Fatal("upload not present")
	}
	spec := Spec{FromTemplate: "base", StartCmd: "serve", Steps: []Step{
		{Type: "COPY", Args: []string{"f.txt", "/f.txt"}, FilesHash: hash},
	}}
	if err := s.Start("", tpl, id, spec); err != nil {
		t.Fatal(err)
	}
	if err := s.Start("", tpl, id, spec); !errors.Is(err, ErrInvalid) {
		t.Errorf("second start: %v", err)
	}
	req := <-fb.got
	if !req.Untrusted {
		t.Error("an API build is not marked untrusted: its steps would reach private networks")
	}
	if req.Settings.StartCmd != "serve" || req.Settings.CPUCount != 1 || !strings.Contains(string(req.Dockerfile), "COPY --chown=user") {
		t.Errorf("request: %+v\n%s", req.Settings, req.Dockerfile)
	}
	data, err := os.ReadFile(filepath.Join(req.ContextDir, hash, "f.txt"))
	if err != nil || string(data) != "hello" {
		t.Errorf("context file: %q %v", data, err)
	}
	waitStatus(t, s, tpl, id, StatusBuilding)

	tpl2, id2, _ := s.Request(Request{Name: "failing"})
	if err := s.Start("", tpl2, id2, Spec{FromTemplate: "base", Steps: []Step{{Type: "RUN", Args: []string{"exit 3"}}}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	waitStatus(t, s, tpl2, id2, StatusWaiting)

	fb.release <- struct{}{}
	st := waitStatus(t, s, tpl, id, StatusReady)
	if len(st.Entries) == 0 || !strings.Contains(fmt.Sprint(st.Entries), "step output line") {
		t.Errorf("entries: %+v", st.Entries)
	}
	if page, _ := s.Status("", tpl, id, len(st.Entries), 100); len(page.Entries) != 0 {
		t.Errorf("offset past the end: %+v", page.Entries)
	}
	if _, err := os.Stat(req.ContextDir); !os.IsNotExist(err) {
		t.Errorf("context left behind: %v", err)
	}

	<-fb.got
	fb.release <- struct{}{}
	st = waitStatus(t, s, tpl2, id2, StatusError)
	// Line 3 of the Dockerfile (FROM, USER user, RUN) is the SDK's step 1.
	if st.Reason == nil || st.Reason.Step != "1" || !strings.Contains(st.Reason.Message, "exited with code 3") || !strings.Contains(st.Reason.Message, "about to fail") {
		t.Errorf("reason: %+v", st.Reason)
	}
	if _, err := s.Status("", "other", id2, 0, 10); !errors.Is(err, ErrNotFound) {
		t.Errorf("wrong template: %v", err)
	}
}

func TestBadUploads(t *testing.T) {
	s, _ := newService(t, t.TempDir())
	defer s.Close()
	// A refused start drops its build: each attempt is a new one.
	start := func(spec Spec) error {
		t.Helper()
		tpl, id, err := s.Request(Request{Name: "x"})
		if err != nil {
			t.Fatal(err)
		}
		err = s.Start("", tpl, id, spec)
		if _, serr := s.Status("", tpl, id, 0, 1); err != nil && !errors.Is(serr, ErrNotFound) {
			t.Errorf("a refused build is still there: %v", serr)
		}
		return err
	}
	tpl := "x"
	never := sdkHash("a", "/a", "a", 0o100644, "a")
	err := start(Spec{FromTemplate: "base", Steps: []Step{{Type: "COPY", Args: []string{"a", "/a"}, FilesHash: never}}})
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "never uploaded") {
		t.Errorf("never uploaded: %v", err)
	}
	// Bytes that are not what was hashed: refused and dropped.
	if err := s.PutFile("", never, bytes.NewReader(tgz(t, "a", "b"))); err != nil {
		t.Fatal(err)
	}
	err = start(Spec{FromTemplate: "base", Steps: []Step{{Type: "COPY", Args: []string{"a", "/a"}, FilesHash: never}}})
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "do not match") {
		t.Errorf("mismatch: %v", err)
	}
	if ok, _ := s.FilePresent("", tpl, never); ok {
		t.Error("a mismatched upload is kept")
	}
	// Not a tar; names leaving the context; too large.
	for _, body := range [][]byte{[]byte("plain text"), tgz(t, "../evil", "x")} {
		s.PutFile("", never, bytes.NewReader(body))
		err = start(Spec{FromTemplate: "base", Steps: []Step{{Type: "COPY", Args: []string{"a", "/a"}, FilesHash: never}}})
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("bad archive: %v", err)
		}
	}
	if err := s.PutFile("", never, bytes.NewReader(make([]byte, 2<<20))); !errors.Is(err, ErrTooLarge) {
		t.Errorf("too large: %v", err)
	}
	for _, n := range []string{"Upper", "a:", "a:B", "a:b c", "base", "base:v1", "x:default:y"} {
		if _, _, err := s.Request(Request{Name: n}); !errors.Is(err, ErrInvalid) {
			t.Errorf("name %q: %v", n, err)
		}
	}
	if _, _, err := s.Request(Request{Name: "ok", Tags: []string{"v1", "Bad"}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("tag Bad: %v", err)
	}
	for _, n := range []string{"ok:default", "ok:v1.2", "ok"} {
		if _, _, err := s.Request(Request{Name: n, Tags: []string{"stable"}}); err != nil {
			t.Errorf("name %s: %v", n, err)
		}
	}
}

// A server that stops during a build reports it as failed after a restart.
func TestRestartFailsUnfinished(t *testing.T) {
	dir := t.TempDir()
	s, fb := newService(t, dir)
	tpl, id, _ := s.Request(Request{Name: "slow"})
	if err := s.Start("", tpl, id, Spec{FromTemplate: "base", Steps: []Step{{Type: "RUN", Args: []string{"sleep 1000"}}}}); err != nil {
		t.Fatal(err)
	}
	<-fb.got
	waitStatus(t, s, tpl, id, StatusBuilding)
	// A crash: the record says building; no Close ran.
	rec, err := s.readRecord(id)
	if err != nil || rec.Status != StatusBuilding {
		t.Fatal(rec, err)
	}
	s2, fb2 := newService(t, dir)
	if fb2.sweeps != 1 {
		t.Errorf("the build box was swept %d times after a crash during a build, want once", fb2.sweeps)
	}
	st, err := s2.Status("", tpl, id, 0, 10)
	if err != nil || st.Status != StatusError || st.Reason == nil || !strings.Contains(st.Reason.Message, "restarted") {
		t.Errorf("after restart: %+v %v", st, err)
	}
	s.Close()
	s2.Close()
}

// A build belongs to the key that asked for it: another key neither sees it
// nor builds the name, and a failed first build frees the name again.
func TestOwnership(t *testing.T) {
	s, fb := newService(t, t.TempDir())
	defer s.Close()
	tpl, id, err := s.Request(Request{Name: "agent", Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Request(Request{Name: "agent", Owner: "bob"}); !errors.Is(err, ErrForbidden) {
		t.Errorf("bob builds alice's name: %v", err)
	}
	_, again, err := s.Request(Request{Name: "agent", Owner: "alice"})
	if err != nil {
		t.Errorf("alice builds her name again: %v", err)
	}
	// While that second build may still start, the name stays hers.
	if err := s.Cancel("alice", tpl, again); err != nil {
		t.Fatal(err)
	}
	spec := Spec{FromTemplate: "base", Steps: []Step{{Type: "RUN", Args: []string{"exit 3"}}}}
	if err := s.Start("bob", tpl, id, spec); !errors.Is(err, ErrNotFound) {
		t.Errorf("bob starts alice's build: %v", err)
	}
	if _, err := s.Status("bob", tpl, id, 0, 10); !errors.Is(err, ErrNotFound) {
		t.Errorf("bob reads alice's build: %v", err)
	}
	if _, err := s.FilePresent("bob", tpl, strings.Repeat("a", 64)); !errors.Is(err, ErrNotFound) {
		t.Errorf("bob asks about uploads of alice's template: %v", err)
	}
	if err := s.Start("alice", tpl, id, spec); err != nil {
		t.Fatal(err)
	}
	<-fb.got
	fb.release <- struct{}{}
	waitOwnerStatus(t, s, "alice", tpl, id, StatusError)
	fb.mu.Lock()
	_, claimed := fb.owners["agent"]
	fb.mu.Unlock()
	if claimed {
		t.Error("a failed first build keeps the name claimed")
	}
}

// Per-key bounds: builds at once, context size, build time.
func TestPerKeyBounds(t *testing.T) {
	dir := t.TempDir()
	s, fb := newServiceWith(t, Options{
		Dir: filepath.Join(dir, "builds"), FilesDir: filepath.Join(dir, "files"),
		MaxConcurrent: 2, MaxPerOwner: 1, MaxContext: 10, Timeout: 300 * time.Millisecond,
	})
	defer s.Close()
	run := Spec{FromTemplate: "base", Steps: []Step{{Type: "RUN", Args: []string{"sleep 1000"}}}}
	tpl, id, _ := s.Request(Request{Name: "one", Owner: "alice"})
	if err := s.Start("alice", tpl, id, run); err != nil {
		t.Fatal(err)
	}
	<-fb.got
	tpl2, id2, _ := s.Request(Request{Name: "two", Owner: "alice"})
	err := s.Start("alice", tpl2, id2, run)
	if !errors.Is(err, ErrLimit) || !strings.Contains(err.Error(), "--builds-per-key") {
		t.Errorf("second build of one key: %v", err)
	}
	// Another key has its own bound.
	tpl3, id3, _ := s.Request(Request{Name: "three", Owner: "bob"})
	if err := s.Start("bob", tpl3, id3, run); err != nil {
		t.Errorf("another key's build: %v", err)
	}
	<-fb.got
	// The fake builder blocks until released: only the time bound ends it.
	st := waitOwnerStatus(t, s, "alice", tpl, id, StatusError)
	if st.Reason == nil || !strings.Contains(st.Reason.Message, "time limit") || !strings.Contains(st.Reason.Message, "--build-timeout") {
		t.Errorf("timed-out build: %+v", st.Reason)
	}
	// A refused build is dropped; with the slot free again, a new one
	// starts, but its context is over the 10-byte bound.
	if _, err := s.Status("alice", tpl2, id2, 0, 1); !errors.Is(err, ErrNotFound) {
		t.Errorf("a build refused by the bound is still there: %v", err)
	}
	tpl2, id2, _ = s.Request(Request{Name: "two", Owner: "alice"})
	content := "more than ten bytes"
	hash := sdkHash("f", "/f", "f", 0o100644, content)
	if err := s.PutFile("alice", hash, bytes.NewReader(tgz(t, "f", content))); err != nil {
		t.Fatal(err)
	}
	err = s.Start("alice", tpl2, id2, Spec{FromTemplate: "base", Steps: []Step{{Type: "COPY", Args: []string{"f", "/f"}, FilesHash: hash}}})
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "--build-context-max") {
		t.Errorf("context over the bound: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "builds", id2)); !os.IsNotExist(err) {
		t.Errorf("a refused build left its context: %v", err)
	}
}

// Cancel stops a running build and a waiting one; a finished build cannot
// be cancelled; another key's build is not there to cancel.
func TestCancel(t *testing.T) {
	s, fb := newService(t, t.TempDir()) // one build at a time
	defer s.Close()
	run := Spec{FromTemplate: "base", Steps: []Step{{Type: "RUN", Args: []string{"sleep 1000"}}}}
	tpl, id, _ := s.Request(Request{Name: "running", Owner: "alice"})
	if err := s.Start("alice", tpl, id, run); err != nil {
		t.Fatal(err)
	}
	req := <-fb.got
	tpl2, id2, _ := s.Request(Request{Name: "queued", Owner: "alice"})
	if err := s.Start("alice", tpl2, id2, run); err != nil {
		t.Fatal(err)
	}
	waitOwnerStatus(t, s, "alice", tpl2, id2, StatusWaiting)
	if err := s.Cancel("bob", tpl, id); !errors.Is(err, ErrNotFound) {
		t.Errorf("bob cancels alice's build: %v", err)
	}
	changed := s.StatusChanged("alice", tpl, id)
	if changed == nil || s.StatusChanged("bob", tpl, id) != nil {
		t.Fatal("StatusChanged: no channel for the owner, or one for another key")
	}
	if err := s.Cancel("alice", tpl, id); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	case <-time.After(5 * time.Second):
		t.Fatal("StatusChanged was not closed when the build ended")
	}
	if s.StatusChanged("alice", tpl, id) != nil {
		t.Error("StatusChanged of a finished build: want nil, nothing will change")
	}
	st := waitOwnerStatus(t, s, "alice", tpl, id, StatusError)
	if st.Reason == nil || !strings.Contains(st.Reason.Message, "cancelled") {
		t.Errorf("cancelled build: %+v", st.Reason)
	}
	if _, err := os.Stat(req.ContextDir); !os.IsNotExist(err) {
		t.Errorf("a cancelled build left its context: %v", err)
	}
	// The waiting one gets the slot; cancelling its template stops it.
	<-fb.got
	waitOwnerStatus(t, s, "alice", tpl2, id2, StatusBuilding)
	if n := s.CancelTemplate("alice", tpl2); n != 1 {
		t.Errorf("CancelTemplate: %d builds, want 1", n)
	}
	waitOwnerStatus(t, s, "alice", tpl2, id2, StatusError)
	if err := s.Cancel("alice", tpl, id); !errors.Is(err, ErrFinished) {
		t.Errorf("cancel a finished build: %v", err)
	}
	// Requested, never started: cancelled without running.
	tpl3, id3, _ := s.Request(Request{Name: "never", Owner: "alice"})
	if err := s.Cancel("alice", tpl3, id3); err != nil {
		t.Fatal(err)
	}
	waitOwnerStatus(t, s, "alice", tpl3, id3, StatusError)
	if err := s.Start("alice", tpl3, id3, run); err == nil {
		t.Error("a cancelled build started")
	}
}

// A build requested and never started (its client went away between the
// two calls) is dropped after requestTTL, and frees its name.
func TestUnstartedRequestsExpire(t *testing.T) {
	s, fb := newService(t, t.TempDir())
	defer s.Close()
	tpl, id, err := s.Request(Request{Name: "left", Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	s.jobs[id].rec.CreatedAt = time.Now().Add(-requestTTL - time.Minute)
	s.mu.Unlock()
	if _, _, err := s.Request(Request{Name: "other", Owner: "bob"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Status("alice", tpl, id, 0, 1); !errors.Is(err, ErrNotFound) {
		t.Errorf("an expired request is still there: %v", err)
	}
	fb.mu.Lock()
	_, claimed := fb.owners["left"]
	fb.mu.Unlock()
	if claimed {
		t.Error("an expired request keeps its name claimed")
	}
}

// Uploads are apart per API key: one key's upload is not "present" for
// another, which cannot build with it either (it would learn that someone
// uploaded those exact files).
func TestUploadsPerKey(t *testing.T) {
	s, _ := newService(t, t.TempDir())
	defer s.Close()
	hash := sdkHash("f.txt", "/f.txt", "f.txt", 0o100644, "secret")
	if err := s.PutFile("a11ce", hash, bytes.NewReader(tgz(t, "f.txt", "secret"))); err != nil {
		t.Fatal(err)
	}
	tplA, _, _ := s.Request(Request{Name: "a-tpl", Owner: "a11ce"})
	tplB, idB, _ := s.Request(Request{Name: "b-tpl", Owner: "b0b"})
	if ok, err := s.FilePresent("a11ce", tplA, hash); !ok || err != nil {
		t.Errorf("the uploader's own file: %v %v", ok, err)
	}
	if ok, err := s.FilePresent("b0b", tplB, hash); ok || err != nil {
		t.Errorf("another key's upload is present for b0b: %v %v", ok, err)
	}
	err := s.Start("b0b", tplB, idB, Spec{FromTemplate: "base", Steps: []Step{{Type: "COPY", Args: []string{"f.txt", "/f.txt"}, FilesHash: hash}}})
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "never uploaded") {
		t.Errorf("b0b builds with a11ce's upload: %v", err)
	}
	for _, owner := range []string{"../x", "A11CE", "a/b"} {
		if err := s.PutFile(owner, hash, bytes.NewReader(tgz(t, "f.txt", "x"))); !errors.Is(err, ErrInvalid) {
			t.Errorf("PutFile with owner %q: %v", owner, err)
		}
	}
}

// A team's own quota of builds at once replaces the server's per-key bound.
func TestTeamBuildQuota(t *testing.T) {
	dir := t.TempDir()
	s, fb := newServiceWith(t, Options{
		Dir: filepath.Join(dir, "builds"), FilesDir: filepath.Join(dir, "files"),
		MaxConcurrent: 3, MaxPerOwner: 1, Timeout: 300 * time.Millisecond,
		MaxFor: func(owner string) int {
			if owner == "team-bob" {
				return 2
			}
			return 0
		},
	})
	defer s.Close()
	run := Spec{FromTemplate: "base", Steps: []Step{{Type: "RUN", Args: []string{"sleep 1000"}}}}
	for i, want := range []string{"", "", "quota of template builds at once reached: the team has 2 builds waiting or building, its limit is 2"} {
		tpl, id, _ := s.Request(Request{Name: fmt.Sprintf("b%d", i), Owner: "team-bob"})
		err := s.Start("team-bob", tpl, id, run)
		switch {
		case want == "" && err != nil:
			t.Fatalf("build %d under the team's quota: %v", i, err)
		case want == "":
			<-fb.got
		case !errors.Is(err, ErrLimit) || !strings.Contains(err.Error(), want):
			t.Errorf("build %d past the team's quota: %v", i, err)
		}
	}
}
