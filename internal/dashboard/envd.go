package dashboard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/coder/websocket"

	"github.com/airlock-sandbox/airlock/api/gen/filesystem"
	"github.com/airlock-sandbox/airlock/api/gen/process"
	"github.com/airlock-sandbox/airlock/internal/apikey"
	"github.com/airlock-sandbox/airlock/internal/e2bclient"
	"github.com/airlock-sandbox/airlock/internal/grant"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// envdOf is the session's handle on the sandbox's envd, through the proxy.
// It presents the session key's grant, so that revoking the key or taking
// its sandboxes:write away ends the dashboard's envd access as it does the
// SDKs'.
func (d *Dashboard) envdOf(s *session, in sandbox.Info) *e2bclient.Sandbox {
	token := in.AccessToken
	if d.o.Grants && token != "" {
		token = grant.Token(token, s.who.KeyID)
	}
	return d.o.Envd(s.key).Sandbox(in.ID, token)
}

// envdError answers a failed envd call with its status and message.
func envdError(w http.ResponseWriter, what string, err error) {
	var ce *connect.Error
	var he *e2bclient.Error
	switch {
	case errors.As(err, &ce):
		status := http.StatusBadGateway
		switch ce.Code() {
		case connect.CodeNotFound:
			status = http.StatusNotFound
		case connect.CodeInvalidArgument:
			status = http.StatusBadRequest
		case connect.CodePermissionDenied:
			status = http.StatusForbidden
		case connect.CodeFailedPrecondition, connect.CodeAlreadyExists:
			status = http.StatusConflict
		}
		writeError(w, status, fmt.Sprintf("%s: %s", what, ce.Message()))
	case errors.As(err, &he):
		status := he.Status
		if status < 400 || status >= 500 {
			status = http.StatusBadGateway
		}
		writeError(w, status, fmt.Sprintf("%s: %s", what, he.Message))
	default:
		writeError(w, http.StatusBadGateway, fmt.Sprintf("%s: %v", what, err))
	}
}

type processJSON struct {
	PID  uint32   `json:"pid"`
	Cmd  string   `json:"cmd"`
	Args []string `json:"args"`
	Cwd  string   `json:"cwd"`
	Tag  string   `json:"tag"`
}

