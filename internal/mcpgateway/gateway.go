package mcpgateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Gateway is one MCP server that aggregates the configured servers: it is a
// client of each (over stdio) and registers their tools and prompts under
// prefixed names, and their resources under their own URIs, on one
// mcp.Server that HTTP clients reach.
type Gateway struct {
	opts   *Options
	log    *slog.Logger
	server *mcp.Server
	ups    []*upstream

	mu sync.Mutex
	// owners maps a resource URI or URI template to the server that
	// registered it first: two servers cannot both serve one URI.
	owners map[string]*upstream

	progressSeq atomic.Uint64
	progress    sync.Map // downstream progress token (string) -> *progressRoute
}

// progressRoute is where a downstream server's progress notifications for
// one tool call go: the calling client's session and its own token.
type progressRoute struct {
	ctx   context.Context // the call's: notifications are sent on its stream
	ss    *mcp.ServerSession
	token any
	last  atomic.Int64 // when a notification was last forwarded (Unix ns)
}

// The go-sdk's client hands a server's notifications to its handler from a
// queue, while the call's response goes straight to the caller: a
// notification written before the result can reach forwardProgress after
// CallTool returned, when the caller's stream is closed and it would be
// lost. So a call with a progress token waits, after its result, until no
// notification came for progressQuiet (at most progressLinger).
const (
	progressQuiet  = 20 * time.Millisecond
	progressLinger = 250 * time.Millisecond
)

// NewGateway prepares a gateway for the checked servers; Start starts them.
func NewGateway(specs []*serverSpec, o *Options, log *slog.Logger) *Gateway {
	g := &Gateway{opts: o, log: log, owners: map[string]*upstream{}}
	g.server = mcp.NewServer(&mcp.Implementation{Name: "airlock-mcp-gateway", Title: "Airlock MCP gateway", Version: Version}, &mcp.ServerOptions{
		Logger: log,
		// Tools always, so a client sees the capability while servers
		// restart; prompts and resources follow what is registered.
		Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{ListChanged: true}},
	})
	for _, s := range specs {
		g.ups = append(g.ups, newUpstream(g, s))
	}
	return g
}

