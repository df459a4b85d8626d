package mcp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/api/gen/filesystem"
	"github.com/airlock-sandbox/airlock/api/gen/process"
	"github.com/airlock-sandbox/airlock/internal/e2bclient"
	"github.com/airlock-sandbox/airlock/internal/e2bwire"
)

// NotReadyError is a 503 with Retry-After from the API: the template is still
// being built. Message says which step it is on and for how long.
type NotReadyError struct {
	Message    string
	RetryAfter time.Duration
}

func (e *NotReadyError) Error() string { return e.Message + " (HTTP 503)" }

// HTTPBackend implements Backend over the E2B REST API (APIURL) and the sandbox proxy
// (SandboxURL): envd's Connect process and filesystem services, /files, and the code
// interpreter on port 49999, all through e2bclient, the client of the same wire
// protocol the E2B SDKs speak, so MCP sees exactly what SDK users see.
type HTTPBackend struct {
	c *e2bclient.Client

	mu     sync.Mutex
	tokens map[string]string // sandbox id → envd access token
}

// NewHTTPBackend returns a Backend that talks to a running Airlock server.
func NewHTTPBackend(cfg e2bclient.Config) Backend {
	return &HTTPBackend{
		c:      e2bclient.New(cfg),
		tokens: map[string]string{},
	}
}

// --- control plane -------------------------------------------------------------

// notReady turns the API's "template still being built" answer into the
// Backend's NotReadyError, which the tools wait on.
func notReady(err error) error {
	var e *e2bclient.Error
	if !errors.As(err, &e) || e.Status != http.StatusServiceUnavailable {
		return err
	}
	if wait, ok := e.RetryAfter(); ok {
		return &NotReadyError{Message: e.Message, RetryAfter: wait}
	}
	return err
}

func info(w e2bwire.ListedSandbox) SandboxInfo {
	tpl := w.Alias
	if tpl == "" {
		tpl = w.TemplateID
	}
	i := SandboxInfo{SandboxID: w.SandboxID, Template: tpl, State: w.State, StartedAt: w.StartedAt, EndAt: w.EndAt,
		Metadata: w.Metadata, CPUCount: w.CPUCount, MemoryMB: w.MemoryMB}
	for _, m := range w.VolumeMounts {
		i.VolumeMounts = append(i.VolumeMounts, VolumeMount{Name: m.Name, Path: m.Path})
	}
	return i
}

// CreateSandbox creates a sandbox and returns its details (state, start and expiry
// times come from a GET, which the create answer lacks).
func (h *HTTPBackend) CreateSandbox(ctx context.Context, r CreateSandboxRequest) (SandboxInfo, error) {
	timeout := int64(r.Timeout / time.Second)
	sb, err := h.c.Create(ctx, e2bwire.NewSandbox{
		TemplateID:          r.Template,
		Timeout:             &timeout,
		Metadata:            e2bwire.Strings(r.Metadata),
		EnvVars:             e2bwire.Strings(r.Envs),
		AllowInternetAccess: r.AllowInternet,
		VolumeMounts:        wireMounts(r.VolumeMounts),
	})
	if err != nil {
		return SandboxInfo{}, notReady(err)
	}
	h.remember(sb.SandboxID, sb.EnvdAccessToken)
	detail, err := h.c.Get(ctx, sb.SandboxID)
	if err != nil {
		return SandboxInfo{}, fmt.Errorf("sandbox %s created, but: %w", sb.SandboxID, err)
	}
	return info(detail.ListedSandbox), nil
}

// wireMounts is ms as NewSandbox holds them; nil when there are none, so that
// the field is left out as the SDKs leave it.
func wireMounts(ms []VolumeMount) []e2bwire.SandboxVolumeMount {
	var out []e2bwire.SandboxVolumeMount
	for _, m := range ms {
		out = append(out, e2bwire.SandboxVolumeMount{Name: m.Name, Path: m.Path})
	}
	return out
}

// KillSandbox kills a sandbox.
func (h *HTTPBackend) KillSandbox(ctx context.Context, id string) error {
	if err := h.c.Kill(ctx, id); err != nil {
		return err
	}
	h.mu.Lock()
	delete(h.tokens, id)
	h.mu.Unlock()
	return nil
}

