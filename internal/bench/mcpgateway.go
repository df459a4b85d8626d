package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/api/gen/process"
	"github.com/airlock-sandbox/airlock/internal/e2bclient"
	"github.com/airlock-sandbox/airlock/internal/e2bwire"
)

// MCPGatewayConfig measures the in-sandbox MCP gateway (internal/mcpgateway)
// against the same stdio server called directly inside the sandbox.
type MCPGatewayConfig struct {
	Config
	// Creates is how many "create with an mcp config to first tool call"
	// rounds run (each against a plain create + first commands.run);
	// Config.RoundTrips is the number of tool calls per series.
	Creates int
}

// gatewayServer is the catalog server every series calls: the reference
// "everything" server's echo tool, a round trip with no work in it.
const (
	gatewayConfig = `{"everything":{}}`
	gatewayTool   = "everything_echo"
	// catalogSDK is the TypeScript MCP SDK the mcp-gateway template's
	// catalog servers bring; the in-sandbox client below uses it.
	catalogSDK = "/opt/mcp-gateway/servers/node_modules/@modelcontextprotocol/sdk/dist/esm/client"
	// everythingBin is the catalog's everything server, as the gateway runs it.
	everythingBin = "/opt/mcp-gateway/servers/node_modules/.bin/mcp-server-everything"
)

// inSandboxClient times n echo calls from inside the sandbox with the
// official TypeScript client: over stdio to a server it spawns (argv[2] =
// "stdio"), or over streamable HTTP to the gateway on localhost:50005
// ("gateway", token in GATEWAY_ACCESS_TOKEN). It prints one JSON array of
// milliseconds; the first 20 calls warm up and are not printed.
const inSandboxClient = `
const [mode, n, tool] = [process.argv[2], Number(process.argv[3]), process.argv[4]]
const { Client } = await import('` + catalogSDK + `/index.js')
if (mode === 'startup') {
  // Spawn the server and initialize, n times: the floor of the gateway's start.
  const { StdioClientTransport } = await import('` + catalogSDK + `/stdio.js')
  const out = []
  for (let i = 0; i < n; i++) {
    const c = new Client({ name: 'airlock-bench', version: '0' })
    const t0 = performance.now()
    await c.connect(new StdioClientTransport({ command: '` + everythingBin + `', args: ['stdio'], stderr: 'ignore' }))
    out.push(performance.now() - t0)
    await c.close()
  }
  console.log(JSON.stringify(out))
  process.exit(0)
}
const client = new Client({ name: 'airlock-bench', version: '0' })
if (mode === 'stdio') {
  const { StdioClientTransport } = await import('` + catalogSDK + `/stdio.js')
  await client.connect(new StdioClientTransport({ command: '` + everythingBin + `', args: ['stdio'], stderr: 'ignore' }))
} else {
  const { StreamableHTTPClientTransport } = await import('` + catalogSDK + `/streamableHttp.js')
  const headers = { Authorization: 'Bearer ' + process.env.GATEWAY_ACCESS_TOKEN }
  await client.connect(new StreamableHTTPClientTransport(new URL('http://127.0.0.1:50005/mcp'), { requestInit: { headers } }))
}
const out = []
for (let i = 0; i < n + 20; i++) {
  const t0 = performance.now()
  const r = await client.callTool({ name: tool, arguments: { message: 'ping' } })
  if (r.isError) { console.error(JSON.stringify(r)); process.exit(1) }
  if (i >= 20) out.push(performance.now() - t0)
}
console.log(JSON.stringify(out))
await client.close()
process.exit(0)
`