// Start starts every server at once, each to its first initialize and
// feature lists. The first failure stops the others and is returned.
func (g *Gateway) Start(ctx context.Context) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
	)
	for _, u := range g.ups {
		wg.Go(func() {
			if err := u.startFirst(ctx); err != nil {
				// The first failure is the one to report; the others
				// are mostly the interruption it caused.
				mu.Lock()
				if first == nil {
					first = err
					cancel(errors.New("another MCP server failed to start"))
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if first != nil {
		g.Close()
		return first
	}
	return nil
}

// Close stops every server.
func (g *Gateway) Close() {
	var wg sync.WaitGroup
	for _, u := range g.ups {
		wg.Go(u.close)
	}
	wg.Wait()
}

// Server is the aggregate MCP server.
func (g *Gateway) Server() *mcp.Server { return g.server }

// baseEnv is the servers' environment before their own variables: the
// gateway's, without the gateway's own token, which is no business of
// theirs.
func (g *Gateway) baseEnv() []string {
	return slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "GATEWAY_ACCESS_TOKEN=")
	})
}

// featureNames is what one server has registered on the gateway's server.
type featureNames struct {
	tools, prompts, resources, templates []string
}

// refresh lists the server's tools, prompts, resources and resource
// templates over sess and registers them on the gateway's server, removing
// what the server no longer has.
func (u *upstream) refresh(ctx context.Context, sess *mcp.ClientSession) error {
	u.refreshMu.Lock()
	defer u.refreshMu.Unlock()
	g, p := u.g, u.spec.Prefix
	caps := &mcp.ServerCapabilities{}
	if r := sess.InitializeResult(); r != nil && r.Capabilities != nil {
		caps = r.Capabilities
	}
	var next featureNames

	if caps.Tools != nil {
		var tools []*mcp.Tool
		for t, err := range sess.Tools(ctx, nil) {
			if err != nil {
				return fmt.Errorf("tools/list: %w", err)
			}
			tools = append(tools, t)
		}
		for _, t := range tools {
			pt := *t
			pt.Name = p + "_" + t.Name
			if pt.InputSchema == nil {
				pt.InputSchema = map[string]any{"type": "object"}
			}
			if err := addSafely(func() { g.server.AddTool(&pt, u.callTool(t.Name)) }); err != nil {
				u.log.Warn("tool not served: the gateway's server refused it", "tool", t.Name, "err", err)
				continue
			}
			next.tools = append(next.tools, pt.Name)
		}
	}
	if caps.Prompts != nil {
		var prompts []*mcp.Prompt
		for pr, err := range sess.Prompts(ctx, nil) {
			if err != nil {
				return fmt.Errorf("prompts/list: %w", err)
			}
			prompts = append(prompts, pr)
		}
		for _, pr := range prompts {
			pp := *pr
			pp.Name = p + "_" + pr.Name
			g.server.AddPrompt(&pp, u.getPrompt(pr.Name))
			next.prompts = append(next.prompts, pp.Name)
		}
	}
	if caps.Resources != nil {
		var resources []*mcp.Resource
		for r, err := range sess.Resources(ctx, nil) {
			if err != nil {
				return fmt.Errorf("resources/list: %w", err)
			}
			resources = append(resources, r)
		}
		var templates []*mcp.ResourceTemplate
		for t, err := range sess.ResourceTemplates(ctx, nil) {
			if err != nil {
				// Optional for a server with resources: an old server may
				// not know the method.
				u.log.Info("resources/templates/list failed; serving its resources without templates", "err", err)
				break
			}
			templates = append(templates, t)
		}
		for _, r := range resources {
			if !g.claim(r.URI, u) {
				u.log.Warn("resource not served: another server has the URI", "uri", r.URI)
				continue
			}
			rc := *r
			if err := addSafely(func() { g.server.AddResource(&rc, u.readResource) }); err != nil {
				u.log.Warn("resource not served", "uri", r.URI, "err", err)
				g.release([]string{r.URI}, u)
				continue
			}
			next.resources = append(next.resources, r.URI)
		}
		for _, t := range templates {
			if !g.claim(t.URITemplate, u) {
				u.log.Warn("resource template not served: another server has it", "uriTemplate", t.URITemplate)
				continue
			}
			tc := *t
			if err := addSafely(func() { g.server.AddResourceTemplate(&tc, u.readResource) }); err != nil {
				u.log.Warn("resource template not served", "uriTemplate", t.URITemplate, "err", err)
				g.release([]string{t.URITemplate}, u)
				continue
			}
			next.templates = append(next.templates, t.URITemplate)
		}
	}

	old := u.features
	g.server.RemoveTools(stale(old.tools, next.tools)...)
	g.server.RemovePrompts(stale(old.prompts, next.prompts)...)
	if gone := stale(old.resources, next.resources); len(gone) > 0 {
		g.server.RemoveResources(gone...)
		g.release(gone, u)
	}
	if gone := stale(old.templates, next.templates); len(gone) > 0 {
		g.server.RemoveResourceTemplates(gone...)
		g.release(gone, u)
	}
	u.mu.Lock()
	u.features = next
	u.mu.Unlock()
	u.log.Info("server features registered", "tools", len(next.tools), "prompts", len(next.prompts), "resources", len(next.resources), "resource_templates", len(next.templates))
	return nil
}

// addSafely runs an Add of the SDK's server, which panics on what it cannot
// serve (an input schema that is not an object, a malformed URI): one bad
// feature of a server must not take the gateway down.
func addSafely(add func()) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("%v", v)
		}
	}()
	add()
	return nil
}

// stale is what was in old and is not in next.
func stale(old, next []string) []string {
	var out []string
	for _, n := range old {
		if !slices.Contains(next, n) {
			out = append(out, n)
		}
	}
	return out
}

func (g *Gateway) claim(uri string, u *upstream) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if o, ok := g.owners[uri]; ok && o != u {
		return false
	}
	g.owners[uri] = u
	return true
}

func (g *Gateway) release(uris []string, u *upstream) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, uri := range uris {
		if g.owners[uri] == u {
			delete(g.owners, uri)
		}
	}
}

// callTool forwards a call of one of the server's tools under its own name.
// A result comes back as the server sent it (isError stays isError), cut to
// MaxResultBytes; a protocol error the server answered stays a protocol
// error; a server that is down or dies during the call is an isError result
// that says so, which a model can act on.
func (u *upstream) callTool(name string) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		sess, why := u.session()
		if sess == nil {
			return errorResult(why), nil
		}
		params := &mcp.CallToolParams{Name: name}
		if len(req.Params.Arguments) > 0 {
			params.Arguments = req.Params.Arguments
		}
		if tok := req.Params.GetProgressToken(); tok != nil && req.Session != nil {
			id, done := u.g.routeProgress(ctx, req.Session, tok)
			defer done()
			params.SetProgressToken(id)
		}
		res, err := sess.CallTool(ctx, params)
		if err != nil {
			var werr *jsonrpc.Error
			switch {
			case errors.As(err, &werr):
				return nil, werr
			case ctx.Err() != nil:
				return nil, ctx.Err()
			}
			msg := fmt.Sprintf("MCP server %q failed during the call (%v)", u.spec.Key, err)
			if why := u.downReason(sess); why != "" {
				msg += "; " + why
			}
			return errorResult(msg), nil
		}
		return truncateResult(res, u.g.opts.MaxResultBytes), nil
	}
}

