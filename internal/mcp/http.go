package mcp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/api/gen/filesystem"
	"github.com/airlock-sandbox/airlock/api/gen/filesystem/filesystemconnect"
	"github.com/airlock-sandbox/airlock/api/gen/process"
	"github.com/airlock-sandbox/airlock/api/gen/process/processconnect"
)

// Ports inside a sandbox the proxy routes to (spec: envd and the code interpreter).
const (
	envdPort   = "49983"
	interpPort = "49999"
	// maxOutput bounds what one command or file read may bring back into the
	// model's context; more would be unreadable there anyway.
	maxOutput = 16 << 20
)

// HTTPConfig says where Airlock's E2B API and sandbox proxy are and which key to use.
// An empty SandboxURL is asked of the server (GET /airlock/v1/info) on first use:
// guessing it from the API URL would reach whatever listens on the guessed port.
type HTTPConfig struct {
	APIURL, SandboxURL, APIKey string
	HTTPClient                 *http.Client
}

// InfoPath is where an Airlock server says where its sandbox proxy is.
const InfoPath = "/airlock/v1/info"

// ServerInfo is the answer at InfoPath.
type ServerInfo struct {
	// SandboxURL is E2B_SANDBOX_URL for a client that reached the API as it did.
	SandboxURL string `json:"sandboxUrl"`
}

// NotReadyError is a 503 with Retry-After from the API: the template is still
// being built. Message says which step it is on and for how long.
type NotReadyError struct {
	Message    string
	RetryAfter time.Duration
}

func (e *NotReadyError) Error() string { return e.Message + " (HTTP 503)" }

// HTTPBackend implements Backend over the E2B REST API (APIURL) and the sandbox proxy
// (SandboxURL): envd's Connect process and filesystem services, /files, and the code
// interpreter on port 49999. It is a client of the same wire protocol the E2B SDKs
// speak, so MCP sees exactly what SDK users see.
type HTTPBackend struct {
	api, sbx string
	key      string
	client   *http.Client
	proc     processconnect.ProcessClient
	fs       filesystemconnect.FilesystemClient

	mu     sync.Mutex
	tokens map[string]string // sandbox id → envd access token

	// sbxMu guards the sandbox proxy's URL and clients, set on first use when
	// the config named no URL.
	sbxMu sync.Mutex
}

// NewHTTPBackend returns a Backend that talks to a running Airlock server.
func NewHTTPBackend(cfg HTTPConfig) Backend {
	c := cfg.HTTPClient
	if c == nil {
		c = http.DefaultClient
	}
	h := &HTTPBackend{
		api:    strings.TrimRight(cfg.APIURL, "/"),
		key:    cfg.APIKey,
		client: c,
		tokens: map[string]string{},
	}
	if cfg.SandboxURL != "" {
		h.setSandboxURL(cfg.SandboxURL)
	}
	return h
}

func (h *HTTPBackend) setSandboxURL(u string) {
	sbx := strings.TrimRight(u, "/")
	h.sbx = sbx
	h.proc = processconnect.NewProcessClient(h.client, sbx, connect.WithProtoJSON())
	h.fs = filesystemconnect.NewFilesystemClient(h.client, sbx, connect.WithProtoJSON())
}

// sandboxClients returns the sandbox proxy's URL and envd clients, asking the
// server where its proxy is the first time (the server may have started after
// this process, so a failure is not remembered).
func (h *HTTPBackend) sandboxClients(ctx context.Context) (string, processconnect.ProcessClient, filesystemconnect.FilesystemClient, error) {
	h.sbxMu.Lock()
	defer h.sbxMu.Unlock()
	if h.sbx != "" {
		return h.sbx, h.proc, h.fs, nil
	}
	var info ServerInfo
	if _, err := h.apiDo(ctx, http.MethodGet, InfoPath, nil, &info); err != nil {
		return "", nil, nil, fmt.Errorf("ask %s where its sandbox proxy is (or set E2B_SANDBOX_URL / --sandbox-url): %w", h.api, err)
	}
	if info.SandboxURL == "" {
		return "", nil, nil, fmt.Errorf("%s%s names no sandboxUrl; set E2B_SANDBOX_URL or --sandbox-url", h.api, InfoPath)
	}
	h.setSandboxURL(info.SandboxURL)
	return h.sbx, h.proc, h.fs, nil
}

