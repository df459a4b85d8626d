package envd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/fsnotify/fsnotify"
	"golang.org/x/sys/unix"

	fspb "github.com/airlock-sandbox/airlock/api/gen/filesystem"
)

const (
	// watchStreamBuffer bounds events waiting for a slow WatchDir client; beyond it
	// events are dropped rather than stalling the inotify reader.
	watchStreamBuffer = 4096
	// maxPolledEvents bounds what a polling watcher accumulates between polls.
	maxPolledEvents = 10_000
	// maxPollWatchers and pollWatcherIdle bound watchers whose clients forgot them.
	maxPollWatchers = 256
	pollWatcherIdle = time.Hour
)

// dirWatcher turns inotify events under one directory into FilesystemEvents.
type dirWatcher struct {
	srv          *Server
	root         string
	recursive    bool
	includeEntry bool
	w            *fsnotify.Watcher
	emit         func(*fspb.FilesystemEvent)
	closeOnce    sync.Once
	done         chan struct{}
}

// networkFSMagic are statfs types whose change notifications are unreliable, so
// watching them needs the client's explicit consent (allow_network_mounts).
var networkFSMagic = map[int64]string{
	0x6969:     "nfs",
	0xFF534D42: "cifs",
	0x517B:     "smb",
	0xFE534D42: "smb2",
	0x65735546: "fuse",
}

// checkWatchable validates a watch request's path the way docs/E2B-WIRE.md §3.5 orders it.
func checkWatchable(path string, allowNetwork bool) error {
	fi, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return connect.NewError(connect.CodeNotFound, fmt.Errorf("path '%s' does not exist", path))
		}
		return fsError(err)
	}
	if !fi.IsDir() {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path '%s' is not a directory", path))
	}
	if !allowNetwork {
		var st unix.Statfs_t
		if err := unix.Statfs(path, &st); err == nil {
			if name, ok := networkFSMagic[int64(st.Type)]; ok {
				return connect.NewError(connect.CodeInvalidArgument,
					fmt.Errorf("path '%s' is on a network filesystem (%s); set allow_network_mounts to watch it", path, name))
			}
		}
	}
	return nil
}

func (s *Server) newDirWatcher(root string, recursive, includeEntry bool, emit func(*fspb.FilesystemEvent)) (*dirWatcher, error) {
	w, err := fsnotify.NewBufferedWatcher(1024)
	if err != nil {
		return nil, fmt.Errorf("creating watcher: %w", err)
	}
	dw := &dirWatcher{srv: s, root: root, recursive: recursive, includeEntry: includeEntry, w: w, emit: emit, done: make(chan struct{})}
	if err := dw.add(root); err != nil {
		w.Close()
		return nil, err
	}
	go dw.loop()
	return dw, nil
}

// add watches dir and, for recursive watchers, every directory below it. Only the
// root's failure is fatal: a subdirectory may vanish while being walked.
func (dw *dirWatcher) add(dir string) error {
	if err := dw.w.Add(dir); err != nil {
		if dir == dw.root {
			if errors.Is(err, unix.ENOSPC) {
				return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("inotify watch limit reached: %w", err))
			}
			return fsError(err)
		}
		return nil
	}
	if !dw.recursive {
		return nil
	}
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir || !d.IsDir() {
			return nil
		}
		_ = dw.w.Add(p)
		return nil
	})
}

func (dw *dirWatcher) close() {
	dw.closeOnce.Do(func() {
		close(dw.done)
		dw.w.Close()
	})
}

// eventOps is the order in which one inotify event's op bits become separate
// FilesystemEvents.
var eventOps = []struct {
	op fsnotify.Op
	t  fspb.EventType
}{
	{fsnotify.Create, fspb.EventType_EVENT_TYPE_CREATE},
	{fsnotify.Rename, fspb.EventType_EVENT_TYPE_RENAME},
	{fsnotify.Chmod, fspb.EventType_EVENT_TYPE_CHMOD},
	{fsnotify.Write, fspb.EventType_EVENT_TYPE_WRITE},
	{fsnotify.Remove, fspb.EventType_EVENT_TYPE_REMOVE},
}

func (dw *dirWatcher) loop() {
	defer func() {
		if v := recover(); v != nil {
			dw.srv.log.Error("watcher panicked", "root", dw.root, "panic", v)
		}
	}()
	for {
		select {
		case <-dw.done:
			return
		case ev, ok := <-dw.w.Events:
			if !ok {
				return
			}
			dw.handle(ev)
		case err, ok := <-dw.w.Errors:
			if !ok {
				return
			}
			dw.srv.log.Warn("watch error", "root", dw.root, "err", err)
		}
	}
}

func (dw *dirWatcher) handle(ev fsnotify.Event) {
	rel, err := filepath.Rel(dw.root, ev.Name)
	if err != nil || rel == "." {
		return
	}
	if dw.recursive && ev.Has(fsnotify.Create) {
		if fi, err := os.Lstat(ev.Name); err == nil && fi.IsDir() {
			_ = dw.add(ev.Name)
		}
	}
	for _, o := range eventOps {
		if !ev.Has(o.op) {
			continue
		}
		fe := &fspb.FilesystemEvent{Name: rel, Type: o.t}
		if dw.includeEntry && (o.op == fsnotify.Create || o.op == fsnotify.Write || o.op == fsnotify.Chmod) {
			if e, err := dw.srv.entryInfo(ev.Name); err == nil {
				fe.Entry = e
			}
		}
		dw.emit(fe)
	}
}

