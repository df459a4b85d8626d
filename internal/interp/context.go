package interp

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"
)

// contextSet holds every context of a server, and which one is each language's
// default.
type contextSet struct {
	cfg      Config
	mu       sync.Mutex
	byID     map[string]*kctx
	defaults map[string]*kctx
	seq      uint64 // creation order, for a stable listing
}

func newContextSet(cfg Config) *contextSet {
	return &contextSet{cfg: cfg, byID: map[string]*kctx{}, defaults: map[string]*kctx{}}
}

// newID returns a random UUID (v4), the shape upstream's kernel ids have.
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

func (cs *contextSet) newLocked(lang, cwd string) *kctx {
	if cwd == "" {
		// The default user's home, as upstream's /home/user.
		if o, err := cs.cfg.Defaults(context.Background()); err == nil {
			cwd = o.Cwd
		}
	}
	cs.seq++
	c := &kctx{cfg: cs.cfg, id: newID(), language: lang, cwd: cwd, seq: cs.seq, slot: make(chan struct{}, 1)}
	cs.byID[c.id] = c
	return c
}

// create adds a context that is not the default of its language.
func (cs *contextSet) create(lang, cwd string) *kctx {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.newLocked(lang, cwd)
}

// defaultFor returns the language's default context, creating it (not started) on
// first use.
func (cs *contextSet) defaultFor(lang string) *kctx {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if c, ok := cs.defaults[lang]; ok {
		return c
	}
	c := cs.newLocked(lang, "")
	cs.defaults[lang] = c
	return c
}

func (cs *contextSet) get(id string) (*kctx, bool) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	c, ok := cs.byID[id]
	return c, ok
}

// remove forgets a context; a deleted default is created afresh on next use.
func (cs *contextSet) remove(id string) (*kctx, bool) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	c, ok := cs.byID[id]
	if !ok {
		return nil, false
	}
	delete(cs.byID, id)
	if cs.defaults[c.language] == c {
		delete(cs.defaults, c.language)
	}
	return c, true
}

func (cs *contextSet) list() []contextInfo {
	cs.mu.Lock()
	all := make([]*kctx, 0, len(cs.byID))
	for _, c := range cs.byID {
		all = append(all, c)
	}
	cs.mu.Unlock()
	sort.Slice(all, func(i, j int) bool { return all[i].seq < all[j].seq })
	out := make([]contextInfo, 0, len(all))
	for _, c := range all {
		out = append(out, c.info())
	}
	return out
}

func (cs *contextSet) closeAll() {
	cs.mu.Lock()
	all := cs.byID
	cs.byID, cs.defaults = map[string]*kctx{}, map[string]*kctx{}
	cs.mu.Unlock()
	for _, c := range all {
		c.shutdown()
	}
}

// kctx is one context: a language, a cwd and (once started) a kernel. The slot
// serialises executions, starts and restarts; mu only guards the kernel pointer,
// so delete and restart can stop a kernel that is busy executing.
type kctx struct {
	cfg      Config
	id       string
	language string
	cwd      string
	seq      uint64
	slot     chan struct{}

	mu     sync.Mutex
	kernel Kernel
	runDir string
	closed bool
}

func (c *kctx) info() contextInfo {
	return contextInfo{ID: c.id, Language: c.language, Cwd: c.cwd}
}

// acquire takes the context's execution slot, or fails when ctx ends first.
func (c *kctx) acquire(ctx context.Context) error {
	select {
	case c.slot <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *kctx) release() { <-c.slot }

var errDeleted = errors.New("context was deleted")

// kernelLocked returns the running kernel, starting one if there is none (first
// use, or after a death). The caller holds the slot.
func (c *kctx) kernelLocked(ctx context.Context) (Kernel, error) {
	c.mu.Lock()
	k, closed := c.kernel, c.closed
	c.mu.Unlock()
	if closed {
		return nil, errDeleted
	}
	if k != nil {
		return k, nil
	}
	start, ok := Lookup(c.language)
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrUnavailable, c.language)
	}
	opts, err := c.cfg.Defaults(ctx)
	if err != nil {
		return nil, fmt.Errorf("kernel options: %w", err)
	}
	opts.Language = c.language
	if c.cwd != "" {
		opts.Cwd = c.cwd
	}
	if opts.RunDir != "" {
		// One directory per kernel start, owned by the kernel's user: the
		// backend writes its scripts there, possibly as that user.
		opts.RunDir = filepath.Join(opts.RunDir, fmt.Sprintf("%s-%d", c.id, time.Now().UnixNano()))
		if err := os.MkdirAll(opts.RunDir, 0o700); err != nil {
			return nil, fmt.Errorf("kernel run dir: %w", err)
		}
		if os.Geteuid() == 0 {
			if err := os.Chown(opts.RunDir, int(opts.UID), int(opts.GID)); err != nil {
				return nil, fmt.Errorf("kernel run dir: %w", err)
			}
		}
	}
	t0 := time.Now()
	k, err = start(ctx, opts)
	if err != nil {
		if opts.RunDir != "" {
			_ = os.RemoveAll(opts.RunDir)
		}
		return nil, err
	}
	c.cfg.Log.Info("interp: kernel started", "context", c.id, "language", c.language, "took", time.Since(t0))
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		// Deleted while starting.
		go closeKernel(k, opts.RunDir)
		return nil, errDeleted
	}
	c.kernel, c.runDir = k, opts.RunDir
	return k, nil
}

