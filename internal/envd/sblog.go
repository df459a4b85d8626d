package envd

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	pb "github.com/airlock-sandbox/airlock/api/gen/process"
	"github.com/airlock-sandbox/airlock/internal/sandboxlog"
)

// The sandbox log (internal/sandboxlog): what `e2b sandbox logs` shows of
// the inside of a sandbox. envd writes it beside its own log, in the run
// directory the host reads it from.

// startCmdTag is the tag the host gives a template's start command
// (sandbox.StartCmdTag), whose output goes to the sandbox log.
const startCmdTag = "start_cmd"

// Bounds of the start command's output in the log: it is a service's
// start-up story, not its whole output.
const (
	maxOutputLines = 200
	maxOutputBytes = 32 << 10
)

// newSandboxLog returns the writer of the sandbox log beside logPath (the
// config's LogPath), or nil when envd logs nowhere (tests, build steps).
func newSandboxLog(logPath string) *sandboxlog.Writer {
	if logPath == "" {
		return nil
	}
	return sandboxlog.NewWriter(filepath.Join(filepath.Dir(logPath), sandboxlog.FileName))
}

// procLevel is the level of a process's entries: info unless the request
// asked for another (the host's ready checks ask for debug).
func procLevel(h interface{ Get(string) string }) string {
	if l := h.Get(sandboxlog.LevelHeader); l != "" {
		if _, ok := sandboxlog.Rank(l); ok {
			return l
		}
	}
	return sandboxlog.Info
}

// commandLine is the process's command as a shell would show it.
func commandLine(cfg *pb.ProcessConfig) string {
	parts := append([]string{cfg.GetCmd()}, cfg.GetArgs()...)
	for i, a := range parts {
		if a == "" || strings.ContainsAny(a, " \t\n'\"\\$`") {
			parts[i] = strconv.Quote(a)
		}
	}
	return strings.Join(parts, " ")
}

func (p *proc) logFields() map[string]string {
	f := map[string]string{"pid": strconv.FormatUint(uint64(p.pid), 10), "cmd": commandLine(p.config)}
	if p.tag != nil {
		f["tag"] = *p.tag
	}
	if p.user != "" {
		f["user"] = p.user
	}
	return f
}

// logStarted and logEnded tell the sandbox log a process's start and end.
func (p *proc) logStarted() {
	if p.sblog == nil {
		return
	}
	msg := fmt.Sprintf("process %d started: %s", p.pid, commandLine(p.config))
	p.sblog.Write(sandboxlog.Entry{Time: p.started, Level: p.level, Logger: "envd.process", Message: msg, Fields: p.logFields()})
}

func (p *proc) logEnded(end *pb.ProcessEvent_EndEvent) {
	if p.sblog == nil {
		return
	}
	if p.out != nil {
		p.out.flush()
	}
	f := p.logFields()
	f["exitCode"] = strconv.Itoa(int(end.GetExitCode()))
	f["status"] = end.GetStatus()
	f["durationMs"] = strconv.FormatInt(time.Since(p.started).Milliseconds(), 10)
	level := p.level
	var msg string
	switch {
	case end.GetExited() && end.GetExitCode() == 0:
		msg = fmt.Sprintf("process %d exited with code 0", p.pid)
	case end.GetExited():
		msg = fmt.Sprintf("process %d exited with code %d", p.pid, end.GetExitCode())
		level = atLeast(level, sandboxlog.Warn)
	default:
		// Killed by a signal (the OOM killer's SIGKILL among them) or lost.
		msg = fmt.Sprintf("process %d ended: %s", p.pid, end.GetStatus())
		level = atLeast(level, sandboxlog.Warn)
	}
	if p.timedOut.Load() {
		msg += " (killed at its time limit)"
	}
	p.sblog.Write(sandboxlog.Entry{Level: level, Logger: "envd.process", Message: msg, Fields: f})
}