// ListSandboxes lists sandboxes (all pages) and adds each running one's latest
// metrics sample.
func (h *HTTPBackend) ListSandboxes(ctx context.Context, r ListSandboxesRequest) ([]SandboxInfo, error) {
	all, err := h.c.List(ctx, e2bclient.ListQuery{State: r.State, Metadata: r.Metadata})
	if err != nil {
		return nil, err
	}
	out := make([]SandboxInfo, len(all))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i, sb := range all {
		out[i] = info(sb)
		if sb.State != e2bwire.StateRunning || r.NoMetrics {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			// Metrics are a best effort here: a sandbox that just died or has no
			// sample yet is still listed, without them.
			ms, err := h.GetMetrics(ctx, sb.SandboxID)
			if err != nil || len(ms) == 0 {
				return
			}
			l := ms[len(ms)-1]
			out[i].HasMetrics, out[i].CPUPct, out[i].MemUsed, out[i].MemTotal = true, l.CPUPct, l.MemUsed, l.MemTotal
		}()
	}
	wg.Wait()
	sort.SliceStable(out, func(a, b int) bool { return out[a].StartedAt.After(out[b].StartedAt) })
	return out, nil
}

// SetTimeout sets the sandbox's time to live from now.
func (h *HTTPBackend) SetTimeout(ctx context.Context, id string, d time.Duration) error {
	return h.c.SetTimeout(ctx, id, d)
}

// GetMetrics returns the sandbox's metrics samples, oldest first.
func (h *HTTPBackend) GetMetrics(ctx context.Context, id string) ([]Metric, error) {
	ws, err := h.c.Metrics(ctx, id)
	if err != nil {
		return nil, err
	}
	out := make([]Metric, 0, len(ws))
	for _, m := range ws {
		out = append(out, Metric{Timestamp: m.Timestamp, CPUCount: m.CPUCount, CPUPct: m.CPUUsedPct,
			MemUsed: m.MemUsed, MemTotal: m.MemTotal, DiskUsed: m.DiskUsed, DiskTotal: m.DiskTotal})
	}
	sort.SliceStable(out, func(a, b int) bool { return out[a].Timestamp.Before(out[b].Timestamp) })
	return out, nil
}

// --- sandbox traffic -------------------------------------------------------------

// sandbox returns the client's handle on a sandbox, with its envd access token:
// the one create returned, or, for a sandbox this backend did not create, the
// one GET /sandboxes/{id} returns (cached).
func (h *HTTPBackend) sandbox(ctx context.Context, id string) (*e2bclient.Sandbox, error) {
	h.mu.Lock()
	t, ok := h.tokens[id]
	h.mu.Unlock()
	if ok {
		return h.c.Sandbox(id, t), nil
	}
	sb, err := h.c.Get(ctx, id)
	if err != nil {
		return nil, classify(err)
	}
	if sb.State == e2bwire.StatePaused {
		return nil, pausedError(id)
	}
	h.remember(id, sb.EnvdAccessToken)
	return h.c.Sandbox(id, sb.EnvdAccessToken), nil
}

// pausedError is what every sandbox-traffic call says about a paused sandbox:
// the one thing to do about it.
func pausedError(id string) error {
	return &kindError{kind: ErrPaused, err: fmt.Errorf("sandbox %s is paused; resume it with resume_sandbox first", id)}
}

// kindError gives an error from the wire one of the Backend's kinds
// (ErrNotFound, ErrIsDirectory, ErrPaused) for errors.Is, keeping its message.
type kindError struct {
	kind error
	err  error
}

func (e *kindError) Error() string        { return e.err.Error() }
func (e *kindError) Unwrap() error        { return e.err }
func (e *kindError) Is(target error) bool { return target == e.kind }

// classify marks the API's and envd's 404s as ErrNotFound and envd's "is a
// directory" as ErrIsDirectory.
func classify(err error) error {
	var e *e2bclient.Error
	switch {
	case err == nil:
		return nil
	case connect.CodeOf(err) == connect.CodeNotFound:
		return &kindError{kind: ErrNotFound, err: err}
	case !errors.As(err, &e):
		return err
	case e.Status == http.StatusNotFound:
		return &kindError{kind: ErrNotFound, err: err}
	case e.Status == http.StatusBadRequest && strings.Contains(e.Message, "is a directory"):
		return &kindError{kind: ErrIsDirectory, err: err}
	}
	return err
}

// explain turns a failed call to a sandbox into what went wrong from the
// caller's side when the sandbox itself is the cause: the proxy answers only
// that it cannot reach the sandbox, which for a sandbox that was paused or
// killed since its token was cached says nothing useful. It asks the API
// (only on this failure path) and drops a dead sandbox's cached token.
func (h *HTTPBackend) explain(ctx context.Context, id string, err error) error {
	if err == nil || ctx.Err() != nil {
		return err
	}
	var e *e2bclient.Error
	if errors.As(err, &e) && e.Status != http.StatusBadGateway {
		return classify(err)
	}
	sb, gerr := h.c.Get(context.WithoutCancel(ctx), id)
	switch {
	case gerr != nil:
		var ge *e2bclient.Error
		if errors.As(gerr, &ge) && ge.Status == http.StatusNotFound {
			h.forget(id)
			return classify(gerr)
		}
	case sb.State == e2bwire.StatePaused:
		return pausedError(id)
	}
	return classify(err)
}

