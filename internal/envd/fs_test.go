package envd

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	fspb "github.com/airlock-sandbox/airlock/api/gen/filesystem"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	must(t, os.MkdirAll(filepath.Dir(path), 0o755))
	must(t, os.WriteFile(path, []byte(content), 0o644))
}

func TestStat(t *testing.T) {
	e := newEnv(t)
	ctx := ctxTimeout(t, 10*time.Second)
	p := filepath.Join(e.home, "hello.txt")
	writeFile(t, p, "hello")
	must(t, os.Chown(p, 1000, 1000))
	must(t, os.Chmod(p, 0o644))
	must(t, unix.Setxattr(p, "user.e2b.owner-note", []byte("hi"), 0))

	// Relative paths resolve against the user's home.
	resp, err := e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "hello.txt"}))
	must(t, err)
	en := resp.Msg.GetEntry()
	if en.GetName() != "hello.txt" || en.GetPath() != p || en.GetType() != fspb.FileType_FILE_TYPE_FILE ||
		en.GetSize() != 5 || en.GetMode() != 0o644 || en.GetPermissions() != "-rw-r--r--" ||
		en.GetOwner() != "user" || en.GetGroup() != "user" || en.GetModifiedTime() == nil || en.SymlinkTarget != nil ||
		en.GetMetadata()["owner-note"] != "hi" {
		t.Fatalf("entry %v", en)
	}
	// ~ forms and root's home.
	resp, err = e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "~/hello.txt"}))
	must(t, err)
	if resp.Msg.GetEntry().GetPath() != p {
		t.Fatalf("~ path %v", resp.Msg.GetEntry().GetPath())
	}
	resp, err = e.fs.Stat(ctx, withUser(connect.NewRequest(&fspb.StatRequest{Path: "~"}), "root"))
	must(t, err)
	if en := resp.Msg.GetEntry(); en.GetPath() != e.rhome || en.GetType() != fspb.FileType_FILE_TYPE_DIRECTORY || en.GetPermissions() != "drwx------" || en.GetOwner() != "root" {
		t.Fatalf("root home %v", en)
	}

	// A directory's size is what ext4 reports: whole 4 KiB blocks, one for an
	// empty directory (btrfs and tmpfs report 0 or a few bytes of names).
	empty := filepath.Join(e.home, "empty")
	must(t, os.Mkdir(empty, 0o755))
	resp, err = e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: empty}))
	must(t, err)
	if sz := resp.Msg.GetEntry().GetSize(); sz != 4096 {
		t.Fatalf("empty directory size %d, want 4096 as on ext4", sz)
	}
	for i := range 200 {
		writeFile(t, filepath.Join(empty, strings.Repeat("n", 100)+strconv.Itoa(i)), "")
	}
	resp, err = e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: empty}))
	must(t, err)
	if sz := resp.Msg.GetEntry().GetSize(); sz < 4096 || sz%4096 != 0 {
		t.Fatalf("directory of 200 entries: size %d, want whole 4 KiB blocks", sz)
	}

	// A symlink reports its target, the target's type, and its own permissions.
	link := filepath.Join(e.home, "link")
	must(t, os.Symlink("hello.txt", link))
	resp, err = e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: link}))
	must(t, err)
	en = resp.Msg.GetEntry()
	if en.GetSymlinkTarget() != p || en.GetType() != fspb.FileType_FILE_TYPE_FILE || en.GetMode() != 0o644 || !strings.HasPrefix(en.GetPermissions(), "L") {
		t.Fatalf("symlink entry %v", en)
	}

	_, err = e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "/no/such/file"}))
	if codeOf(err) != connect.CodeNotFound {
		t.Fatalf("missing: %v", err)
	}
	_, err = e.fs.Stat(ctx, withUser(connect.NewRequest(&fspb.StatRequest{Path: "x"}), "ghost"))
	if codeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("unknown user: %v", err)
	}
}