// ensureStarted starts the kernel unless it runs already, waiting for an
// execution or start in progress.
func (c *kctx) ensureStarted(ctx context.Context) error {
	if err := c.acquire(ctx); err != nil {
		return err
	}
	defer c.release()
	_, err := c.kernelLocked(ctx)
	return err
}

// refresh replaces the kernel with a new one once any start or execution in
// progress is over: a prewarmed kernel whose environment is out of date (a
// pooled sandbox claimed with env vars) must not survive a start racing it.
func (c *kctx) refresh(ctx context.Context) error {
	if err := c.acquire(ctx); err != nil {
		return err
	}
	defer c.release()
	if k, dir := c.takeKernel(false); k != nil {
		closeKernel(k, dir)
	}
	_, err := c.kernelLocked(ctx)
	return err
}

func closeKernel(k Kernel, runDir string) {
	_ = k.Close()
	if runDir != "" {
		_ = os.RemoveAll(runDir)
	}
}

// dropKernelLocked forgets a dead or stuck kernel (if it is still the current
// one) so the next use starts a new one.
func (c *kctx) dropKernelLocked(k Kernel) {
	c.mu.Lock()
	if c.kernel != k {
		c.mu.Unlock()
		return
	}
	dir := c.runDir
	c.kernel, c.runDir = nil, ""
	c.mu.Unlock()
	// Close may wait for processes to exit; the stream must not.
	go closeKernel(k, dir)
}

// takeKernel detaches the current kernel, for delete and restart.
func (c *kctx) takeKernel(closed bool) (Kernel, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k, dir := c.kernel, c.runDir
	c.kernel, c.runDir = nil, ""
	if closed {
		c.closed = true
	}
	return k, dir
}

// shutdown stops the kernel for good (context deleted). An execution in
// progress sees its kernel die.
func (c *kctx) shutdown() {
	if k, dir := c.takeKernel(true); k != nil {
		closeKernel(k, dir)
	}
}

// restart stops the kernel (ending any execution in progress) and starts a new
// one with empty state.
func (c *kctx) restart(ctx context.Context) error {
	if k, dir := c.takeKernel(false); k != nil {
		closeKernel(k, dir)
	}
	return c.ensureStarted(ctx)
}

// stream writes NDJSON lines, one writer goroutine per response so kernels never
// block on a slow client for longer than the buffer, and so a keepalive can be
// sent after every interval of silence.
type stream struct {
	mu     sync.Mutex // guards closed: a kernel abandoned after an interrupt may still emit
	closed bool
	lines  chan []byte
	done   chan struct{}
}

func newStream(w http.ResponseWriter, keepalive time.Duration) *stream {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	st := &stream{lines: make(chan []byte, 256), done: make(chan struct{})}
	go func() {
		defer close(st.done)
		t := time.NewTimer(keepalive)
		defer t.Stop()
		broken := false
		write := func(b []byte) {
			if broken {
				return
			}
			if _, err := w.Write(b); err != nil {
				broken = true
				return
			}
			if err := rc.Flush(); err != nil {
				broken = true
			}
		}
		for {
			select {
			case b, ok := <-st.lines:
				if !ok {
					return
				}
				write(b)
			case <-t.C:
				write([]byte(`{"type":"keepalive"}` + "\n"))
			}
			t.Reset(keepalive)
		}
	}()
	return st
}

func (st *stream) send(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		// A bundle the kernel built that JSON cannot carry (NaN in a chart, say).
		b, _ = json.Marshal(errorLine(&ExecError{Name: "SerializationError", Value: err.Error()}))
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return
	}
	st.lines <- append(b, '\n')
}

// close flushes what is queued and ends the writer.
func (st *stream) close() {
	st.mu.Lock()
	st.closed = true
	close(st.lines)
	st.mu.Unlock()
	<-st.done
}
