package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/api/gen/process"
	"github.com/airlock-sandbox/airlock/api/gen/process/processconnect"
	"github.com/airlock-sandbox/airlock/internal/sandboxlog"
)

// The start phase runs a template's start command and waits for its ready
// command, between "envd answers" and "the sandbox is handed out" (see
// Manager.startPhase). Everything goes through envd's own process API, so the
// start command is an ordinary envd process: a client sees it in
// commands.list under the tag StartCmdTag and can connect to it or kill it.

// DefaultReadyTimeout is how long a sandbox may take to become ready when its
// template sets no ReadyTimeout. E2B templates typically start a server
// (Jupyter, a dev server) that is up within seconds; a minute leaves room for
// a loaded machine without letting a broken template hold a create request
// for long.
const DefaultReadyTimeout = 60 * time.Second

// StartCmdTag is the process tag of a template's start command.
const StartCmdTag = "start_cmd"

const (
	// readyFirstDelay and readyMaxDelay bound the pause between two runs of a
	// ready command: short at first (this is on the create path, and most
	// servers are up within a few hundred milliseconds), then growing so a
	// slow start does not cost a process start every 50 ms.
	readyFirstDelay = 50 * time.Millisecond
	readyMaxDelay   = 500 * time.Millisecond
	// outputKeep is how much of a command's output is kept for error messages,
	// and tailLines how many of its last lines a message quotes.
	outputKeep = 8 << 10
	tailLines  = 20
	tailBytes  = 2 << 10
)

// StartError is a template's start or ready command failing. Its message is
// meant for the client as it is.
type StartError struct {
	Template string
	// NotReady is true when the ready command did not succeed by the
	// deadline; false when the start command exited or could not be started.
	NotReady bool
	// Message says what failed: the command, its exit code, its output.
	Message string
}

func (e *StartError) Error() string { return e.Message }

// Is makes every StartError match ErrTemplateStart, and the deadline kind
// ErrTemplateNotReady too.
func (e *StartError) Is(target error) bool {
	return target == ErrTemplateStart || (e.NotReady && target == ErrTemplateNotReady)
}

func templateName(tpl Template) string {
	if tpl.Alias != "" {
		return tpl.Alias
	}
	return tpl.ID
}

// templateEnv is the environment envd gives a sandbox's processes: the
// template's ENV, overridden by the create request's envVars. A pooled
// sandbox (no client yet) gets the template's alone.
func templateEnv(tpl Template, client map[string]string) (map[string]string, error) {
	out := make(map[string]string, len(tpl.Env)+len(client))
	for _, kv := range tpl.Env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("template %s: env entry %q is not KEY=VALUE", templateName(tpl), kv)
		}
		out[k] = v
	}
	for k, v := range client {
		out[k] = v
	}
	return out, nil
}

// startedFrom identifies everything a started sandbox was made from: a
// digest of its template. A pooled sandbox is claimed only while its template
// still has the same digest, so a rebuild that changed anything (the rootfs,
// a setting such as memory, CPUs or runtime, the env, the start or ready
// command) discards it rather than hand out a sandbox that getInfo would
// misdescribe.
type startedFrom struct {
	sum [sha256.Size]byte
	// ok is false when the template could not be encoded; such a sandbox
	// matches nothing and is never claimed.
	ok bool
}

// startedFromOf digests the whole Template, so that a field added to it later
// counts by default. Only the fields that provably do not shape a started
// sandbox are left out:
//   - Alias: only Info reports it, and a claim takes Info from the request;
//     envd and the runtime never see it.
//   - DiskSizeMB: a claim sets the disk quota to the request's size
//     (Disk.SetLimit) before the sandbox is handed out.
func startedFromOf(tpl Template) startedFrom {
	tpl.Alias = ""
	tpl.DiskSizeMB = 0
	// An empty list and no list start the same sandbox, and a template built
	// in this process can differ from the same one read back from the store
	// only so (the store omits empty lists): without this, the pool that
	// SetWarmPool filled from the first would never match the second.
	v := reflect.ValueOf(&tpl).Elem()
	for i := range v.NumField() {
		if f := v.Field(i); f.CanSet() && (f.Kind() == reflect.Slice || f.Kind() == reflect.Map) && f.Len() == 0 {
			f.SetZero()
		}
	}
	// encoding/json is canonical for this: struct fields in declaration
	// order, map keys sorted.
	b, err := json.Marshal(tpl)
	if err != nil {
		return startedFrom{}
	}
	return startedFrom{sum: sha256.Sum256(b), ok: true}
}