func TestListDirDepthAndOrder(t *testing.T) {
	e := newEnv(t)
	ctx := ctxTimeout(t, 10*time.Second)
	base := filepath.Join(e.home, "tree")
	for _, f := range []string{"b/z.txt", "a/y.txt", "a/x/deep.txt", "c.txt"} {
		writeFile(t, filepath.Join(base, f), f)
	}
	names := func(depth uint32, path string) []string {
		resp, err := e.fs.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: path, Depth: depth}))
		must(t, err)
		var out []string
		for _, en := range resp.Msg.GetEntries() {
			rel := strings.TrimPrefix(en.GetPath(), base+"/")
			if en.GetName() != filepath.Base(en.GetPath()) {
				t.Fatalf("name %q path %q", en.GetName(), en.GetPath())
			}
			out = append(out, rel)
		}
		return out
	}
	if got := strings.Join(names(0, "tree"), ","); got != "a,b,c.txt" {
		t.Fatalf("depth 0 (treated as 1): %s", got)
	}
	if got := strings.Join(names(1, base), ","); got != "a,b,c.txt" {
		t.Fatalf("depth 1: %s", got)
	}
	if got := strings.Join(names(2, base), ","); got != "a,a/x,a/y.txt,b,b/z.txt,c.txt" {
		t.Fatalf("depth 2: %s", got)
	}
	if got := strings.Join(names(10, base), ","); got != "a,a/x,a/x/deep.txt,a/y.txt,b,b/z.txt,c.txt" {
		t.Fatalf("depth 10: %s", got)
	}

	// A symlinked root is followed; paths are rebuilt from the requested path.
	linkRoot := filepath.Join(e.home, "tree-link")
	must(t, os.Symlink(base, linkRoot))
	resp, err := e.fs.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: linkRoot, Depth: 1}))
	must(t, err)
	if len(resp.Msg.GetEntries()) != 3 || resp.Msg.GetEntries()[0].GetPath() != linkRoot+"/a" {
		t.Fatalf("symlinked root: %v", resp.Msg.GetEntries())
	}

	_, err = e.fs.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: "/no/such/dir"}))
	if codeOf(err) != connect.CodeNotFound {
		t.Fatalf("missing: %v", err)
	}
	_, err = e.fs.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: filepath.Join(base, "c.txt")}))
	if codeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("file: %v", err)
	}
}

func TestMakeDirMoveRemove(t *testing.T) {
	e := newEnv(t)
	ctx := ctxTimeout(t, 10*time.Second)

	resp, err := e.fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: "new/nested/dir"}))
	must(t, err)
	dir := filepath.Join(e.home, "new/nested/dir")
	if en := resp.Msg.GetEntry(); en.GetPath() != dir || en.GetType() != fspb.FileType_FILE_TYPE_DIRECTORY || en.GetOwner() != "user" {
		t.Fatalf("made %v", en)
	}
	for _, p := range []string{"new", "new/nested", "new/nested/dir"} {
		fi, err := os.Stat(filepath.Join(e.home, p))
		must(t, err)
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != 1000 || st.Gid != 1000 {
			t.Fatalf("%s owned by %d:%d", p, st.Uid, st.Gid)
		}
	}
	_, err = e.fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: dir}))
	if codeOf(err) != connect.CodeAlreadyExists {
		t.Fatalf("existing dir: %v", err)
	}
	writeFile(t, filepath.Join(e.home, "afile"), "x")
	_, err = e.fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: "afile"}))
	if codeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("existing file: %v", err)
	}

	// Move into parents that do not exist yet.
	mv, err := e.fs.Move(ctx, connect.NewRequest(&fspb.MoveRequest{Source: "afile", Destination: "moved/to/bfile"}))
	must(t, err)
	if en := mv.Msg.GetEntry(); en.GetPath() != filepath.Join(e.home, "moved/to/bfile") || en.GetName() != "bfile" || en.GetType() != fspb.FileType_FILE_TYPE_FILE {
		t.Fatalf("moved %v", en)
	}
	if _, err := os.Stat(filepath.Join(e.home, "afile")); !os.IsNotExist(err) {
		t.Fatal("source still exists")
	}
	_, err = e.fs.Move(ctx, connect.NewRequest(&fspb.MoveRequest{Source: "nothing-here", Destination: "x"}))
	if codeOf(err) != connect.CodeNotFound {
		t.Fatalf("move missing: %v", err)
	}

	// Remove is recursive and removing a missing path succeeds.
	_, err = e.fs.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: "new"}))
	must(t, err)
	if _, err := os.Stat(filepath.Join(e.home, "new")); !os.IsNotExist(err) {
		t.Fatal("not removed")
	}
	_, err = e.fs.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: "new"}))
	must(t, err)
}