func atLeast(level, floor string) string {
	a, _ := sandboxlog.Rank(level)
	b, _ := sandboxlog.Rank(floor)
	if a >= b {
		return level
	}
	return floor
}

// outputLog copies a process's output to the sandbox log line by line, up
// to maxOutputLines / maxOutputBytes, then says it stopped.
type outputLog struct {
	w    *sandboxlog.Writer
	pid  uint32
	tag  string
	mu   sync.Mutex
	buf  map[string]*bytes.Buffer
	n    int
	size int
	cut  bool
}

func newOutputLog(w *sandboxlog.Writer, pid uint32, tag string) *outputLog {
	return &outputLog{w: w, pid: pid, tag: tag, buf: map[string]*bytes.Buffer{}}
}

func (o *outputLog) write(stream string, data []byte) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.cut {
		return
	}
	b := o.buf[stream]
	if b == nil {
		b = &bytes.Buffer{}
		o.buf[stream] = b
	}
	b.Write(data)
	for {
		line, err := b.ReadBytes('\n')
		if err != nil {
			// An unfinished line waits for its end (at most a message's worth).
			if len(line) > sandboxlog.MaxMessageBytes {
				o.emitLocked(stream, string(line))
			} else {
				b.Reset()
				b.Write(line)
			}
			return
		}
		o.emitLocked(stream, strings.TrimRight(string(line), "\r\n"))
		if o.cut {
			return
		}
	}
}

func (o *outputLog) emitLocked(stream, line string) {
	if o.cut {
		return
	}
	o.n++
	o.size += len(line)
	fields := map[string]string{"pid": strconv.FormatUint(uint64(o.pid), 10), "stream": stream, "tag": o.tag}
	if o.n > maxOutputLines || o.size > maxOutputBytes {
		o.cut = true
		o.w.Write(sandboxlog.Entry{Level: sandboxlog.Info, Logger: "envd.output", Message: fmt.Sprintf("process %d: further output is not logged (the log keeps its first %d lines)", o.pid, maxOutputLines), Fields: fields})
		return
	}
	level := sandboxlog.Info
	if stream == "stderr" {
		level = sandboxlog.Warn
	}
	o.w.Write(sandboxlog.Entry{Level: level, Logger: "envd.output", Message: line, Fields: fields})
}

// flush logs unfinished lines once the process ended.
func (o *outputLog) flush() {
	o.mu.Lock()
	defer o.mu.Unlock()
	for stream, b := range o.buf {
		if b.Len() > 0 {
			o.emitLocked(stream, strings.TrimRight(b.String(), "\r\n"))
			b.Reset()
		}
	}
}

// teeHandler sends envd's own warnings and errors to the sandbox log as well
// as to its usual handler.
type teeHandler struct {
	slog.Handler
	w     *sandboxlog.Writer
	attrs []slog.Attr
}

func (t *teeHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn && t.w != nil {
		level := sandboxlog.Warn
		if r.Level >= slog.LevelError {
			level = sandboxlog.Error
		}
		f := map[string]string{}
		add := func(a slog.Attr) bool {
			f[a.Key] = a.Value.String()
			return true
		}
		for _, a := range t.attrs {
			add(a)
		}
		r.Attrs(add)
		delete(f, "stack")
		t.w.Write(sandboxlog.Entry{Time: r.Time, Level: level, Logger: "envd", Message: r.Message, Fields: f})
	}
	return t.Handler.Handle(ctx, r)
}

func (t *teeHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &teeHandler{Handler: t.Handler.WithAttrs(as), w: t.w, attrs: append(append([]slog.Attr(nil), t.attrs...), as...)}
}

func (t *teeHandler) WithGroup(name string) slog.Handler {
	return &teeHandler{Handler: t.Handler.WithGroup(name), w: t.w, attrs: t.attrs}
}

func (k outKind) streamName() string {
	switch k {
	case outStderr:
		return "stderr"
	case outPTY:
		return "pty"
	}
	return "stdout"
}
