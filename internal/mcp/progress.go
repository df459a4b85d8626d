package mcp

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// progressEvery is the least time between two progress notifications about
// output: a program printing thousands of lines a second would otherwise send
// as many notifications, which no client shows and every client must read.
// Phase changes (created, building, ready) are never held back.
var progressEvery = 250 * time.Millisecond

// maxProgressMessage bounds a notification's message: it is a status line,
// the output itself comes in the result.
const maxProgressMessage = 200

// progress sends MCP progress notifications for one tool call, when the call
// carried a progress token (otherwise it does nothing). Progress values only
// grow, as the spec requires, whatever order the callers report in.
type progress struct {
	session *mcp.ServerSession
	token   any

	mu   sync.Mutex
	last float64
	// outputSent is when output was last reported: phases do not count,
	// so the first output after a phase is always shown.
	outputSent time.Time
}

func newProgress(req *mcp.CallToolRequest) *progress {
	p := &progress{}
	if req != nil && req.Params != nil && req.Session != nil {
		p.session, p.token = req.Session, req.Params.GetProgressToken()
	}
	return p
}

func (p *progress) enabled() bool { return p != nil && p.token != nil }

// step reports a phase: always sent, one more than the last value.
func (p *progress) step(ctx context.Context, msg string) {
	p.notify(ctx, 0, 0, msg, false)
}

// at reports value out of total (0: unknown), e.g. seconds waited.
func (p *progress) at(ctx context.Context, value, total float64, msg string) {
	p.notify(ctx, value, total, msg, false)
}

// output reports a chunk of a program's output, at most one every
// progressEvery.
func (p *progress) output(ctx context.Context, stream, text string) {
	line := lastLine(text)
	if line == "" {
		return
	}
	p.notify(ctx, 0, 0, stream+": "+line, true)
}

func (p *progress) notify(ctx context.Context, value, total float64, msg string, throttled bool) {
	if !p.enabled() {
		return
	}
	p.mu.Lock()
	now := time.Now()
	if throttled {
		if !p.outputSent.IsZero() && now.Sub(p.outputSent) < progressEvery {
			p.mu.Unlock()
			return
		}
		p.outputSent = now
	}
	if value <= p.last {
		value = p.last + 1
	}
	if total > 0 && value > total {
		total = 0 // past the expected end: no longer a fraction of it
	}
	p.last = value
	p.mu.Unlock()
	if len(msg) > maxProgressMessage {
		msg = msg[:runeStart(msg, maxProgressMessage)] + "..."
	}
	// A client that went away cannot be told; the call's own result or error
	// says what happened, so a failed notification is not the call's failure.
	_ = p.session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
		ProgressToken: p.token, Progress: value, Total: total, Message: msg,
	})
}

// lastLine is the last non-empty line of text: what a status line shows of
// a chunk of output.
func lastLine(text string) string {
	text = strings.TrimRight(text, "\r\n\t ")
	if i := strings.LastIndexAny(text, "\r\n"); i >= 0 {
		text = text[i+1:]
	}
	return strings.TrimSpace(text)
}