func TestCopyTreeFallback(t *testing.T) {
	src := t.TempDir()
	writeFile(t, filepath.Join(src, "d/f.txt"), "data")
	must(t, os.Symlink("d/f.txt", filepath.Join(src, "l")))
	must(t, os.Chmod(filepath.Join(src, "d/f.txt"), 0o600))
	dst := filepath.Join(t.TempDir(), "copy")
	must(t, copyTree(context.Background(), src, dst))
	b, err := os.ReadFile(filepath.Join(dst, "l"))
	must(t, err)
	fi, err := os.Stat(filepath.Join(dst, "d/f.txt"))
	must(t, err)
	if string(b) != "data" || fi.Mode().Perm() != 0o600 {
		t.Fatalf("copy: %q %v", b, fi.Mode())
	}
}

type watchEvent struct {
	name  string
	typ   fspb.EventType
	entry *fspb.EntryInfo
}

func TestWatchDir(t *testing.T) {
	e := newEnv(t)
	ctx := ctxTimeout(t, 15*time.Second)
	dir := filepath.Join(e.home, "watched")
	must(t, os.MkdirAll(filepath.Join(dir, "existing"), 0o755))

	stream, err := e.fs.WatchDir(ctx, connect.NewRequest(&fspb.WatchDirRequest{Path: "watched", Recursive: true, IncludeEntry: true}))
	must(t, err)
	defer stream.Close()
	if !stream.Receive() || stream.Msg().GetStart() == nil {
		t.Fatalf("first message must be start: %v %v", stream.Msg(), stream.Err())
	}
	events := make(chan watchEvent, 100)
	go func() {
		for stream.Receive() {
			if fe := stream.Msg().GetFilesystem(); fe != nil {
				events <- watchEvent{fe.GetName(), fe.GetType(), fe.GetEntry()}
			}
		}
		close(events)
	}()
	waitEvent := func(name string, typ fspb.EventType) watchEvent {
		t.Helper()
		timeout := time.After(5 * time.Second)
		for {
			select {
			case ev, ok := <-events:
				if !ok {
					t.Fatalf("stream ended waiting for %s %s: %v", typ, name, stream.Err())
				}
				if ev.name == name && ev.typ == typ {
					return ev
				}
			case <-timeout:
				t.Fatalf("no %s event for %s", typ, name)
			}
		}
	}
	writeFile(t, filepath.Join(dir, "a.txt"), "1")
	ev := waitEvent("a.txt", fspb.EventType_EVENT_TYPE_CREATE)
	if ev.entry == nil || ev.entry.GetPath() != filepath.Join(dir, "a.txt") {
		t.Fatalf("create event without entry: %+v", ev)
	}
	waitEvent("a.txt", fspb.EventType_EVENT_TYPE_WRITE)
	// Recursive: a subdirectory that existed, and one created after the watch began.
	writeFile(t, filepath.Join(dir, "existing/b.txt"), "2")
	waitEvent("existing/b.txt", fspb.EventType_EVENT_TYPE_CREATE)
	must(t, os.Mkdir(filepath.Join(dir, "later"), 0o755))
	waitEvent("later", fspb.EventType_EVENT_TYPE_CREATE)
	time.Sleep(50 * time.Millisecond) // let the watch on "later" be added
	writeFile(t, filepath.Join(dir, "later/c.txt"), "3")
	waitEvent("later/c.txt", fspb.EventType_EVENT_TYPE_CREATE)
	must(t, os.Chmod(filepath.Join(dir, "a.txt"), 0o600))
	waitEvent("a.txt", fspb.EventType_EVENT_TYPE_CHMOD)
	must(t, os.Rename(filepath.Join(dir, "a.txt"), filepath.Join(dir, "renamed.txt")))
	if ev := waitEvent("a.txt", fspb.EventType_EVENT_TYPE_RENAME); ev.entry != nil {
		t.Fatal("rename events carry no entry")
	}
	must(t, os.Remove(filepath.Join(dir, "renamed.txt")))
	waitEvent("renamed.txt", fspb.EventType_EVENT_TYPE_REMOVE)

	_, err = e.fs.WatchDir(ctx, connect.NewRequest(&fspb.WatchDirRequest{Path: "/no/such/dir"}))
	if err == nil {
		s, _ := e.fs.WatchDir(ctx, connect.NewRequest(&fspb.WatchDirRequest{Path: "/no/such/dir"}))
		s.Receive()
		err = s.Err()
	}
	if codeOf(err) != connect.CodeNotFound {
		t.Fatalf("missing dir: %v", err)
	}
}