// --- control plane -------------------------------------------------------------

// apiDo sends a REST request and decodes a 2xx JSON answer into out (if not nil).
// Error answers become errors carrying the server's message.
func (h *HTTPBackend) apiDo(ctx context.Context, method, path string, body, out any) (http.Header, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("encode request: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, h.api+path, rd)
	if err != nil {
		return nil, fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("X-API-KEY", h.key)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("airlock API: %w", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxOutput))
	if err != nil {
		return nil, fmt.Errorf("airlock API: read answer: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		var e struct {
			Message string `json:"message"`
		}
		if resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") != "" {
			// A template still being built: the tools wait and retry.
			wait, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
			msg := "the template is not ready yet"
			if json.Unmarshal(data, &e) == nil && e.Message != "" {
				msg = e.Message
			}
			return nil, &NotReadyError{Message: msg, RetryAfter: time.Duration(wait) * time.Second}
		}
		if json.Unmarshal(data, &e) == nil && e.Message != "" {
			return nil, fmt.Errorf("%s (HTTP %d)", e.Message, resp.StatusCode)
		}
		return nil, fmt.Errorf("airlock API %s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(data))
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return nil, fmt.Errorf("airlock API %s %s: decode answer: %w", method, path, err)
		}
	}
	return resp.Header, nil
}

type wireSandbox struct {
	SandboxID       string            `json:"sandboxID"`
	TemplateID      string            `json:"templateID"`
	Alias           string            `json:"alias"`
	EnvdAccessToken string            `json:"envdAccessToken"`
	StartedAt       time.Time         `json:"startedAt"`
	EndAt           time.Time         `json:"endAt"`
	CPUCount        int               `json:"cpuCount"`
	MemoryMB        int               `json:"memoryMB"`
	State           string            `json:"state"`
	Metadata        map[string]string `json:"metadata"`
}

func (w wireSandbox) info() SandboxInfo {
	tpl := w.Alias
	if tpl == "" {
		tpl = w.TemplateID
	}
	return SandboxInfo{SandboxID: w.SandboxID, Template: tpl, State: w.State, StartedAt: w.StartedAt, EndAt: w.EndAt,
		Metadata: w.Metadata, CPUCount: w.CPUCount, MemoryMB: w.MemoryMB}
}

type wireMetric struct {
	Timestamp  time.Time `json:"timestamp"`
	CPUCount   int       `json:"cpuCount"`
	CPUUsedPct float64   `json:"cpuUsedPct"`
	MemUsed    int64     `json:"memUsed"`
	MemTotal   int64     `json:"memTotal"`
	DiskUsed   int64     `json:"diskUsed"`
	DiskTotal  int64     `json:"diskTotal"`
}

func pathID(id string) string { return url.PathEscape(id) }

// CreateSandbox creates a sandbox and returns its details (state, start and expiry
// times come from a GET, which the create answer lacks).
func (h *HTTPBackend) CreateSandbox(ctx context.Context, r CreateSandboxRequest) (SandboxInfo, error) {
	body := map[string]any{"templateID": r.Template, "timeout": int64(r.Timeout / time.Second)}
	if len(r.Metadata) > 0 {
		body["metadata"] = r.Metadata
	}
	if len(r.Envs) > 0 {
		body["envVars"] = r.Envs
	}
	if r.AllowInternet != nil {
		body["allow_internet_access"] = *r.AllowInternet
	}
	var sb wireSandbox
	if _, err := h.apiDo(ctx, http.MethodPost, "/v2/sandboxes", body, &sb); err != nil {
		return SandboxInfo{}, err
	}
	h.mu.Lock()
	h.tokens[sb.SandboxID] = sb.EnvdAccessToken
	h.mu.Unlock()
	detail, err := h.get(ctx, sb.SandboxID)
	if err != nil {
		return SandboxInfo{}, fmt.Errorf("sandbox %s created, but: %w", sb.SandboxID, err)
	}
	return detail.info(), nil
}