func (fsv *filesystemService) WatchDir(ctx context.Context, req *connect.Request[fspb.WatchDirRequest], stream *connect.ServerStream[fspb.WatchDirResponse]) error {
	s := fsv.srv
	u, err := s.requestUser(req.Header())
	if err != nil {
		return err
	}
	root := s.resolvePath(req.Msg.GetPath(), u)
	if err := checkWatchable(root, req.Msg.GetAllowNetworkMounts()); err != nil {
		return err
	}
	events := make(chan *fspb.FilesystemEvent, watchStreamBuffer)
	dw, err := s.newDirWatcher(root, req.Msg.GetRecursive(), req.Msg.GetIncludeEntry(), func(e *fspb.FilesystemEvent) {
		select {
		case events <- e:
		default:
			s.log.Warn("watch stream client too slow; dropping event", "root", root)
		}
	})
	if err != nil {
		return err
	}
	defer dw.close()
	if err := stream.Send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Start{Start: &fspb.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	interval := keepaliveInterval(req.Header())
	t := time.NewTimer(interval)
	defer t.Stop()
	for {
		select {
		case e := <-events:
			if err := stream.Send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Filesystem{Filesystem: e}}); err != nil {
				return err
			}
			t.Reset(interval)
		case <-t.C:
			if err := stream.Send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Keepalive{Keepalive: &fspb.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
			t.Reset(interval)
		case <-ctx.Done():
			return ctxError(ctx)
		}
	}
}

// pollWatcher accumulates events until the client drains them.
type pollWatcher struct {
	dw       *dirWatcher
	mu       sync.Mutex
	events   []*fspb.FilesystemEvent
	dropped  int
	lastPoll time.Time
}

type watcherRegistry struct {
	mu       sync.Mutex
	watchers map[string]*pollWatcher
}

func newWatcherRegistry() *watcherRegistry {
	return &watcherRegistry{watchers: map[string]*pollWatcher{}}
}

func (r *watcherRegistry) closeAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, w := range r.watchers {
		w.dw.close()
		delete(r.watchers, id)
	}
}

// sweep drops watchers nobody polled for a long time; the sync Python SDK leaks
// them when a program exits without stopping its watch.
func (r *watcherRegistry) sweepLocked(now time.Time) {
	for id, w := range r.watchers {
		w.mu.Lock()
		idle := now.Sub(w.lastPoll) > pollWatcherIdle
		w.mu.Unlock()
		if idle {
			w.dw.close()
			delete(r.watchers, id)
		}
	}
}

func (fsv *filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[fspb.CreateWatcherRequest]) (*connect.Response[fspb.CreateWatcherResponse], error) {
	s := fsv.srv
	u, err := s.requestUser(req.Header())
	if err != nil {
		return nil, err
	}
	root := s.resolvePath(req.Msg.GetPath(), u)
	if err := checkWatchable(root, req.Msg.GetAllowNetworkMounts()); err != nil {
		return nil, err
	}
	reg := s.watchers
	reg.mu.Lock()
	reg.sweepLocked(time.Now())
	full := len(reg.watchers) >= maxPollWatchers
	reg.mu.Unlock()
	if full {
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("too many watchers (max %d); remove unused ones", maxPollWatchers))
	}
	pw := &pollWatcher{lastPoll: time.Now()}
	dw, err := s.newDirWatcher(root, req.Msg.GetRecursive(), req.Msg.GetIncludeEntry(), func(e *fspb.FilesystemEvent) {
		pw.mu.Lock()
		if len(pw.events) < maxPolledEvents {
			pw.events = append(pw.events, e)
		} else {
			pw.dropped++
		}
		pw.mu.Unlock()
	})
	if err != nil {
		return nil, err
	}
	pw.dw = dw
	var raw [16]byte
	_, _ = rand.Read(raw[:])
	id := hex.EncodeToString(raw[:])
	reg.mu.Lock()
	reg.watchers[id] = pw
	reg.mu.Unlock()
	return connect.NewResponse(&fspb.CreateWatcherResponse{WatcherId: id}), nil
}

func (fsv *filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[fspb.GetWatcherEventsRequest]) (*connect.Response[fspb.GetWatcherEventsResponse], error) {
	reg := fsv.srv.watchers
	reg.mu.Lock()
	pw := reg.watchers[req.Msg.GetWatcherId()]
	reg.mu.Unlock()
	if pw == nil {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher '%s' not found", req.Msg.GetWatcherId()))
	}
	pw.mu.Lock()
	events := pw.events
	pw.events = nil
	if pw.dropped > 0 {
		fsv.srv.log.Warn("polling watcher overflowed; events were dropped", "watcher", req.Msg.GetWatcherId(), "dropped", pw.dropped)
		pw.dropped = 0
	}
	pw.lastPoll = time.Now()
	pw.mu.Unlock()
	return connect.NewResponse(&fspb.GetWatcherEventsResponse{Events: events}), nil
}

func (fsv *filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[fspb.RemoveWatcherRequest]) (*connect.Response[fspb.RemoveWatcherResponse], error) {
	reg := fsv.srv.watchers
	reg.mu.Lock()
	pw := reg.watchers[req.Msg.GetWatcherId()]
	delete(reg.watchers, req.Msg.GetWatcherId())
	reg.mu.Unlock()
	if pw == nil {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher '%s' not found", req.Msg.GetWatcherId()))
	}
	pw.dw.close()
	return connect.NewResponse(&fspb.RemoveWatcherResponse{}), nil
}