func TestWatchDirErrorsAndDeadline(t *testing.T) {
	e := newEnv(t)
	ctx := ctxTimeout(t, 15*time.Second)
	writeFile(t, filepath.Join(e.home, "file"), "x")
	out := e.rawStream(ctx, "/filesystem.Filesystem/WatchDir", map[string]any{"path": "file"}, nil)
	if !strings.Contains(out.endRaw, "invalid_argument") {
		t.Fatalf("watch on file: %q", out.endRaw)
	}
	out = e.rawStream(ctx, "/filesystem.Filesystem/WatchDir", map[string]any{"path": "/no/such"}, nil)
	if !strings.Contains(out.endRaw, "not_found") {
		t.Fatalf("watch on missing: %q", out.endRaw)
	}
	start := time.Now()
	out = e.rawStream(ctx, "/filesystem.Filesystem/WatchDir", map[string]any{"path": "~"},
		map[string]string{"Connect-Timeout-Ms": "1500", "Keepalive-Ping-Interval": "1"})
	if !strings.Contains(out.endRaw, "deadline_exceeded") || time.Since(start) > 10*time.Second {
		t.Fatalf("watch deadline: %q after %v", out.endRaw, time.Since(start))
	}
	if len(out.msgs) < 2 {
		t.Fatalf("want start and a keepalive, got %v", out.msgs)
	}
	if _, ok := out.msgs[0]["start"]; !ok {
		t.Fatalf("first message %v", out.msgs[0])
	}
	if _, ok := out.msgs[1]["keepalive"]; !ok {
		t.Fatalf("second message %v", out.msgs[1])
	}
}

func TestPollingWatcher(t *testing.T) {
	e := newEnv(t)
	ctx := ctxTimeout(t, 15*time.Second)
	dir := filepath.Join(e.home, "polled")
	must(t, os.MkdirAll(dir, 0o755))
	cw, err := e.fs.CreateWatcher(ctx, connect.NewRequest(&fspb.CreateWatcherRequest{Path: dir}))
	must(t, err)
	id := cw.Msg.GetWatcherId()
	if id == "" {
		t.Fatal("empty watcher id")
	}
	writeFile(t, filepath.Join(dir, "f"), "x")
	var got []string
	testenv.Eventually(t, 5*time.Second, "polled events", func() bool {
		ev, err := e.fs.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: id}))
		must(t, err)
		for _, fe := range ev.Msg.GetEvents() {
			got = append(got, fe.GetName()+":"+fe.GetType().String())
			if fe.GetEntry() != nil {
				t.Fatal("entry without include_entry")
			}
		}
		return strings.Contains(strings.Join(got, ","), "f:EVENT_TYPE_WRITE")
	})
	if got[0] != "f:EVENT_TYPE_CREATE" {
		t.Fatalf("events %v", got)
	}
	// Drained: nothing new.
	ev, err := e.fs.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: id}))
	must(t, err)
	if len(ev.Msg.GetEvents()) != 0 {
		t.Fatalf("events not drained: %v", ev.Msg.GetEvents())
	}
	_, err = e.fs.RemoveWatcher(ctx, connect.NewRequest(&fspb.RemoveWatcherRequest{WatcherId: id}))
	must(t, err)
	_, err = e.fs.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: id}))
	if codeOf(err) != connect.CodeNotFound {
		t.Fatalf("removed watcher: %v", err)
	}
	_, err = e.fs.RemoveWatcher(ctx, connect.NewRequest(&fspb.RemoveWatcherRequest{WatcherId: "nope"}))
	if codeOf(err) != connect.CodeNotFound {
		t.Fatalf("unknown watcher: %v", err)
	}
}

func TestLegacyPythonClientGetsOldEntryShape(t *testing.T) {
	e := newEnv(t)
	writeFile(t, filepath.Join(e.home, "f.txt"), "x")
	for ua, wantFull := range map[string]bool{"connect-python/0.1": false, "e2b-python-sdk/2.0.0": true} {
		req := connect.NewRequest(&fspb.ListDirRequest{Path: "~"})
		req.Header().Set("User-Agent", ua)
		resp, err := e.fs.ListDir(ctxTimeout(t, 10*time.Second), req)
		must(t, err)
		en := resp.Msg.GetEntries()[0]
		if en.GetName() != "f.txt" || en.GetPath() != filepath.Join(e.home, "f.txt") || en.GetType() != fspb.FileType_FILE_TYPE_FILE {
			t.Fatalf("%s: %v", ua, en)
		}
		if full := en.GetPermissions() != "" && en.GetModifiedTime() != nil; full != wantFull {
			t.Fatalf("%s: full entry %v, want %v: %v", ua, full, wantFull, en)
		}
	}
}