// maxTokens bounds the envd token cache. serve keeps one backend per API key
// for as long as it runs, and sandboxes that die of their timeout are never
// forgotten otherwise; a token dropped here is asked of the API again.
const maxTokens = 4096

func (h *HTTPBackend) remember(id, token string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.tokens[id]; !ok && len(h.tokens) >= maxTokens {
		for old := range h.tokens {
			delete(h.tokens, old) // any one: map order is as good as any
			break
		}
	}
	h.tokens[id] = token
}

func (h *HTTPBackend) forget(id string) {
	h.mu.Lock()
	delete(h.tokens, id)
	h.mu.Unlock()
}

// RunCode posts the code to the interpreter and collects its NDJSON event stream.
func (h *HTTPBackend) RunCode(ctx context.Context, r RunCodeRequest) (Execution, error) {
	if r.Timeout > 0 {
		// The interpreter interrupts the code (keeping state) when the request
		// goes away, so the deadline is the timeout.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.Timeout)
		defer cancel()
	}
	body := e2bwire.ExecuteRequest{Code: r.Code}
	if r.ContextID != "" {
		body.ContextID = &r.ContextID
	} else if r.Language != "" {
		body.Language = &r.Language
	}
	sb, err := h.sandbox(ctx, r.SandboxID)
	if err != nil {
		return Execution{}, err
	}
	report := func(stream, text string) {
		if r.OnOutput != nil {
			r.OnOutput(stream, text)
		}
	}
	var ex Execution
	err = sb.Execute(ctx, body, func(ev e2bclient.Event) error {
		switch ev.Type {
		case "stdout":
			ex.Stdout = append(ex.Stdout, ev.Text)
			report("stdout", ev.Text)
		case "stderr":
			ex.Stderr = append(ex.Stderr, ev.Text)
			report("stderr", ev.Text)
		case "error":
			ex.Error = &ExecutionError{Name: ev.Name, Value: ev.Value, Traceback: ev.Traceback}
		case "result":
			r := Result{IsMain: ev.IsMainResult, Formats: ev.Formats()}
			ex.Results = append(ex.Results, r)
			if r.Formats["text"] != "" {
				report("result", r.Formats["text"])
			}
		case "unexpected_end_of_execution":
			return errors.New("code interpreter: the execution ended unexpectedly")
		}
		return nil
	})
	if err != nil {
		return ex, timeoutErr(ctx, r.Timeout, h.explain(ctx, r.SandboxID, err))
	}
	return ex, nil
}

// timeoutErr says "timed out" in words when the deadline was the cause.
func timeoutErr(ctx context.Context, d time.Duration, err error) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) && d > 0 {
		return fmt.Errorf("timed out after %s: %w", d, err)
	}
	return err
}