func (a startedFrom) equal(b startedFrom) bool {
	return a.ok && b.ok && a.sum == b.sum
}

// startPhase brings a sandbox whose envd answers to the "started" state: the
// template's start command runs in the background (as the template's default
// user, in its default workdir, with the sandbox's environment) and its ready
// command has exited 0. Without a ready command the sandbox is ready as soon
// as the start command runs. It returns a *StartError when the start command
// ends before that or the deadline passes first, and ctx's error when ctx ends
// first; the caller tears the sandbox down on any error.
//
// This "started" state is the one a later change can snapshot (a CRIU
// checkpoint of the sandbox taken right after startPhase, restored instead of
// running start and startPhase) so that a template's start command runs once
// rather than once per sandbox, which is what E2B does by snapshotting its
// microVMs at build time.
func (m *Manager) startPhase(ctx context.Context, e *entry, tpl Template) (err error) {
	if tpl.StartCmd == "" && tpl.ReadyCmd == "" {
		return nil
	}
	began := time.Now()
	defer func() { m.logStartPhase(e.id, tpl, began, err) }()
	timeout := tpl.ReadyTimeout
	if timeout <= 0 {
		timeout = DefaultReadyTimeout
	}
	deadline := began.Add(timeout)
	pc := &procClient{
		c:     processconnect.NewProcessClient(&http.Client{Transport: e.transport}, "http://envd"),
		token: e.info.AccessToken,
		cwd:   tpl.DefaultWorkdir,
	}
	name := templateName(tpl)
	var sp *startProc
	if tpl.StartCmd != "" {
		// The stream has no deadline: envd would take it as the process's
		// lifetime. Cancelling it after ready only detaches the host; the
		// process keeps running, and its output is dropped until a client
		// connects to it.
		streamCtx, detach := context.WithCancel(context.WithoutCancel(ctx))
		defer detach()
		var err error
		sp, err = pc.startBackground(streamCtx, tpl.StartCmd)
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("template %s: starting the start command: %w", name, ctx.Err())
			}
			return &StartError{Template: name, Message: fmt.Sprintf("template %s: start command `%s` could not be started: %v", name, tpl.StartCmd, err)}
		}
	}
	var exited <-chan struct{} // nil (blocks forever) without a start command
	if sp != nil {
		exited = sp.done
	}
	startFailed := func() error {
		code, out, err := sp.result()
		if err != nil {
			return &StartError{Template: name, Message: fmt.Sprintf("template %s: lost the start command `%s` before the sandbox was ready: %v; its output: %s", name, tpl.StartCmd, err, orNone(out))}
		}
		return &StartError{Template: name, Message: fmt.Sprintf("template %s: start command `%s` exited with code %d before the sandbox was ready; its output: %s", name, tpl.StartCmd, code, orNone(out))}
	}
	// A start command that exits 0 was a one-shot set-up (E2B's templates
	// may have one: `echo hi` with waitForTimeout): no longer watched, and
	// the ready command decides. Any other end fails the create.
	endedWell := func() bool {
		code, _, err := sp.result()
		if err == nil && code == 0 {
			m.log.Debug("template start command exited 0; waiting for the ready command", "id", e.info.ID, "template", name)
			exited = nil
			return true
		}
		return false
	}
	if tpl.ReadyCmd == "" {
		m.log.Debug("template start command running", "id", e.info.ID, "template", name)
		return nil
	}

	var last string // how the last attempt ended, for the deadline message
	for delay := readyFirstDelay; ; delay = min(delay*3/2, readyMaxDelay) {
		attemptCtx, cancel := context.WithDeadline(ctx, deadline)
		// A start command that dies ends the attempt at once.
		watched := exited
		go func() {
			select {
			case <-watched:
				cancel()
			case <-attemptCtx.Done():
			}
		}()
		code, out, err := pc.run(attemptCtx, tpl.ReadyCmd)
		cancel()
		if watched != nil && sp.exited() && !endedWell() {
			return startFailed()
		}
		switch {
		case ctx.Err() != nil:
			return fmt.Errorf("template %s: waiting for the ready command: %w", name, ctx.Err())
		case watched != nil && exited == nil && (err != nil || code != 0):
			continue // cut short by the start command's clean exit: again at once
		case err == nil && code == 0:
			m.log.Info("sandbox ready", "id", e.info.ID, "template", name, "took", time.Since(began).Round(time.Millisecond))
			return nil
		case err == nil:
			last = fmt.Sprintf("last exit code %d: %s", code, orNone(out))
		case time.Now().Before(deadline):
			last = fmt.Sprintf("last attempt failed: %v", err)
		case last == "":
			// Cut off by the deadline; an earlier attempt's result, if
			// any, says more.
			last = "no attempt finished before the deadline"
			if out != "" {
				last += "; output so far: " + out
			}
		}
		wait := min(delay, time.Until(deadline))
		if wait <= 0 {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("template %s: waiting for the ready command: %w", name, ctx.Err())
		case <-exited:
			if !endedWell() {
				return startFailed()
			}
		case <-time.After(wait):
		}
		if !time.Now().Before(deadline) {
			break
		}
	}
	msg := fmt.Sprintf("template %s: ready command `%s` did not succeed within %s (%s)", name, tpl.ReadyCmd, timeout, last)
	if sp != nil {
		_, out, _ := sp.result()
		msg += "; start command output: " + orNone(out)
	}
	return &StartError{Template: name, NotReady: true, Message: msg}
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// procClient starts template commands through envd's process API.
type procClient struct {
	c     processconnect.ProcessClient
	token string
	cwd   string
	// noBash is set once /bin/bash turned out to be missing (an OCI image
	// without it); commands then run with /bin/sh -c.
	noBash bool
}