// RunMCPGateway measures, in one run:
//   - create + first commands.run (the baseline) against create + start the
//     gateway with one catalog server + the first tool call through the
//     sandbox proxy, as Sandbox.create({mcp}) then an MCP client do;
//   - the tool-call round trip of the same echo tool: direct over stdio
//     inside the sandbox, through the gateway from inside the sandbox, and
//     through the gateway from the host over the sandbox proxy.
func RunMCPGateway(ctx context.Context, cfg MCPGatewayConfig) ([]Row, error) {
	c := newClient(cfg.Config)
	var rows []Row
	add := func(r Row) {
		rows = append(rows, r)
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, "measured %s (%d samples)\n", r.Name, len(r.Samples))
		}
	}
	// Warm-up: page cache for the template and node's modules.
	if _, _, err := c.gatewayTTI(ctx, true); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	plain := Row{Name: fmt.Sprintf("create %s + first commands.run (baseline)", cfg.Template)}
	withGateway := Row{Name: fmt.Sprintf("create %s + mcp-gateway --config + first tool call", cfg.Template)}
	for i := 0; i < cfg.Creates; i++ {
		d, err := c.createAndRun(ctx, nil)
		if err != nil {
			return nil, err
		}
		plain.Samples = append(plain.Samples, d)
		d, _, err = c.gatewayTTI(ctx, true)
		if err != nil {
			return nil, err
		}
		withGateway.Samples = append(withGateway.Samples, d)
	}
	add(plain)
	withGateway.Note = fmt.Sprintf("p50 +%.1f ms", p50diff(withGateway, plain))
	add(withGateway)

	_, g, err := c.gatewayTTI(ctx, false)
	if err != nil {
		return nil, err
	}
	defer g.close(ctx)
	startup, err := c.inSandboxCalls(ctx, g, "startup", max(cfg.Creates, 1))
	if err != nil {
		return nil, fmt.Errorf("server startups: %w", err)
	}
	add(Row{Name: "in the sandbox: spawn the everything server + initialize over stdio", Samples: startup,
		Note: "the floor of the gateway's start"})
	n := cfg.RoundTrips
	direct, err := c.inSandboxCalls(ctx, g, "stdio", n)
	if err != nil {
		return nil, fmt.Errorf("direct stdio calls: %w", err)
	}
	add(Row{Name: fmt.Sprintf("tool call, in the sandbox, stdio to the server (baseline), %d", n), Samples: direct})
	inside, err := c.inSandboxCalls(ctx, g, "gateway", n)
	if err != nil {
		return nil, fmt.Errorf("calls through the gateway in the sandbox: %w", err)
	}
	r := Row{Name: fmt.Sprintf("tool call, in the sandbox, through the gateway on :50005, %d", n), Samples: inside}
	r.Note = fmt.Sprintf("p50 +%.2f ms", p50diff(r, Row{Samples: direct}))
	add(r)
	host := Row{Name: fmt.Sprintf("tool call, from the host, sandbox proxy + gateway, %d", n)}
	for i := 0; i < n+20; i++ {
		start := time.Now()
		if err := g.call(ctx); err != nil {
			return nil, err
		}
		if i >= 20 {
			host.Samples = append(host.Samples, time.Since(start))
		}
	}
	host.Note = fmt.Sprintf("p50 +%.2f ms", p50diff(host, Row{Samples: direct}))
	add(host)
	return rows, nil
}

// gateway is a sandbox running the MCP gateway, with an MCP client session
// to it from the host through the sandbox proxy.
type gateway struct {
	c       *client
	sb      *e2bclient.Sandbox
	token   string
	session *mcp.ClientSession
}

func (g *gateway) call(ctx context.Context) error {
	res, err := g.session.CallTool(ctx, &mcp.CallToolParams{Name: gatewayTool, Arguments: map[string]any{"message": "ping"}})
	if err != nil {
		return fmt.Errorf("%s through the gateway: %w", gatewayTool, err)
	}
	if res.IsError {
		b, _ := json.Marshal(res.Content)
		return fmt.Errorf("%s through the gateway answered an error: %s", gatewayTool, b)
	}
	return nil
}

func (g *gateway) close(ctx context.Context) {
	if g.session != nil {
		_ = g.session.Close()
	}
	g.c.kill(context.WithoutCancel(ctx), g.sb)
}