// RunCommand starts bash -l -c command through envd's process service. A
// background command returns at its start event; envd keeps it running after the
// stream closes, as for the SDKs' background commands. A foreground command that
// outlives its timeout is killed.
func (h *HTTPBackend) RunCommand(ctx context.Context, r RunCommandRequest) (CommandResult, error) {
	sb, err := h.sandbox(ctx, r.SandboxID)
	if err != nil {
		return CommandResult{}, err
	}
	cfg := &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", r.Command}, Envs: r.Envs}
	if r.Cwd != "" {
		cfg.Cwd = &r.Cwd
	}
	noStdin := false
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := sb.Start(sctx, &process.StartRequest{Process: cfg, Stdin: &noStdin})
	if err != nil {
		return CommandResult{}, fmt.Errorf("start command: %w", h.explain(ctx, r.SandboxID, err))
	}
	defer stream.Close()

	var res CommandResult
	var pid atomic.Uint32 // read by the timeout goroutine
	var stdout, stderr clipBuffer
	var timer <-chan time.Time
	timedOut := make(chan struct{})
	if !r.Background && r.Timeout > 0 {
		t := time.NewTimer(r.Timeout)
		defer t.Stop()
		timer = t.C
	}
	go func() {
		select {
		case <-timer:
			close(timedOut)
			if p := pid.Load(); p != 0 {
				kill(context.WithoutCancel(ctx), sb, p)
			}
			cancel()
		case <-sctx.Done():
		}
	}()
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		switch {
		case ev.GetStart() != nil:
			res.PID = ev.GetStart().GetPid()
			pid.Store(res.PID)
			if r.Background {
				return res, nil
			}
		case ev.GetData() != nil:
			out, errb := ev.GetData().GetStdout(), ev.GetData().GetStderr()
			stdout.Write(out)
			stderr.Write(errb)
			if r.OnOutput != nil && len(out) > 0 {
				r.OnOutput("stdout", string(out))
			}
			if r.OnOutput != nil && len(errb) > 0 {
				r.OnOutput("stderr", string(errb))
			}
		case ev.GetEnd() != nil:
			select {
			case <-timedOut: // our SIGKILL ended it
				return CommandResult{}, commandTimeout(r.Timeout, res.PID, &stdout, &stderr)
			default:
			}
			end := ev.GetEnd()
			res.ExitCode = int(end.GetExitCode())
			res.Error = end.GetError()
			res.Stdout, res.Stderr = stdout.String(), stderr.String()
			res.Truncated = stdout.truncated() || stderr.truncated()
			// Read on to the stream's end, as the SDKs do: a stream closed
			// early costs the connection, which the next command dials again.
			for stream.Receive() {
			}
			return res, nil
		}
	}
	select {
	case <-timedOut:
		return CommandResult{}, commandTimeout(r.Timeout, res.PID, &stdout, &stderr)
	default:
	}
	if err := stream.Err(); err != nil {
		return CommandResult{}, fmt.Errorf("command: %w", h.explain(ctx, r.SandboxID, err))
	}
	return CommandResult{}, errors.New("command: the stream ended without an end event")
}

// commandTimeout reports a killed command with the output it had produced, which
// often says why it hung (a prompt waiting for input, a server that started).
func commandTimeout(d time.Duration, pid uint32, stdout, stderr *clipBuffer) error {
	msg := fmt.Sprintf("command timed out after %s and was killed (pid %d); use background for long-running commands", d, pid)
	if s := stdout.String(); s != "" {
		msg += "\nstdout so far:\n" + s
	}
	if s := stderr.String(); s != "" {
		msg += "\nstderr so far:\n" + s
	}
	return errors.New(msg)
}

// kill sends SIGKILL to a process in the sandbox (best effort: it may have just ended).
func kill(ctx context.Context, sb *e2bclient.Sandbox, pid uint32) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_ = sb.SendSignal(ctx, &process.SendSignalRequest{
		Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}},
		Signal:  process.Signal_SIGNAL_SIGKILL,
	})
}

// ReadFile downloads at most limit bytes of a file with envd's GET /files,
// and says whether the file goes on: the caller never holds more than it
// can show.
func (h *HTTPBackend) ReadFile(ctx context.Context, id, path string, limit int) ([]byte, bool, error) {
	sb, err := h.sandbox(ctx, id)
	if err != nil {
		return nil, false, err
	}
	body, err := sb.ReadFile(ctx, path)
	if err != nil {
		return nil, false, h.explain(ctx, id, err)
	}
	defer body.Close()
	data, err := io.ReadAll(io.LimitReader(body, int64(limit)+1))
	if err != nil {
		return nil, false, fmt.Errorf("read file: %w", err)
	}
	if len(data) > limit {
		return data[:limit], true, nil
	}
	return data, false, nil
}

// WriteFile uploads a file with envd's POST /files (octet-stream, path in the query).
func (h *HTTPBackend) WriteFile(ctx context.Context, id, path string, data []byte) error {
	sb, err := h.sandbox(ctx, id)
	if err != nil {
		return err
	}
	return h.explain(ctx, id, sb.WriteFile(ctx, path, bytes.NewReader(data)))
}

// ListFiles lists a directory with envd's filesystem ListDir.
func (h *HTTPBackend) ListFiles(ctx context.Context, id, path string, depth int) ([]FileEntry, error) {
	sb, err := h.sandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	resp, err := sb.ListDir(ctx, &filesystem.ListDirRequest{Path: path, Depth: uint32(max(depth, 1))})
	if err != nil {
		return nil, fmt.Errorf("list directory: %w", h.explain(ctx, id, err))
	}
	out := make([]FileEntry, 0, len(resp.GetEntries()))
	for _, e := range resp.GetEntries() {
		fe := FileEntry{Name: e.GetName(), Path: e.GetPath(), Type: e2bclient.EntryType(e), Size: e.GetSize(), Permissions: e.GetPermissions()}
		if e.GetModifiedTime() != nil {
			fe.Modified = e.GetModifiedTime().AsTime()
		}
		out = append(out, fe)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Path < out[b].Path })
	return out, nil
}