// shell returns the command line for cmd: a login bash as commands.run does
// (so /etc/profile and ~/.profile apply), else plain sh.
func (pc *procClient) shell(cmd string) *process.ProcessConfig {
	if pc.noBash {
		return &process.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", cmd}, Cwd: pc.cwdPtr()}
	}
	return &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", cmd}, Cwd: pc.cwdPtr()}
}

func (pc *procClient) cwdPtr() *string {
	if pc.cwd == "" {
		return nil // envd's default: the template's workdir, else the user's home
	}
	c := pc.cwd
	return &c
}

// open starts cmd and returns its stream once envd reported the start. No
// user is named, so the process runs as the sandbox's default user (the
// template's). stdin is off: nothing will ever write to it.
func (pc *procClient) open(ctx context.Context, cmd string, tag *string) (*connect.ServerStreamForClient[process.StartResponse], error) {
	for {
		stdin := false
		req := connect.NewRequest(&process.StartRequest{Process: pc.shell(cmd), Tag: tag, Stdin: &stdin})
		if tag == nil {
			// A ready check, run again and again: its process entries in
			// the sandbox log are debug.
			req.Header().Set(sandboxlog.LevelHeader, sandboxlog.Debug)
		}
		if pc.token != "" {
			req.Header().Set("X-Access-Token", pc.token)
		}
		stream, err := pc.c.Start(ctx, req)
		if err == nil {
			if stream.Receive() {
				if stream.Msg().GetEvent().GetStart() != nil {
					return stream, nil
				}
				stream.Close()
				return nil, errors.New("envd sent no start event")
			}
			err = stream.Err()
			stream.Close()
			if err == nil {
				err = errors.New("envd ended the stream before the process started")
			}
		}
		// envd answers invalid_argument when it cannot exec the shell; the
		// only other causes are a missing workdir (then sh fails the same way
		// and its error is reported) and a bad request, which this is not.
		if !pc.noBash && connect.CodeOf(err) == connect.CodeInvalidArgument {
			pc.noBash = true
			continue
		}
		return nil, err
	}
}

