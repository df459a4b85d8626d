package bench

// `airlock bench templates`, its build half: the same three-step template
// (a RUN that writes a file, a COPY of a small file, an ENV) built through
// `airlock template build`'s path (template.Store.Build with a Dockerfile and
// a context directory) and through the E2B template build API (the Go client
// speaking the SDK's protocol, polling the status every 200 ms as the SDK
// does and every 10 ms to show the server's own cost, and the npm SDK itself
// when node and its node_modules are there), cold and cached, interleaved so
// that load drifting on a shared machine hits every path alike.
//
// Cold means no layer of the template is cached: every cold build writes a
// fresh nonce in its RUN (the first step, so every layer key after it
// changes too) and in its COPY's file (so the API path uploads it again).
// Cached means the identical template built again.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/e2bclient"
	"github.com/airlock-sandbox/airlock/internal/template"
)

// BuildsConfig says what to measure and on which server.
type BuildsConfig struct {
	// APIURL and APIKey reach the server's E2B API.
	APIURL, APIKey string
	// Store is the server's template store: `airlock template build` is
	// Store.Build on it.
	Store *template.Store
	// Base is the template the three steps start from.
	Base string
	// Iterations is how many cold and how many cached builds each path
	// makes (one more of each is made first, untimed, as a warm-up).
	Iterations int
	// SDKDir holds node_modules/e2b (tests/sdk); empty, or no node on PATH,
	// leaves the npm SDK rows out with a note saying why.
	SDKDir   string
	Progress io.Writer
}

// Targets of issue 15: what the API path may add to `airlock template build`.
const (
	targetColdAddedPct = 10
	targetCachedAdded  = time.Second
)

// The template names each path builds (and replaces at every build).
const (
	benchTplCLI    = "bench-build-cli"
	benchTplGo     = "bench-build-api-go"
	benchTplGoFast = "bench-build-api-go-fastpoll"
	benchTplNode   = "bench-build-api-node"
)

// buildPath is one way of building the template: build makes it with the
// given nonce and returns how long the client waited.
type buildPath struct {
	name  string
	build func(ctx context.Context, nonce string) (time.Duration, error)
	// skip, when not empty, says why the path is not measured.
	skip string
}

// TemplateBuilds measures every path and returns the rows, cold first.
func TemplateBuilds(ctx context.Context, cfg BuildsConfig) ([]Row, error) {
	if cfg.Iterations < 1 {
		return nil, errors.New("template builds: iterations must be at least 1")
	}
	work, err := os.MkdirTemp("", "airlock-bench-build-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	client := e2bclient.New(e2bclient.Config{APIURL: cfg.APIURL, APIKey: cfg.APIKey, SandboxURL: "http://unused.invalid"})

	paths := []buildPath{
		{name: "airlock template build (Store.Build, Dockerfile)", build: func(ctx context.Context, nonce string) (time.Duration, error) {
			return buildWithStore(ctx, cfg.Store, cfg.Base, filepath.Join(work, "cli-"+nonce), nonce)
		}},
		{name: "E2B API, Go client (e2bclient), 200 ms polls", build: func(ctx context.Context, nonce string) (time.Duration, error) {
			return buildWithAPI(ctx, client, benchTplGo, cfg.Base, nonce, 0)
		}},
		// The SDK polls the status every 200 ms, so its wait ends up to 200
		// ms after the build does; polling every 10 ms shows what the API
		// path itself adds (requests, upload, the job, the status).
		{name: "E2B API, Go client (e2bclient), 10 ms polls", build: func(ctx context.Context, nonce string) (time.Duration, error) {
			return buildWithAPI(ctx, client, benchTplGoFast, cfg.Base, nonce, 10*time.Millisecond)
		}},
	}
	node := buildPath{name: "E2B API, npm e2b Template.build"}
	if reason := nodeSDKMissing(cfg.SDKDir); reason != "" {
		node.skip = reason
	} else {
		script := filepath.Join(work, "build.cjs")
		if err := os.WriteFile(script, []byte(nodeBuildScript), 0o644); err != nil {
			return nil, err
		}
		w, err := startNodeWorker(ctx, cfg, script)
		if err != nil {
			return nil, err
		}
		defer w.close()
		node.build = func(_ context.Context, nonce string) (time.Duration, error) {
			return w.build(cfg, filepath.Join(work, "node-"+nonce), nonce)
		}
	}
	paths = append(paths, node)
	defer cleanupBuilds(context.WithoutCancel(ctx), cfg.Store, client)

	cold := make([]Row, len(paths))
	cached := make([]Row, len(paths))
	for i, p := range paths {
		cold[i] = Row{Name: "cold build: " + p.name, Note: p.skip}
		cached[i] = Row{Name: "cached build: " + p.name, Note: p.skip}
	}
	progress := func(format string, a ...any) {
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, format+"\n", a...)
		}
	}
	// Each phase starts with an untimed build per path: before the cold
	// ones, the warm-up (the build sandbox's first start, the page cache);
	// before the cached ones, the build that fills the cache (the cold
	// builds replaced the template, so its layers may have been collected).
	prime := func(what, nonce string) error {
		for _, p := range paths {
			if p.skip != "" {
				continue
			}
			if _, err := p.build(ctx, nonce); err != nil {
				return fmt.Errorf("%s, %s: %w", what, p.name, err)
			}
		}
		return nil
	}
	if err := prime("warm-up", newNonce()); err != nil {
		return nil, err
	}
	for it := 0; it < cfg.Iterations; it++ {
		for i, p := range paths {
			if p.skip != "" {
				continue
			}
			d, err := p.build(ctx, newNonce())
			if err != nil {
				return nil, fmt.Errorf("cold build %d, %s: %w", it+1, p.name, err)
			}
			cold[i].Samples = append(cold[i].Samples, d)
		}
		progress("template builds: cold %d/%d", it+1, cfg.Iterations)
	}
	fixed := newNonce()
	if err := prime("filling the cache", fixed); err != nil {
		return nil, err
	}
	for it := 0; it < cfg.Iterations; it++ {
		for i, p := range paths {
			if p.skip != "" {
				continue
			}
			d, err := p.build(ctx, fixed)
			if err != nil {
				return nil, fmt.Errorf("cached build %d, %s: %w", it+1, p.name, err)
			}
			cached[i].Samples = append(cached[i].Samples, d)
		}
		progress("template builds: cached %d/%d", it+1, cfg.Iterations)
	}
	for i := 1; i < len(paths); i++ {
		if paths[i].skip != "" {
			continue
		}
		cold[i].Note = AddedNote(cold[i].Samples, cold[0].Samples, true)
		cached[i].Note = AddedNote(cached[i].Samples, cached[0].Samples, false)
	}
	return append(cold, cached...), nil
}