func (h *HTTPBackend) get(ctx context.Context, id string) (wireSandbox, error) {
	var sb wireSandbox
	if _, err := h.apiDo(ctx, http.MethodGet, "/sandboxes/"+pathID(id), nil, &sb); err != nil {
		return sb, err
	}
	return sb, nil
}

// KillSandbox kills a sandbox.
func (h *HTTPBackend) KillSandbox(ctx context.Context, id string) error {
	if _, err := h.apiDo(ctx, http.MethodDelete, "/sandboxes/"+pathID(id), nil, nil); err != nil {
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
	q := url.Values{"limit": {"100"}}
	if r.State != "" {
		q.Set("state", r.State)
	}
	if len(r.Metadata) > 0 {
		// The API's metadata filter is a query string of its own (docs/E2B-WIRE.md §2.5).
		md := url.Values{}
		for k, v := range r.Metadata {
			md.Set(k, v)
		}
		q.Set("metadata", md.Encode())
	}
	var all []wireSandbox
	for {
		var page []wireSandbox
		hdr, err := h.apiDo(ctx, http.MethodGet, "/v2/sandboxes?"+q.Encode(), nil, &page)
		if err != nil {
			return nil, err
		}
		all = append(all, page...)
		next := hdr.Get("X-Next-Token")
		if next == "" || len(page) == 0 {
			break
		}
		q.Set("nextToken", next)
	}
	out := make([]SandboxInfo, len(all))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i, sb := range all {
		out[i] = sb.info()
		if sb.State != "running" {
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
	_, err := h.apiDo(ctx, http.MethodPost, "/sandboxes/"+pathID(id)+"/timeout", map[string]any{"timeout": int64(d / time.Second)}, nil)
	return err
}

// GetMetrics returns the sandbox's metrics samples, oldest first.
func (h *HTTPBackend) GetMetrics(ctx context.Context, id string) ([]Metric, error) {
	var ws []wireMetric
	if _, err := h.apiDo(ctx, http.MethodGet, "/sandboxes/"+pathID(id)+"/metrics", nil, &ws); err != nil {
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

// token returns the envd access token of a sandbox this backend did not create
// (from GET /sandboxes/{id}), cached.
func (h *HTTPBackend) token(ctx context.Context, id string) (string, error) {
	h.mu.Lock()
	t, ok := h.tokens[id]
	h.mu.Unlock()
	if ok {
		return t, nil
	}
	sb, err := h.get(ctx, id)
	if err != nil {
		return "", err
	}
	if sb.State == "paused" {
		return "", fmt.Errorf("sandbox %s is paused; resume it before using it", id)
	}
	h.mu.Lock()
	h.tokens[id] = sb.EnvdAccessToken
	h.mu.Unlock()
	return sb.EnvdAccessToken, nil
}

func routeHeaders(hdr http.Header, id, port, token string) {
	hdr.Set("E2b-Sandbox-Id", id)
	hdr.Set("E2b-Sandbox-Port", port)
	if token != "" {
		hdr.Set("X-Access-Token", token)
	}
}

// sandboxReq builds a plain HTTP request to a port of the sandbox through the proxy.
func (h *HTTPBackend) sandboxReq(ctx context.Context, id, port, method, path string, body io.Reader) (*http.Request, error) {
	tok, err := h.token(ctx, id)
	if err != nil {
		return nil, err
	}
	sbx, _, _, err := h.sandboxClients(ctx)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, method, sbx+path, body)
	if err != nil {
		return nil, fmt.Errorf("build request: %w", err)
	}
	routeHeaders(req.Header, id, port, tok)
	return req, nil
}

// sandboxError turns a non-2xx answer from envd or the interpreter into an error
// with the message they sent (JSON {message} or plain text).
func sandboxError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var e struct {
		Message string `json:"message"`
	}
	msg := strings.TrimSpace(string(b))
	if json.Unmarshal(b, &e) == nil && e.Message != "" {
		msg = e.Message
	}
	if msg == "" {
		msg = resp.Status
	}
	return fmt.Errorf("%s (HTTP %d)", msg, resp.StatusCode)
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
	body := map[string]any{"code": r.Code}
	if r.ContextID != "" {
		body["context_id"] = r.ContextID
	} else if r.Language != "" {
		body["language"] = r.Language
	}
	b, err := json.Marshal(body)
	if err != nil {
		return Execution{}, fmt.Errorf("encode request: %w", err)
	}
	req, err := h.sandboxReq(ctx, r.SandboxID, interpPort, http.MethodPost, "/execute", bytes.NewReader(b))
	if err != nil {
		return Execution{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.client.Do(req)
	if err != nil {
		return Execution{}, timeoutErr(ctx, r.Timeout, fmt.Errorf("code interpreter: %w", err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Execution{}, fmt.Errorf("code interpreter: %w", sandboxError(resp))
	}
	var ex Execution
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	for sc.Scan() {
		var ev map[string]json.RawMessage
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return ex, fmt.Errorf("code interpreter: bad event line: %w", err)
		}
		str := func(k string) string {
			var s string
			_ = json.Unmarshal(ev[k], &s)
			return s
		}
		switch str("type") {
		case "stdout":
			ex.Stdout = append(ex.Stdout, str("text"))
		case "stderr":
			ex.Stderr = append(ex.Stderr, str("text"))
		case "error":
			ex.Error = &ExecutionError{Name: str("name"), Value: str("value"), Traceback: str("traceback")}
		case "result":
			res := Result{Formats: map[string]string{}}
			_ = json.Unmarshal(ev["is_main_result"], &res.IsMain)
			for k, v := range ev {
				switch k {
				case "type", "is_main_result", "extra":
					continue
				}
				var s string
				if json.Unmarshal(v, &s) != nil {
					s = string(v) // json, data and chart are objects: keep their JSON text
				}
				res.Formats[k] = s
			}
			ex.Results = append(ex.Results, res)
		case "end_of_execution":
			return ex, nil
		case "unexpected_end_of_execution":
			return ex, errors.New("code interpreter: the execution ended unexpectedly")
		}
	}
	if err := sc.Err(); err != nil {
		return ex, timeoutErr(ctx, r.Timeout, fmt.Errorf("code interpreter: %w", err))
	}
	return ex, errors.New("code interpreter: the stream ended without end_of_execution")
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
	tok, err := h.token(ctx, r.SandboxID)
	if err != nil {
		return CommandResult{}, err
	}
	cfg := &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", r.Command}, Envs: r.Envs}
	if r.Cwd != "" {
		cfg.Cwd = &r.Cwd
	}
	noStdin := false
	req := connect.NewRequest(&process.StartRequest{Process: cfg, Stdin: &noStdin})
	routeHeaders(req.Header(), r.SandboxID, envdPort, tok)

	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	_, proc, _, err := h.sandboxClients(ctx)
	if err != nil {
		return CommandResult{}, err
	}
	stream, err := proc.Start(sctx, req)
	if err != nil {
		return CommandResult{}, fmt.Errorf("start command: %w", err)
	}
	defer stream.Close()

	var res CommandResult
	var pid atomic.Uint32 // read by the timeout goroutine
	var stdout, stderr limitedBuffer
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
				h.kill(context.WithoutCancel(ctx), r.SandboxID, tok, p)
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
			stdout.Write(ev.GetData().GetStdout())
			stderr.Write(ev.GetData().GetStderr())
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
			return res, nil
		}
	}
	select {
	case <-timedOut:
		return CommandResult{}, commandTimeout(r.Timeout, res.PID, &stdout, &stderr)
	default:
	}
	if err := stream.Err(); err != nil {
		return CommandResult{}, fmt.Errorf("command: %w", err)
	}
	return CommandResult{}, errors.New("command: the stream ended without an end event")
}

// commandTimeout reports a killed command with the output it had produced, which
// often says why it hung (a prompt waiting for input, a server that started).
func commandTimeout(d time.Duration, pid uint32, stdout, stderr *limitedBuffer) error {
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
func (h *HTTPBackend) kill(ctx context.Context, id, tok string, pid uint32) {
	req := connect.NewRequest(&process.SendSignalRequest{
		Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}},
		Signal:  process.Signal_SIGNAL_SIGKILL,
	})
	routeHeaders(req.Header(), id, envdPort, tok)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, proc, _, err := h.sandboxClients(ctx); err == nil {
		_, _ = proc.SendSignal(ctx, req)
	}
}

// limitedBuffer keeps the first maxOutput bytes and notes that more was cut.
type limitedBuffer struct {
	b   bytes.Buffer
	cut bool
}

func (l *limitedBuffer) Write(p []byte) {
	if room := maxOutput - l.b.Len(); len(p) > room {
		p, l.cut = p[:max(room, 0)], true
	}
	l.b.Write(p)
}

func (l *limitedBuffer) String() string {
	if l.cut {
		return l.b.String() + "\n[output truncated at " + strconv.Itoa(maxOutput>>20) + " MiB]"
	}
	return l.b.String()
}

// ReadFile downloads a file with envd's GET /files.
func (h *HTTPBackend) ReadFile(ctx context.Context, id, path string) ([]byte, error) {
	req, err := h.sandboxReq(ctx, id, envdPort, http.MethodGet, "/files?"+url.Values{"path": {path}}.Encode(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("read file: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, sandboxError(resp)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxOutput+1))
	if err != nil {
		return nil, fmt.Errorf("read file: %w", err)
	}
	if len(data) > maxOutput {
		return nil, fmt.Errorf("file is larger than %d MiB; read parts of it with run_command (head, tail, sed)", maxOutput>>20)
	}
	return data, nil
}

// WriteFile uploads a file with envd's POST /files (octet-stream, path in the query).
func (h *HTTPBackend) WriteFile(ctx context.Context, id, path string, data []byte) error {
	req, err := h.sandboxReq(ctx, id, envdPort, http.MethodPost, "/files?"+url.Values{"path": {path}}.Encode(), bytes.NewReader(data))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := h.client.Do(req)
	if err != nil {
		return fmt.Errorf("write file: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return sandboxError(resp)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return nil
}

// ListFiles lists a directory with envd's filesystem ListDir.
func (h *HTTPBackend) ListFiles(ctx context.Context, id, path string, depth int) ([]FileEntry, error) {
	tok, err := h.token(ctx, id)
	if err != nil {
		return nil, err
	}
	req := connect.NewRequest(&filesystem.ListDirRequest{Path: path, Depth: uint32(max(depth, 1))})
	routeHeaders(req.Header(), id, envdPort, tok)
	_, _, fsc, err := h.sandboxClients(ctx)
	if err != nil {
		return nil, err
	}
	resp, err := fsc.ListDir(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("list directory: %w", err)
	}
	out := make([]FileEntry, 0, len(resp.Msg.GetEntries()))
	for _, e := range resp.Msg.GetEntries() {
		typ := "file"
		switch e.GetType() {
		case filesystem.FileType_FILE_TYPE_DIRECTORY:
			typ = "dir"
		case filesystem.FileType_FILE_TYPE_SYMLINK:
			typ = "symlink"
		}
		fe := FileEntry{Name: e.GetName(), Path: e.GetPath(), Type: typ, Size: e.GetSize(), Permissions: e.GetPermissions()}
		if e.GetModifiedTime() != nil {
			fe.Modified = e.GetModifiedTime().AsTime()
		}
		out = append(out, fe)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Path < out[b].Path })
	return out, nil
}
