package template_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/fstest"
	"time"

	"github.com/airlock-sandbox/airlock/internal/template"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// syncBuffer is a build's progress output, read while the build writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// chainStore opens the test data dir's store with two built-ins of its own, child
// FROM parent FROM base (the test data dir's base), under names no other run uses.
func chainStore(t *testing.T, parentRun string) (s *template.Store, parent, child string) {
	t.Helper()
	testenv.NeedRoot(t)
	testenv.BaseRootfs(t)
	tag := time.Now().UnixNano() % 1_000_000_000
	parent, child = fmt.Sprintf("test-parent-%d", tag), fmt.Sprintf("test-child-%d", tag)
	fsys := fstest.MapFS{
		parent + "/Dockerfile": {Data: []byte("FROM base\nRUN " + parentRun + "\n")},
		child + "/Dockerfile":  {Data: []byte("FROM " + parent + "\nRUN cat /parent.txt > /child.txt\n")},
	}
	s, err := template.Open(template.Options{DataDir: testenv.DataDir(), EnvdPath: testenv.EnvdBinary(t), Builtins: fsys})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, n := range []string{child, parent} {
			if err := s.Remove(context.Background(), n, nil); err != nil && !errors.Is(err, template.ErrNotFound) {
				t.Errorf("remove %s: %v", n, err)
			}
		}
	})
	return s, parent, child
}

// TestBuiltinFromUnbuiltBuiltin builds a built-in whose FROM is a built-in that is
// not built yet. The parent is built first, outside the build slot: building it
// from inside the child's build used to wait for the slot the child held, forever,
// at 0% CPU (`airlock template build code-interpreter-v1` after python3 changed).
// Meanwhile lookups of both say how far their builds are.
func TestBuiltinFromUnbuiltBuiltin(t *testing.T) {
	s, parent, child := chainStore(t, "sleep 3 && echo from-parent > /parent.txt")
	var out syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	type result struct {
		tpl template.Template
		err error
	}
	done := make(chan result, 1)
	go func() {
		tpl, err := s.BuildBuiltin(ctx, child, &out)
		done <- result{tpl, err}
	}()

	// While the parent's step sleeps: the parent is on its step, the child waits
	// for it; both are BuildingErrors (503 at the API), not "not built".
	seen := map[string]string{}
	deadline := time.Now().Add(time.Minute)
	for len(seen) < 2 && time.Now().Before(deadline) {
		for name, want := range map[string]*regexp.Regexp{
			parent: regexp.MustCompile(`^step 1/1: RUN sleep 3`),
			child:  regexp.MustCompile(`^waiting for its FROM template ` + parent + ` to build$`),
		} {
			_, err := s.Get(name)
			var be *template.BuildingError
			if errors.As(err, &be) && want.MatchString(be.Status) {
				if !errors.Is(err, template.ErrBuilding) || !errors.Is(err, template.ErrNotBuilt) || be.RetryAfter() <= 0 {
					t.Errorf("%s: %v does not match ErrBuilding and ErrNotBuilt, or has no RetryAfter", name, err)
				}
				if !strings.Contains(err.Error(), "template "+name+" is still being built: "+be.Status+" (for 0:0") {
					t.Errorf("%s: message %q", name, err)
				}
				seen[name] = err.Error()
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(seen) < 2 {
		t.Errorf("lookups during the build: saw %v, want both %s and %s building", seen, parent, child)
	}
	t.Logf("during the build: %q", seen)

	r := <-done
	if r.err != nil {
		t.Fatalf("build %s: %v\n%s", child, r.err, out.String())
	}
	if got, err := os.ReadFile(filepath.Join(r.tpl.RootFS, "child.txt")); err != nil || string(got) != "from-parent\n" {
		t.Errorf("child.txt = %q, %v", got, err)
	}
	if !strings.Contains(out.String(), "waiting for its FROM template "+parent+" to build (since ") {
		t.Errorf("the child did not say what it waited for:\n%s", out.String())
	}
	if _, err := s.Get(child); err != nil {
		t.Errorf("after the build: %v", err)
	}
}

// TestQueuedLookup: a built-in serve queued for a background build answers
// "queued" until it is dequeued, then "not built" again.
func TestQueuedLookup(t *testing.T) {
	s, parent, _ := chainStore(t, "true")
	s.Queue(parent)
	_, err := s.Get(parent)
	var be *template.BuildingError
	if !errors.As(err, &be) || be.Status != "queued" {
		t.Fatalf("queued: %v", err)
	}
	s.Dequeue(parent)
	_, err = s.Get(parent)
	if errors.As(err, &be) || !errors.Is(err, template.ErrNotBuilt) {
		t.Fatalf("dequeued: %v, want a plain ErrNotBuilt", err)
	}
}

// TestBuildWaitingForLayerLock: a build that must wait for the layer lock (another
// process collecting garbage holds it) says what it waits for, who holds it and
// since when, again every so often while it waits, and the lookup says so too.
func TestBuildWaitingForLayerLock(t *testing.T) {
	defer template.SetWaitReport(500 * time.Millisecond)()
	s, parent, _ := chainStore(t, "echo p > /parent.txt")
	lock := filepath.Join(testenv.DataDir(), "layers", ".lock")
	// flock(1) holds the lock exclusively, as a collection would, until the
	// build has said it waits (below): a fixed hold could end while the build
	// still waits for the build sandbox, which other packages' tests share.
	holder := exec.Command("flock", "--exclusive", lock, "sleep", "300")
	holder.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	release := sync.OnceFunc(func() {
		// flock and its sleep share the locked file: end both.
		_ = syscall.Kill(-holder.Process.Pid, syscall.SIGKILL)
		_ = holder.Wait()
	})
	defer release()
	// Until flock holds it: granted, not merely queued ("->" in /proc/locks)
	// behind a build of another package's tests, which shares the layer store.
	held := func() bool {
		out, _ := os.ReadFile("/proc/locks")
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, fmt.Sprintf(" %d ", holder.Process.Pid)) && !strings.Contains(l, "->") {
				return true
			}
		}
		return false
	}
	for deadline := time.Now().Add(2 * time.Minute); !held(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("flock never took the lock")
		}
	}
	var out syncBuffer
	done := make(chan error, 1)
	go func() {
		_, err := s.BuildBuiltin(context.Background(), parent, &out)
		done <- err
	}()
	var status string
	for deadline := time.Now().Add(2 * time.Minute); status == "" && time.Now().Before(deadline); {
		var be *template.BuildingError
		if _, err := s.Get(parent); errors.As(err, &be) && strings.HasPrefix(be.Status, "waiting for the layer lock") {
			status = be.Status
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Long enough for a periodic report (every 500 ms here), then the
	// collection ends.
	time.Sleep(1200 * time.Millisecond)
	release()
	if err := <-done; err != nil {
		t.Fatalf("build: %v\n%s", err, out.String())
	}
	text := out.String()
	want := regexp.MustCompile(`waiting for the layer lock \S+ held by pid ` + fmt.Sprint(holder.Process.Pid) + ` \(flock --exclusive \S+ sleep 300\) \(since \d\d:\d\d:\d\d\)`)
	if !want.MatchString(text) {
		t.Errorf("no wait message matching %s:\n%s", want, text)
	}
	if !strings.Contains(text, "still waiting for the layer lock") || !regexp.MustCompile(`waited 0:0[1-4] for the layer lock`).MatchString(text) {
		t.Errorf("no periodic or final wait message:\n%s", text)
	}
	if !strings.Contains(status, "held by pid") {
		t.Errorf("lookup during the wait: status %q", status)
	}
}