// AddedNote says what a path adds to `airlock template build`'s p50, against
// issue 15's target: ≤ 10% cold, ≤ 1 s cached.
func AddedNote(s, base []time.Duration, cold bool) string {
	p, b := p50(s), p50(base)
	if b <= 0 {
		return ""
	}
	added := p - b
	pct := 100 * float64(added) / float64(b)
	if cold {
		return fmt.Sprintf("adds %+.0f ms (%+.1f%%) to template build; target <= %d%%: %s",
			float64(added)/float64(time.Millisecond), pct, targetColdAddedPct, metOrMissed(pct <= targetColdAddedPct))
	}
	return fmt.Sprintf("adds %+.0f ms to template build; target <= %v: %s",
		float64(added)/float64(time.Millisecond), targetCachedAdded, metOrMissed(added <= targetCachedAdded))
}

func metOrMissed(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

func p50(x []time.Duration) time.Duration {
	x = append([]time.Duration(nil), x...)
	sort.Slice(x, func(i, j int) bool { return x[i] < x[j] })
	return Percentile(x, 50)
}

func newNonce() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// The three steps, the same on every path. The RUN comes first so that a
// new nonce changes every layer key; it writes under /tmp so that it runs
// as whichever user the base template leaves in effect.
func runCmd(nonce string) string   { return "echo " + nonce + " > /tmp/bench-run" }
func fileBody(nonce string) []byte { return []byte("bench file " + nonce + "\n") }

const (
	benchFile     = "bench.txt"
	benchFileDest = "/opt/bench.txt"
	benchEnv      = "BENCH_NONCE"
)

// buildWithStore is `airlock template build` of a context directory holding
// the Dockerfile and the file: what the CLI does after reading its flags.
func buildWithStore(ctx context.Context, st *template.Store, base, dir, nonce string) (time.Duration, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	dockerfile := fmt.Sprintf("FROM %s\nRUN %s\nCOPY %s %s\nENV %s=%s\n", base, runCmd(nonce), benchFile, benchFileDest, benchEnv, nonce)
	df := filepath.Join(dir, "Dockerfile")
	if err := os.WriteFile(df, []byte(dockerfile), 0o644); err != nil {
		return 0, err
	}
	if err := os.WriteFile(filepath.Join(dir, benchFile), fileBody(nonce), 0o644); err != nil {
		return 0, err
	}
	start := time.Now()
	_, err := st.Build(ctx, template.BuildRequest{
		Name: benchTplCLI, Dockerfile: []byte(dockerfile), DockerfilePath: df, ContextDir: dir, Replace: true,
	}, io.Discard)
	return time.Since(start), err
}

// buildWithAPI is Template.build over the wire, through e2bclient.
func buildWithAPI(ctx context.Context, c *e2bclient.Client, name, base, nonce string, poll time.Duration) (time.Duration, error) {
	start := time.Now()
	_, err := c.BuildTemplate(ctx, e2bclient.TemplateBuild{
		Request:      e2bclient.TemplateBuildRequest{Name: name},
		PollInterval: poll,
		Spec: e2bclient.TemplateSpec{FromTemplate: base, Steps: []e2bclient.TemplateStep{
			{Type: "RUN", Args: []string{runCmd(nonce)}},
			{Type: "COPY", Args: []string{benchFile, benchFileDest}},
			{Type: "ENV", Args: []string{benchEnv, nonce}},
		}},
		Files: map[string][]e2bclient.TemplateFile{benchFile: {{Name: benchFile, Mode: 0o644, Content: fileBody(nonce)}}},
	})
	return time.Since(start), err
}

// nodeSDKMissing says why the npm SDK rows cannot run, or "".
func nodeSDKMissing(dir string) string {
	if dir == "" {
		return "skipped: no --sdk-dir"
	}
	if _, err := exec.LookPath("node"); err != nil {
		return "skipped: node is not installed"
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "e2b", "package.json")); err != nil {
		return fmt.Sprintf("skipped: no npm e2b in %s/node_modules (npm ci there)", dir)
	}
	return ""
}

