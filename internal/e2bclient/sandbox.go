package e2bclient

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/airlock-sandbox/airlock/api/gen/filesystem"
	"github.com/airlock-sandbox/airlock/api/gen/process"
	"github.com/airlock-sandbox/airlock/api/gen/process/processconnect"
	"github.com/airlock-sandbox/airlock/internal/e2bwire"
)

// Sandbox is one sandbox as its traffic through the proxy addresses it: its id
// and envd access token (from Create or Get), and optionally the user envd
// runs requests as.
type Sandbox struct {
	c         *Client
	id, token string
	user      string
	// basic is the Authorization header that selects user on envd's RPCs.
	basic string
}

// The ports as the routing header carries them.
var (
	envdPort   = strconv.Itoa(e2bwire.EnvdPort)
	interpPort = strconv.Itoa(e2bwire.InterpreterPort)
)

// Sandbox returns a handle on the sandbox id whose envdAccessToken is token
// ("" for a sandbox created without one). It makes no request.
func (c *Client) Sandbox(id, token string) *Sandbox {
	return &Sandbox{c: c, id: id, token: token}
}

// ID is the sandbox's id.
func (s *Sandbox) ID() string { return s.id }

// As returns a handle whose envd requests run as user instead of the
// sandbox's default user (docs/E2B-WIRE.md §3.6).
func (s *Sandbox) As(user string) *Sandbox {
	cp := *s
	cp.user = user
	cp.basic = ""
	if user != "" {
		cp.basic = "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"))
	}
	return &cp
}

// route sets everything the proxy and the sandbox need to know on a request
// to port: which sandbox (the proxy routes E2B_SANDBOX_URL traffic by these
// headers, docs/E2B-WIRE.md §1.3), the access token, and for envd the user. Every request
// of this package to a sandbox goes through here.
func (s *Sandbox) route(h http.Header, port string) {
	h.Set(e2bwire.HeaderSandboxID, s.id)
	h.Set(e2bwire.HeaderSandboxPort, port)
	if s.token != "" {
		h.Set(e2bwire.HeaderAccessToken, s.token)
	}
	if s.basic != "" && port == envdPort {
		h.Set("Authorization", s.basic)
	}
}

// request builds a plain HTTP request to port of the sandbox through the proxy.
func (s *Sandbox) request(ctx context.Context, port, method, path string, body io.Reader) (*http.Request, error) {
	base, _, _, err := s.c.sandboxURL(ctx)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, body)
	if err != nil {
		return nil, fmt.Errorf("build request: %w", err)
	}
	s.route(req.Header, port)
	return req, nil
}

// filesPath is envd's /files URL for path; the user goes in the query there,
// not in Authorization (docs/E2B-WIRE.md §3.7.3).
func (s *Sandbox) filesPath(path string) string {
	q := url.Values{"path": {path}}
	if s.user != "" {
		q.Set("username", s.user)
	}
	return "/files?" + q.Encode()
}