// getPrompt forwards prompts/get under the prompt's own name.
func (u *upstream) getPrompt(name string) mcp.PromptHandler {
	return func(ctx context.Context, req *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
		sess, why := u.session()
		if sess == nil {
			return nil, errors.New(why)
		}
		res, err := sess.GetPrompt(ctx, &mcp.GetPromptParams{Name: name, Arguments: req.Params.Arguments})
		return res, forwardErr(u, err)
	}
}

// readResource forwards resources/read to the server that listed the URI
// (or the template it matched): the SDK's server routes by registration.
func (u *upstream) readResource(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	sess, why := u.session()
	if sess == nil {
		return nil, errors.New(why)
	}
	res, err := sess.ReadResource(ctx, &mcp.ReadResourceParams{URI: req.Params.URI})
	return res, forwardErr(u, err)
}

// forwardErr keeps a server's JSON-RPC error as it sent it and names the
// server in any other failure.
func forwardErr(u *upstream, err error) error {
	if err == nil {
		return nil
	}
	var werr *jsonrpc.Error
	if errors.As(err, &werr) {
		return werr
	}
	return fmt.Errorf("MCP server %q: %w", u.spec.Key, err)
}

func errorResult(msg string) *mcp.CallToolResult {
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: msg}}}
}

// routeProgress gives a tool call a token of the gateway's own for the
// downstream server (tokens of different clients may collide), and routes
// that server's progress notifications for it back to the caller until done.
func (g *Gateway) routeProgress(ctx context.Context, ss *mcp.ServerSession, token any) (string, func()) {
	id := fmt.Sprintf("gw-%d", g.progressSeq.Add(1))
	route := &progressRoute{ctx: ctx, ss: ss, token: token}
	g.progress.Store(id, route)
	return id, func() {
		returned := time.Now()
		for time.Since(returned) < progressLinger && ctx.Err() == nil {
			last := time.Unix(0, route.last.Load())
			if time.Since(returned) >= progressQuiet && time.Since(last) >= progressQuiet {
				break
			}
			time.Sleep(progressQuiet / 4)
		}
		g.progress.Delete(id)
	}
}

// forwardProgress sends a downstream progress notification to the client
// whose call it belongs to, with the client's token.
func (g *Gateway) forwardProgress(p *mcp.ProgressNotificationParams) {
	id, ok := p.ProgressToken.(string)
	if !ok {
		return
	}
	v, ok := g.progress.Load(id)
	if !ok {
		return
	}
	route := v.(*progressRoute)
	fwd := *p
	fwd.ProgressToken = route.token
	route.last.Store(time.Now().UnixNano())
	if err := route.ss.NotifyProgress(route.ctx, &fwd); err != nil {
		g.log.Debug("forwarding a progress notification failed", "err", err)
	}
}

// truncateResult cuts a tool result whose content exceeds limit bytes (text
// by its UTF-8 bytes, images, audio and blobs by their size): blocks are
// kept in order while they fit, the text block that crosses the limit is
// cut, later blocks are dropped, and a text block saying how much was
// omitted is appended. Structured content whose JSON exceeds the limit has
// its longest strings cut (cutStructured), which keeps it valid for the
// tool's output schema: clients refuse a result of a tool with an output
// schema that lacks structured content.
func truncateResult(res *mcp.CallToolResult, limit int) *mcp.CallToolResult {
	if res == nil || limit <= 0 {
		return res
	}
	total := 0
	for _, c := range res.Content {
		total += contentSize(c)
	}
	structured := 0
	if res.StructuredContent != nil {
		if b, err := json.Marshal(res.StructuredContent); err == nil {
			structured = len(b)
		}
	}
	if total <= limit && structured <= limit {
		return res
	}
	out := *res
	out.Content = nil
	used, omitted := 0, 0
	for _, c := range res.Content {
		n := contentSize(c)
		switch {
		case used+n <= limit:
			out.Content = append(out.Content, c)
			used += n
		case used < limit:
			if cut, kept := cutText(c, limit-used); cut != nil {
				out.Content = append(out.Content, cut)
				used += kept
				omitted += n - kept
				continue
			}
			omitted += n
		default:
			omitted += n
		}
	}
	var notes []string
	if omitted > 0 {
		notes = append(notes, fmt.Sprintf("%d of its %d bytes of content were omitted", omitted, total))
	}
	if structured > limit {
		if v, n, ok := cutStructured(res.StructuredContent, limit); ok {
			out.StructuredContent = v
			notes = append(notes, fmt.Sprintf("its structured content's strings were cut by %d bytes", n))
		} else {
			out.StructuredContent = nil
			notes = append(notes, fmt.Sprintf("its structured content (%d bytes of JSON) was dropped", structured))
		}
	}
	out.Content = append(out.Content, &mcp.TextContent{Text: fmt.Sprintf(
		"[mcp-gateway: this tool result was cut: %s; the gateway passes at most %d bytes of content per tool result]",
		strings.Join(notes, "; "), limit)})
	return &out
}