func (d *Dashboard) processes(w http.ResponseWriter, r *http.Request) {
	s, in := sessionFrom(r.Context()), infoFrom(r.Context())
	procs, err := d.envdOf(s, in).Processes(r.Context())
	if err != nil {
		envdError(w, "Listing the processes failed", err)
		return
	}
	out := make([]processJSON, 0, len(procs))
	for _, p := range procs {
		c := p.GetConfig()
		out = append(out, processJSON{PID: p.GetPid(), Cmd: c.GetCmd(), Args: nonNil(c.GetArgs()), Cwd: c.GetCwd(), Tag: p.GetTag()})
	}
	writeJSON(w, http.StatusOK, map[string]any{"processes": out})
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func (d *Dashboard) killProcess(w http.ResponseWriter, r *http.Request) {
	s, in := sessionFrom(r.Context()), infoFrom(r.Context())
	pid, err := strconv.ParseUint(r.PathValue("pid"), 10, 32)
	if err != nil || pid == 0 {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("Invalid pid %q", r.PathValue("pid")))
		return
	}
	err = d.envdOf(s, in).SendSignal(r.Context(), &process.SendSignalRequest{
		Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: uint32(pid)}},
		Signal:  process.Signal_SIGNAL_SIGKILL,
	})
	if err != nil {
		envdError(w, "Killing the process failed", err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// defaultDir is where the file browser starts.
const defaultDir = "/home/user"

type entryJSON struct {
	Name         string    `json:"name"`
	Path         string    `json:"path"`
	Type         string    `json:"type"`
	Size         int64     `json:"size"`
	ModifiedTime time.Time `json:"modifiedTime"`
	Permissions  string    `json:"permissions"`
}

func (d *Dashboard) listDir(w http.ResponseWriter, r *http.Request) {
	s, in := sessionFrom(r.Context()), infoFrom(r.Context())
	dir, ok := absPath(w, r, defaultDir)
	if !ok {
		return
	}
	resp, err := d.envdOf(s, in).ListDir(r.Context(), &filesystem.ListDirRequest{Path: dir, Depth: 1})
	if err != nil {
		envdError(w, "Listing "+dir+" failed", err)
		return
	}
	out := make([]entryJSON, 0, len(resp.GetEntries()))
	for _, e := range resp.GetEntries() {
		out = append(out, entryJSON{Name: e.GetName(), Path: e.GetPath(), Type: e2bclient.EntryType(e), Size: e.GetSize(),
			ModifiedTime: e.GetModifiedTime().AsTime(), Permissions: e.GetPermissions()})
	}
	writeJSON(w, http.StatusOK, map[string]any{"path": dir, "entries": out})
}

// absPath reads the path parameter: absolute, cleaned; def when absent.
func absPath(w http.ResponseWriter, r *http.Request, def string) (string, bool) {
	p := r.URL.Query().Get("path")
	if p == "" && def != "" {
		return def, true
	}
	if !strings.HasPrefix(p, "/") || strings.ContainsRune(p, 0) {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("path must be absolute, got %q", p))
		return "", false
	}
	return path.Clean(p), true
}

func (d *Dashboard) download(w http.ResponseWriter, r *http.Request) {
	s, in := sessionFrom(r.Context()), infoFrom(r.Context())
	p, ok := absPath(w, r, "")
	if !ok {
		return
	}
	body, err := d.envdOf(s, in).ReadFile(r.Context(), p)
	if err != nil {
		envdError(w, "Downloading "+p+" failed", err)
		return
	}
	defer body.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": path.Base(p)}))
	w.Header().Set("Cache-Control", "no-store")
	_, _ = io.Copy(w, body)
}

// maxUpload bounds one upload through the dashboard.
const maxUpload = 1 << 30

func (d *Dashboard) upload(w http.ResponseWriter, r *http.Request) {
	s, in := sessionFrom(r.Context()), infoFrom(r.Context())
	p, ok := absPath(w, r, "")
	if !ok {
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxUpload)
	mr, err := r.MultipartReader()
	if err != nil {
		writeError(w, http.StatusBadRequest, "Send the file as multipart/form-data in a field named file: "+err.Error())
		return
	}
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			writeError(w, http.StatusBadRequest, "The form has no field named file")
			return
		}
		if err != nil {
			writeError(w, http.StatusBadRequest, "Reading the upload failed: "+err.Error())
			return
		}
		if part.FormName() != "file" {
			part.Close()
			continue
		}
		err = d.envdOf(s, in).WriteFile(r.Context(), p, part)
		part.Close()
		var mbe *http.MaxBytesError
		switch {
		case errors.As(err, &mbe):
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("The upload is larger than %d MiB", maxUpload>>20))
		case err != nil:
			envdError(w, "Uploading "+p+" failed", err)
		default:
			w.WriteHeader(http.StatusNoContent)
		}
		return
	}
}

// WebSocket close codes of the terminal (4000-4999 are the application's).
const (
	closeUnauthorized websocket.StatusCode = 4401
	closeForbidden    websocket.StatusCode = 4403
	closeGone         websocket.StatusCode = 4404
	closeConflict     websocket.StatusCode = 4409
)

// terminalMessage is what the browser sends over the terminal's socket.
type terminalMessage struct {
	Type string `json:"type"` // input or resize
	Data string `json:"data"`
	Cols uint32 `json:"cols"`
	Rows uint32 `json:"rows"`
}

// closeReason fits a close reason into a control frame (123 bytes).
func closeReason(s string) string {
	if len(s) > 120 {
		s = s[:120]
	}
	return s
}