// Health is envd's GET /health: the floor of any request to a sandbox.
func (s *Sandbox) Health(ctx context.Context) error {
	req, err := s.request(ctx, envdPort, http.MethodGet, "/health", nil)
	if err != nil {
		return err
	}
	resp, err := s.c.http.Do(req)
	if err != nil {
		return fmt.Errorf("health: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return errorFrom(resp)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return nil
}

// ReadFile downloads a file with envd's GET /files. The caller reads the
// content and closes it.
func (s *Sandbox) ReadFile(ctx context.Context, path string) (io.ReadCloser, error) {
	req, err := s.request(ctx, envdPort, http.MethodGet, s.filesPath(path), nil)
	if err != nil {
		return nil, err
	}
	resp, err := s.c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("read file: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, errorFrom(resp)
	}
	return resp.Body, nil
}

// WriteFile uploads a file with envd's POST /files (octet-stream, the path in
// the query), creating its parent directories.
func (s *Sandbox) WriteFile(ctx context.Context, path string, content io.Reader) error {
	req, err := s.request(ctx, envdPort, http.MethodPost, s.filesPath(path), content)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := s.c.http.Do(req)
	if err != nil {
		return fmt.Errorf("write file: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errorFrom(resp)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return nil
}

// Start is envd's process.Start: the stream of the process's events, from its
// start to its end. envd takes the context's deadline as the process's
// lifetime (Connect-Timeout-Ms).
func (s *Sandbox) Start(ctx context.Context, msg *process.StartRequest) (*connect.ServerStreamForClient[process.StartResponse], error) {
	_, proc, _, err := s.c.sandboxURL(ctx)
	if err != nil {
		return nil, err
	}
	req := connect.NewRequest(msg)
	s.route(req.Header(), envdPort)
	return proc.Start(ctx, req)
}

// StartUndecoded is Start returning the raw Connect stream (envelopes of
// JSON) instead of decoding it: for a reader that only counts or discards the
// output, such as a benchmark running in the server's own process, where
// decoding would charge the client's work to the server.
func (s *Sandbox) StartUndecoded(ctx context.Context, msg *process.StartRequest) (io.ReadCloser, error) {
	b, err := protojson.Marshal(msg)
	if err != nil {
		return nil, fmt.Errorf("encode request: %w", err)
	}
	// One Connect streaming envelope: flags byte, big-endian length, message.
	body := make([]byte, 5, 5+len(b))
	binary.BigEndian.PutUint32(body[1:], uint32(len(b)))
	body = append(body, b...)
	req, err := s.request(ctx, envdPort, http.MethodPost, processconnect.ProcessStartProcedure, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/connect+json")
	resp, err := s.c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("start: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, errorFrom(resp)
	}
	return resp.Body, nil
}

// procCall makes one unary call of envd's process service on s.
func procCall[Req, Res any](ctx context.Context, s *Sandbox, msg *Req,
	call func(processconnect.ProcessClient, context.Context, *connect.Request[Req]) (*connect.Response[Res], error)) (*Res, error) {
	_, proc, _, err := s.c.sandboxURL(ctx)
	if err != nil {
		return nil, err
	}
	req := connect.NewRequest(msg)
	s.route(req.Header(), envdPort)
	resp, err := call(proc, ctx, req)
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

// SendSignal is envd's process.SendSignal.
func (s *Sandbox) SendSignal(ctx context.Context, msg *process.SendSignalRequest) error {
	_, err := procCall(ctx, s, msg, processconnect.ProcessClient.SendSignal)
	return err
}

// Processes is envd's process.List: the processes envd started and that
// still run.
func (s *Sandbox) Processes(ctx context.Context) ([]*process.ProcessInfo, error) {
	resp, err := procCall(ctx, s, &process.ListRequest{}, processconnect.ProcessClient.List)
	if err != nil {
		return nil, err
	}
	return resp.GetProcesses(), nil
}

// SendInput is envd's process.SendInput (stdin or PTY input).
func (s *Sandbox) SendInput(ctx context.Context, msg *process.SendInputRequest) error {
	_, err := procCall(ctx, s, msg, processconnect.ProcessClient.SendInput)
	return err
}

// Update is envd's process.Update (a PTY's size).
func (s *Sandbox) Update(ctx context.Context, msg *process.UpdateRequest) error {
	_, err := procCall(ctx, s, msg, processconnect.ProcessClient.Update)
	return err
}

// EntryType names a directory entry's type as the SDKs do: file, dir or
// symlink.
func EntryType(e *filesystem.EntryInfo) string {
	switch e.GetType() {
	case filesystem.FileType_FILE_TYPE_DIRECTORY:
		return "dir"
	case filesystem.FileType_FILE_TYPE_SYMLINK:
		return "symlink"
	}
	return "file"
}

// ListDir is envd's filesystem.ListDir.
func (s *Sandbox) ListDir(ctx context.Context, msg *filesystem.ListDirRequest) (*filesystem.ListDirResponse, error) {
	_, _, fs, err := s.c.sandboxURL(ctx)
	if err != nil {
		return nil, err
	}
	req := connect.NewRequest(msg)
	s.route(req.Header(), envdPort)
	resp, err := fs.ListDir(ctx, req)
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

// Event is one line of the code interpreter's /execute stream (docs/E2B-WIRE.md §4.1).
type Event struct {
	// Type is stdout, stderr, result, error, number_of_executions, keepalive,
	// or a type this client does not know (ignore it, as the SDKs do).
	Type string
	// Text is a stdout or stderr chunk, or a result's text/plain.
	Text string
	// Name, Value and Traceback describe an error.
	Name, Value, Traceback string
	// IsMainResult is a result's is_main_result: the cell's value, not a display.
	IsMainResult bool
	// Fields is the whole line, for a result's other formats (Formats).
	Fields map[string]json.RawMessage
}

// Formats is a result's MIME bundle by the interpreter's keys (text, html,
// png, json, chart, ...). Binary formats stay base64 text as sent, and
// objects (json, data, chart) their JSON text; extra is left out.
func (e Event) Formats() map[string]string {
	out := map[string]string{}
	for k, v := range e.Fields {
		switch k {
		case "type", "is_main_result", "extra":
			continue
		}
		var s string
		if json.Unmarshal(v, &s) != nil {
			s = string(v)
		}
		out[k] = s
	}
	return out
}

func (e *Event) decode(line []byte) error {
	if err := json.Unmarshal(line, &e.Fields); err != nil {
		return err
	}
	str := func(k string) string {
		var s string
		_ = json.Unmarshal(e.Fields[k], &s)
		return s
	}
	e.Type, e.Text = str("type"), str("text")
	e.Name, e.Value, e.Traceback = str("name"), str("value"), str("traceback")
	_ = json.Unmarshal(e.Fields["is_main_result"], &e.IsMainResult)
	return nil
}

// CreateContext makes a code-interpreter context (POST /contexts on port 49999), which
// starts its kernel, and returns its id. An empty cwd leaves the interpreter's default.
func (s *Sandbox) CreateContext(ctx context.Context, language, cwd string) (string, error) {
	body := map[string]string{"language": language}
	if cwd != "" {
		body["cwd"] = cwd
	}
	b, err := json.Marshal(body)
	if err != nil {
		return "", fmt.Errorf("encode request: %w", err)
	}
	req, err := s.request(ctx, interpPort, http.MethodPost, "/contexts", bytes.NewReader(b))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.c.http.Do(req)
	if err != nil {
		return "", fmt.Errorf("create context: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return "", fmt.Errorf("create context: %w", errorFrom(resp))
	}
	var out struct {
		ID string `json:"id"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return "", fmt.Errorf("create context: decode answer: %w", err)
	}
	return out.ID, nil
}

// DeleteContext removes a code-interpreter context and stops its kernel.
func (s *Sandbox) DeleteContext(ctx context.Context, id string) error {
	req, err := s.request(ctx, interpPort, http.MethodDelete, "/contexts/"+url.PathEscape(id), nil)
	if err != nil {
		return err
	}
	resp, err := s.c.http.Do(req)
	if err != nil {
		return fmt.Errorf("delete context: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("delete context: %w", errorFrom(resp))
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return nil
}

// Execute runs code in the sandbox's code interpreter (POST /execute on port
// 49999) and calls fn with each event up to end_of_execution, when it returns
// nil. An error from fn ends the execution and is returned as it is. The
// interpreter interrupts the code (keeping the context's state) when ctx ends.
func (s *Sandbox) Execute(ctx context.Context, body e2bwire.ExecuteRequest, fn func(Event) error) error {
	b, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("encode request: %w", err)
	}
	req, err := s.request(ctx, interpPort, http.MethodPost, "/execute", bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.c.http.Do(req)
	if err != nil {
		return fmt.Errorf("code interpreter: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("code interpreter: %w", errorFrom(resp))
	}
	sc := bufio.NewScanner(resp.Body)
	// A line holds a whole result: a plot's PNG, a DataFrame's JSON.
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	for sc.Scan() {
		var ev Event
		if err := ev.decode(sc.Bytes()); err != nil {
			return fmt.Errorf("code interpreter: bad event line: %w", err)
		}
		if ev.Type == "end_of_execution" {
			return nil
		}
		if err := fn(ev); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("code interpreter: %w", err)
	}
	return errors.New("code interpreter: the stream ended without end_of_execution")
}