// nodeBuildScript is a worker that builds the template with the npm SDK
// once per line of JSON arguments on stdin and answers each with a line of
// JSON on stdout: how long Template.build took, or the error. One worker
// serves every build of the run, so that node's start and the SDK's first
// loads (paid once per script by a user too) count in the warm-up and not
// in the figures, as the Go client's are. It loads e2b from the SDK
// directory given to it, as the script lives elsewhere.
const nodeBuildScript = `
const { createRequire } = require('node:module')
const path = require('node:path')
const readline = require('node:readline')
const { Template } = createRequire(path.join(process.argv[2], 'package.json'))('e2b')
const rl = readline.createInterface({ input: process.stdin })
let queue = Promise.resolve()
rl.on('line', (line) => {
  queue = queue.then(async () => {
    const a = JSON.parse(line)
    const t = Template({ fileContextPath: a.ctxDir }).fromTemplate(a.base)
      .runCmd(a.runCmd).copy(a.file, a.dest).setEnvs({ [a.envKey]: a.nonce })
    const start = performance.now()
    try {
      await Template.build(t, a.name)
      console.log(JSON.stringify({ ms: performance.now() - start }))
    } catch (err) {
      console.log(JSON.stringify({ error: String((err && err.stack) || err) }))
    }
  })
})
`

// nodeWorker is the running nodeBuildScript.
type nodeWorker struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	out    *bufio.Scanner
	stderr bytes.Buffer
}

func startNodeWorker(ctx context.Context, cfg BuildsConfig, script string) (*nodeWorker, error) {
	sdk, err := filepath.Abs(cfg.SDKDir)
	if err != nil {
		return nil, err
	}
	w := &nodeWorker{cmd: exec.CommandContext(ctx, "node", script, sdk)}
	w.cmd.Env = append(os.Environ(), "E2B_API_URL="+cfg.APIURL, "E2B_API_KEY="+cfg.APIKey)
	w.cmd.Stderr = &w.stderr
	if w.stdin, err = w.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := w.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	w.out = bufio.NewScanner(stdout)
	w.out.Buffer(make([]byte, 64<<10), 1<<20)
	if err := w.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start node: %w", err)
	}
	return w, nil
}

// close ends the worker (its stdin closed, it exits once idle) and waits.
func (w *nodeWorker) close() {
	_ = w.stdin.Close()
	_ = w.cmd.Wait()
}

// build runs the npm SDK's Template.build in the worker.
func (w *nodeWorker) build(cfg BuildsConfig, dir, nonce string) (time.Duration, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	if err := os.WriteFile(filepath.Join(dir, benchFile), fileBody(nonce), 0o644); err != nil {
		return 0, err
	}
	req, _ := json.Marshal(map[string]string{
		"ctxDir": dir, "base": cfg.Base, "name": benchTplNode, "nonce": nonce,
		"runCmd": runCmd(nonce), "file": benchFile, "dest": benchFileDest, "envKey": benchEnv,
	})
	if _, err := w.stdin.Write(append(req, '\n')); err != nil {
		return 0, fmt.Errorf("node Template.build: write to the worker: %w: %s", err, strings.TrimSpace(w.stderr.String()))
	}
	if !w.out.Scan() {
		return 0, fmt.Errorf("node Template.build: the worker ended (%v): %s", w.out.Err(), strings.TrimSpace(w.stderr.String()))
	}
	var out struct {
		MS    float64
		Error string
	}
	if err := json.Unmarshal(w.out.Bytes(), &out); err != nil {
		return 0, fmt.Errorf("node Template.build: read its answer %q: %w", w.out.Text(), err)
	}
	if out.Error != "" {
		return 0, fmt.Errorf("node Template.build: %s", out.Error)
	}
	return time.Duration(out.MS * float64(time.Millisecond)), nil
}

// cleanupBuilds removes the bench's templates (and so their layers); best
// effort, as a template the run never got to build is not there.
func cleanupBuilds(ctx context.Context, st *template.Store, c *e2bclient.Client) {
	_ = st.Remove(ctx, benchTplCLI, nil)
	_ = c.DeleteTemplate(ctx, benchTplGo)
	_ = c.DeleteTemplate(ctx, benchTplGoFast)
	_ = c.DeleteTemplate(ctx, benchTplNode)
}