// gatewayTTI creates a sandbox, starts the gateway as the SDKs do (root,
// GATEWAY_ACCESS_TOKEN, `mcp-gateway --config`), connects and makes the
// first tool call; the time to that answer is returned. With done, the
// sandbox is killed (not timed); else the caller owns g.
func (c *client) gatewayTTI(ctx context.Context, done bool) (_ time.Duration, _ *gateway, err error) {
	start := time.Now()
	sb, err := c.create(ctx)
	if err != nil {
		return 0, nil, err
	}
	tok := make([]byte, 16)
	_, _ = rand.Read(tok)
	g := &gateway{c: c, sb: sb, token: hex.EncodeToString(tok)}
	// Deferred, the kill is not timed: the duration is taken at the return.
	defer func() {
		if done || err != nil {
			g.close(ctx)
		}
	}()
	out, code, err := c.outputAs(ctx, sb.As("root"), map[string]string{"GATEWAY_ACCESS_TOKEN": g.token},
		"/bin/bash", "-l", "-c", "mcp-gateway --config '"+gatewayConfig+"'")
	if err != nil || code != 0 {
		return 0, nil, fmt.Errorf("mcp-gateway --config: exit %d, %v: %s", code, err, out)
	}
	base, err := c.c.SandboxURL(ctx)
	if err != nil {
		return 0, nil, err
	}
	hc := &http.Client{Transport: routeTo{sandbox: sb.ID(), port: "50005", token: g.token, next: http.DefaultTransport}}
	client := mcp.NewClient(&mcp.Implementation{Name: "airlock-bench", Version: "0"}, nil)
	g.session, err = client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: strings.TrimRight(base, "/") + "/mcp", HTTPClient: hc}, nil)
	if err != nil {
		return 0, nil, fmt.Errorf("connect to the gateway: %w", err)
	}
	if err := g.call(ctx); err != nil {
		return 0, nil, err
	}
	return time.Since(start), g, nil
}

// inSandboxCalls runs inSandboxClient in g's sandbox and returns its samples.
func (c *client) inSandboxCalls(ctx context.Context, g *gateway, mode string, n int) ([]time.Duration, error) {
	if err := g.sb.WriteFile(ctx, "/tmp/airlock-bench-mcp.mjs", strings.NewReader(inSandboxClient)); err != nil {
		return nil, err
	}
	tool := gatewayTool // the gateway's name for it
	if mode == "stdio" {
		tool = "echo"
	}
	out, code, err := c.outputAs(ctx, g.sb, map[string]string{"GATEWAY_ACCESS_TOKEN": g.token},
		"node", "/tmp/airlock-bench-mcp.mjs", mode, fmt.Sprint(n), tool)
	if err != nil || code != 0 {
		return nil, fmt.Errorf("in-sandbox client: exit %d, %v: %s", code, err, out)
	}
	var ms []float64
	line := out[strings.LastIndex(strings.TrimRight(out, "\n"), "\n")+1:]
	if err := json.Unmarshal([]byte(line), &ms); err != nil || len(ms) != n {
		return nil, fmt.Errorf("in-sandbox client printed %q: %v", out, err)
	}
	samples := make([]time.Duration, n)
	for i, v := range ms {
		samples[i] = time.Duration(v * float64(time.Millisecond))
	}
	return samples, nil
}

// outputAs runs a program (no shell) with envs and returns its stdout and
// stderr together, and its exit code.
func (c *client) outputAs(ctx context.Context, sb *e2bclient.Sandbox, envs map[string]string, cmd string, args ...string) (string, int32, error) {
	stream, err := sb.Start(ctx, &process.StartRequest{Process: &process.ProcessConfig{Cmd: cmd, Args: args, Envs: envs}})
	if err != nil {
		return "", 0, err
	}
	defer stream.Close()
	var out strings.Builder
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if d := ev.GetData(); d != nil {
			out.Write(d.GetStdout())
			out.Write(d.GetStderr())
		}
		if end := ev.GetEnd(); end != nil {
			for stream.Receive() { // to the end, as the SDKs read it (see run)
			}
			return out.String(), end.GetExitCode(), nil
		}
	}
	if err := stream.Err(); err != nil {
		return "", 0, err
	}
	return "", 0, fmt.Errorf("%s: stream ended without an end event", cmd)
}

// routeTo sends every request to one port of one sandbox through the
// sandbox proxy, with the gateway's bearer token: the plain-HTTP way of
// reaching getMcpUrl() (docs/E2B-WIRE.md §1.3).
type routeTo struct {
	sandbox, port, token string
	next                 http.RoundTripper
}

func (r routeTo) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Header.Set(e2bwire.HeaderSandboxID, r.sandbox)
	req.Header.Set(e2bwire.HeaderSandboxPort, r.port)
	req.Header.Set("Authorization", "Bearer "+r.token)
	return r.next.RoundTrip(req)
}