// terminal bridges a WebSocket to a login shell on a PTY in the sandbox:
// envd's process.Start with a PTY streams its output, SendInput and Update
// carry the keys and the size. The shell dies with the socket.
func (d *Dashboard) terminal(w http.ResponseWriter, r *http.Request) {
	// Accept refuses (403) a socket opened from another origin.
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer c.CloseNow()
	c.SetReadLimit(1 << 20)
	s := d.sessionOf(r)
	if s == nil {
		c.Close(closeUnauthorized, "not signed in")
		return
	}
	if r.URL.Query().Get("csrf") != s.csrf {
		c.Close(closeForbidden, "missing or wrong csrf parameter: reload the page")
		return
	}
	if !s.who.Has(apikey.SandboxesWrite) {
		c.Close(closeForbidden, "this API key lacks the scope "+string(apikey.SandboxesWrite))
		return
	}
	in, err := d.o.Sandboxes.Get(r.Context(), r.PathValue("id"))
	if errors.Is(err, sandbox.ErrNotFound) || (err == nil && in.Owner != s.owner) {
		msg := "sandbox not found"
		if last, ok := d.lastEvent(r.Context(), s.owner, r.PathValue("id")); ok {
			msg = "sandbox is gone: " + strings.TrimPrefix(last.Type, "sandbox.lifecycle.")
		}
		c.Close(closeGone, msg)
		return
	}
	if err != nil {
		c.Close(websocket.StatusInternalError, closeReason(err.Error()))
		return
	}
	if in.State != sandbox.StateRunning {
		c.Close(closeConflict, "sandbox is "+string(in.State)+": resume it first")
		return
	}
	cols, rows := dimension(r, "cols", 80), dimension(r, "rows", 24)

	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	sbx := d.envdOf(s, in)
	stream, err := sbx.Start(ctx, &process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-i", "-l"},
			Envs: map[string]string{"TERM": "xterm-256color", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}},
		Pty: &process.PTY{Size: &process.PTY_Size{Cols: cols, Rows: rows}},
	})
	if err != nil {
		c.Close(websocket.StatusInternalError, closeReason("starting the shell failed: "+err.Error()))
		return
	}
	defer stream.Close()
	if !stream.Receive() {
		c.Close(websocket.StatusInternalError, closeReason(fmt.Sprintf("the shell did not start: %v", stream.Err())))
		return
	}
	pid := stream.Msg().GetEvent().GetStart().GetPid()
	selector := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}
	defer func() { // the shell ends with the socket, whoever closed it
		kctx, kcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer kcancel()
		_ = sbx.SendSignal(kctx, &process.SendSignalRequest{Process: selector, Signal: process.Signal_SIGNAL_SIGKILL})
	}()

	// Output: the stream to the socket, until the shell ends.
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer cancel()
		for stream.Receive() {
			ev := stream.Msg().GetEvent()
			if out := ev.GetData().GetPty(); len(out) > 0 {
				if err := c.Write(ctx, websocket.MessageBinary, out); err != nil {
					return
				}
			}
			if end := ev.GetEnd(); end != nil {
				c.Close(websocket.StatusNormalClosure, closeReason("shell exited: "+end.GetStatus()))
				return
			}
		}
		if ctx.Err() != nil {
			return
		}
		msg := "the shell's stream ended"
		if err := stream.Err(); err != nil {
			msg += ": " + err.Error()
		}
		if _, gerr := d.o.Sandboxes.Get(context.Background(), in.ID); errors.Is(gerr, sandbox.ErrNotFound) {
			c.Close(closeGone, "sandbox is gone")
			return
		}
		c.Close(websocket.StatusInternalError, closeReason(msg))
	}()

	// Input: the socket to the shell, until either side goes.
	for {
		typ, b, err := c.Read(ctx)
		if err != nil {
			break
		}
		if typ != websocket.MessageText {
			continue
		}
		var m terminalMessage
		if json.Unmarshal(b, &m) != nil {
			continue
		}
		switch m.Type {
		case "input":
			err = sbx.SendInput(ctx, &process.SendInputRequest{Process: selector,
				Input: &process.ProcessInput{Input: &process.ProcessInput_Pty{Pty: []byte(m.Data)}}})
		case "resize":
			if m.Cols > 0 && m.Rows > 0 && m.Cols <= 1000 && m.Rows <= 1000 {
				err = sbx.Update(ctx, &process.UpdateRequest{Process: selector,
					Pty: &process.PTY{Size: &process.PTY_Size{Cols: m.Cols, Rows: m.Rows}}})
			}
		}
		if err != nil && ctx.Err() == nil {
			d.log.Debug("dashboard terminal: input failed", "sandbox", in.ID, "err", err)
		}
	}
	cancel()
	<-done
}

// dimension reads a terminal size parameter, def when absent or absurd.
func dimension(r *http.Request, name string, def uint32) uint32 {
	n, err := strconv.ParseUint(r.URL.Query().Get(name), 10, 32)
	if err != nil || n == 0 || n > 1000 {
		return def
	}
	return uint32(n)
}