// cutMark ends a string of structured content that was cut.
const cutMark = "…[cut by mcp-gateway]"

// cutStructured returns a copy of a structured value whose JSON fits in
// limit bytes, made by cutting its longest strings (at character
// boundaries, each ending with cutMark), and how many bytes were cut; ok is
// false when cutting strings is not enough (a huge array of small values).
func cutStructured(v any, limit int) (any, int, bool) {
	var b []byte
	var err error
	if b, err = json.Marshal(v); err != nil {
		return nil, 0, false
	}
	// A copy made of plain JSON values (maps, slices, strings), to edit.
	var c any
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, 0, false
	}
	cut := 0
	for range 4 { // JSON escapes make a pass's estimate short; a few settle it
		excess := len(b) - limit
		if excess <= 0 {
			break
		}
		var leaves []*string
		collectStrings(&c, &leaves)
		slices.SortStableFunc(leaves, func(a, b *string) int { return len(*b) - len(*a) })
		for _, p := range leaves {
			if excess <= 0 {
				break
			}
			if len(*p) <= len(cutMark) {
				break // sorted: the rest are as short
			}
			keep := max(0, len(*p)-excess-len(cutMark))
			before := len(*p)
			*p = cutUTF8(*p, keep) + cutMark
			excess -= before - len(*p)
			cut += before - len(*p)
		}
		if b, err = json.Marshal(c); err != nil {
			return nil, 0, false
		}
	}
	if len(b) > limit {
		return nil, 0, false
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, 0, false
	}
	return out, cut, true
}

// collectStrings appends a pointer to every string in a JSON value,
// replacing each string in the value by its pointer (json.Marshal writes
// the same JSON for both).
func collectStrings(v *any, out *[]*string) {
	switch x := (*v).(type) {
	case string:
		p := new(string)
		*p = x
		*v = p // marshals as the string it points to
		*out = append(*out, p)
	case *string:
		*out = append(*out, x)
	case map[string]any:
		for k, e := range x {
			collectStrings(&e, out)
			x[k] = e
		}
	case []any:
		for i := range x {
			collectStrings(&x[i], out)
		}
	}
}

// contentSize is what a content block counts against the limit.
func contentSize(c mcp.Content) int {
	switch c := c.(type) {
	case *mcp.TextContent:
		return len(c.Text)
	case *mcp.ImageContent:
		return len(c.Data)
	case *mcp.AudioContent:
		return len(c.Data)
	case *mcp.EmbeddedResource:
		if c.Resource != nil {
			return len(c.Resource.Text) + len(c.Resource.Blob)
		}
	}
	return 0
}

// cutText returns a copy of a text block (or an embedded text resource)
// holding its first max bytes, cut at a character boundary; nil for a block
// that cannot be cut.
func cutText(c mcp.Content, max int) (mcp.Content, int) {
	switch c := c.(type) {
	case *mcp.TextContent:
		cc := *c
		cc.Text = cutUTF8(c.Text, max)
		return &cc, len(cc.Text)
	case *mcp.EmbeddedResource:
		if c.Resource == nil || c.Resource.Text == "" {
			return nil, 0
		}
		rc := *c.Resource
		rc.Text = cutUTF8(rc.Text, max)
		cc := *c
		cc.Resource = &rc
		return &cc, len(rc.Text)
	}
	return nil, 0
}

func cutUTF8(s string, max int) string {
	if len(s) <= max {
		return s
	}
	// s[max] is the first byte left out; back up to a character's start so
	// that no character is cut in two.
	for max > 0 && !utf8.RuneStart(s[max]) {
		max--
	}
	return s[:max]
}