// run runs cmd to its end and returns its exit code and the tail of its
// output. ctx's deadline is also the process's lifetime in envd, so a ready
// command that hangs is killed at the deadline.
func (pc *procClient) run(ctx context.Context, cmd string) (int32, string, error) {
	stream, err := pc.open(ctx, cmd, nil)
	if err != nil {
		return 0, "", err
	}
	defer stream.Close()
	var out tail
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if d := ev.GetData(); d != nil {
			out.write(d.GetStdout())
			out.write(d.GetStderr())
			out.write(d.GetPty())
		}
		if end := ev.GetEnd(); end != nil {
			return end.GetExitCode(), out.String(), nil
		}
	}
	err = stream.Err()
	if err == nil {
		err = errors.New("envd ended the stream without an end event")
	}
	return 0, out.String(), err
}

// startProc is a template's start command while the host follows its output.
type startProc struct {
	done chan struct{} // closed when the process ended or the stream broke

	mu   sync.Mutex
	out  tail
	code int32
	err  error // the stream broke without an end event
}

// startBackground starts cmd tagged StartCmdTag and follows its output until
// it ends or ctx is cancelled (which detaches without stopping it).
func (pc *procClient) startBackground(ctx context.Context, cmd string) (*startProc, error) {
	tag := StartCmdTag
	stream, err := pc.open(ctx, cmd, &tag)
	if err != nil {
		return nil, err
	}
	sp := &startProc{done: make(chan struct{})}
	go func() {
		defer stream.Close()
		for stream.Receive() {
			ev := stream.Msg().GetEvent()
			if d := ev.GetData(); d != nil {
				sp.mu.Lock()
				sp.out.write(d.GetStdout())
				sp.out.write(d.GetStderr())
				sp.mu.Unlock()
			}
			if end := ev.GetEnd(); end != nil {
				sp.mu.Lock()
				sp.code = end.GetExitCode()
				sp.mu.Unlock()
				close(sp.done)
				return
			}
		}
		if ctx.Err() != nil {
			return // detached on purpose: the process still runs
		}
		sp.mu.Lock()
		sp.err = stream.Err()
		if sp.err == nil {
			sp.err = errors.New("envd ended the stream without an end event")
		}
		sp.mu.Unlock()
		close(sp.done)
	}()
	return sp, nil
}

func (sp *startProc) exited() bool {
	select {
	case <-sp.done:
		return true
	default:
		return false
	}
}

func (sp *startProc) result() (int32, string, error) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return sp.code, sp.out.String(), sp.err
}

// tail keeps the last outputKeep bytes written to it.
type tail struct{ b []byte }

func (t *tail) write(p []byte) {
	t.b = append(t.b, p...)
	if len(t.b) > outputKeep {
		t.b = append(t.b[:0], t.b[len(t.b)-outputKeep:]...)
	}
}

// String returns the last tailLines lines (at most tailBytes), trimmed, as
// valid UTF-8.
func (t *tail) String() string {
	s := strings.TrimSpace(string(t.b))
	if len(s) > tailBytes {
		s = s[len(s)-tailBytes:]
		for len(s) > 0 && !utf8.RuneStart(s[0]) {
			s = s[1:]
		}
	}
	if lines := strings.Split(s, "\n"); len(lines) > tailLines {
		s = strings.Join(lines[len(lines)-tailLines:], "\n")
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}
