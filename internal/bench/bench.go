// Package bench measures what users feel: time to interactive (create a sandbox,
// then the first command's result, over the same wire calls the E2B SDK makes)
// and the round trip of a trivial command, next to baselines measured in the
// same run on the same machine: plain fork+exec, and `runc run` on the same
// root filesystem.
package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"sort"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/airlock-sandbox/airlock/api/gen/process"
	"github.com/airlock-sandbox/airlock/internal/e2bclient"
	"github.com/airlock-sandbox/airlock/internal/e2bwire"
	"github.com/airlock-sandbox/airlock/internal/timing"
)

// Config says where the server is and how much to measure.
type Config struct {
	APIURL, SandboxURL, APIKey string
	Template                   string
	// Rootfs is the template's root filesystem, for the runc baseline.
	Rootfs string
	// Sequential and Concurrent are the numbers of creates measured one after
	// another and all at once; RoundTrips the number of commands in one sandbox.
	Sequential, Concurrent, RoundTrips int
	// Progress receives one line per finished measurement.
	Progress io.Writer
	// SetWarmPool sets the server's warm pool size for Template, and WarmCount
	// reports how many pooled sandboxes are ready; nil skips the warm series.
	SetWarmPool func(n int)
	WarmCount   func() int
	// NetRound sets up and tears down one sandbox network (netns, veth, nft
	// state) and returns how long each took; nil skips the network rows.
	NetRound func(ctx context.Context, i int) (setup, teardown time.Duration, err error)
	// CPUProfile, when set, receives a CPU profile of this process (the
	// server runs in it) taken during the sequential cold creates.
	CPUProfile io.Writer
}

// Row is one measured series.
type Row struct {
	Name    string
	Samples []time.Duration
	Note    string
	// Phases, for a series of creates, is where each sample's time went
	// (breakdown.go); empty for other series.
	Phases Phases
}

// Run performs every measurement and returns the rows in display order.
func Run(ctx context.Context, cfg Config) ([]Row, error) {
	c := newClient(cfg)
	var rows []Row
	add := func(r Row) {
		rows = append(rows, r)
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, "measured %s (%d samples)\n", r.Name, len(r.Samples))
		}
	}

	add(forkExec(cfg.RoundTrips))
	add(runcRun(ctx, cfg.Rootfs, min(cfg.Sequential, 30)))

	// Warm-up: the first create pays for page-cache misses of the template.
	if _, err := c.createAndRun(ctx, nil); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}

	warm := cfg.SetWarmPool != nil && cfg.WarmCount != nil
	if warm {
		cfg.SetWarmPool(0)
	}
	if cfg.CPUProfile != nil {
		if err := pprof.StartCPUProfile(cfg.CPUProfile); err != nil {
			return nil, fmt.Errorf("cpu profile: %w", err)
		}
	}
	r, err := c.sequential(ctx, "TTI cold: create + first commands.run", cfg.Sequential, nil)
	if cfg.CPUProfile != nil {
		pprof.StopCPUProfile()
	}
	if err != nil {
		return nil, err
	}
	add(r)
	if r, err = c.concurrent(ctx, "TTI cold: create + first commands.run", cfg.Concurrent); err != nil {
		return nil, err
	}
	add(r)
	if warm {
		fill := func() error {
			deadline := time.Now().Add(2 * time.Minute)
			for cfg.WarmCount() < cfg.Concurrent {
				if time.Now().After(deadline) {
					return errors.New("warm pool did not fill within 2 minutes")
				}
				time.Sleep(5 * time.Millisecond)
			}
			return nil
		}
		cfg.SetWarmPool(cfg.Concurrent)
		if r, err = c.sequential(ctx, "TTI warm pool: create + first commands.run", cfg.Sequential, fill); err != nil {
			return nil, err
		}
		add(r)
		if err := fill(); err != nil {
			return nil, err
		}
		if r, err = c.concurrent(ctx, fmt.Sprintf("TTI warm pool of %d: create + first commands.run", cfg.Concurrent), cfg.Concurrent); err != nil {
			return nil, err
		}
		add(r)
		cfg.SetWarmPool(0)
	}

	sb, err := c.create(ctx)
	if err != nil {
		return nil, err
	}
	defer c.kill(context.WithoutCancel(ctx), sb)
	if _, err := c.run(ctx, sb, "true"); err != nil {
		return nil, err
	}
	if cfg.NetRound != nil {
		n := max(min(cfg.Sequential, 50), 1)
		setup := Row{Name: fmt.Sprintf("sandbox network setup (netns+veth+nft, netlink), %d", n)}
		teardown := Row{Name: fmt.Sprintf("sandbox network teardown (off the request path), %d", n)}
		for i := 0; i < n; i++ {
			s, t, err := cfg.NetRound(ctx, i)
			if err != nil {
				return nil, err
			}
			setup.Samples = append(setup.Samples, s)
			teardown.Samples = append(teardown.Samples, t)
		}
		add(setup)
		add(teardown)
	}
	rt := Row{Name: fmt.Sprintf("commands.run('true') round trip, %d in one sandbox", cfg.RoundTrips)}
	for i := 0; i < cfg.RoundTrips; i++ {
		start := time.Now()
		if _, err := c.run(ctx, sb, "true"); err != nil {
			return nil, err
		}
		rt.Samples = append(rt.Samples, time.Since(start))
	}
	add(rt)
	return rows, nil
}

// sequential measures n creates one after another; before each, ready (if not
// nil) may wait for the server to be in the state being measured.
func (c *client) sequential(ctx context.Context, name string, n int, ready func() error) (Row, error) {
	r := Row{Name: fmt.Sprintf("%s, %d sequential", name, n)}
	for i := 0; i < n; i++ {
		if ready != nil {
			if err := ready(); err != nil {
				return r, err
			}
		}
		d, err := c.createAndRun(ctx, &r.Phases)
		if err != nil {
			return r, fmt.Errorf("%s: create %d: %w", name, i, err)
		}
		r.Samples = append(r.Samples, d)
	}
	return r, nil
}

// concurrent measures n creates started at once.
func (c *client) concurrent(ctx context.Context, name string, n int) (Row, error) {
	r := Row{Name: fmt.Sprintf("%s, %d concurrent", name, n)}
	var err error
	r.Samples, err = startAtOnce(ctx, n, func(int) *client { return c })
	if err != nil {
		return r, fmt.Errorf("%s: %w", name, err)
	}
	return r, nil
}

// startAtOnce starts n creates + first commands at once, the i-th through
// clientOf(i), and returns their times.
func startAtOnce(ctx context.Context, n int, clientOf func(i int) *client) ([]time.Duration, error) {
	var (
		mu      sync.Mutex
		wg      sync.WaitGroup
		errs    []error
		samples []time.Duration
	)
	for i := range n {
		c := clientOf(i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := c.createAndRun(ctx, nil)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			samples = append(samples, d)
		}()
	}
	wg.Wait()
	return samples, errors.Join(errs...)
}

// forkExec is the floor: starting /bin/true on the host with no isolation.
func forkExec(n int) Row {
	r := Row{Name: fmt.Sprintf("baseline: fork+exec /bin/true on the host, %d", n)}
	for i := 0; i < n; i++ {
		start := time.Now()
		if err := exec.Command("/bin/true").Run(); err != nil {
			r.Note = err.Error()
			return r
		}
		r.Samples = append(r.Samples, time.Since(start))
	}
	return r
}

// runcRun is the reference container runtime starting /bin/true on the same
// template root filesystem (read-only, its own namespaces and cgroup).
func runcRun(ctx context.Context, rootfs string, n int) Row {
	r := Row{Name: fmt.Sprintf("baseline: runc run /bin/true on the template rootfs, %d", n)}
	runc, err := exec.LookPath("runc")
	if err != nil {
		r.Note = "runc not installed"
		return r
	}
	bundle, err := os.MkdirTemp("", "airlock-bench-runc-")
	if err != nil {
		r.Note = err.Error()
		return r
	}
	defer os.RemoveAll(bundle)
	if out, err := exec.CommandContext(ctx, runc, "spec", "--bundle", bundle).CombinedOutput(); err != nil {
		r.Note = fmt.Sprintf("runc spec: %v: %s", err, out)
		return r
	}
	cfgPath := filepath.Join(bundle, "config.json")
	var spec map[string]any
	raw, _ := os.ReadFile(cfgPath)
	if err := json.Unmarshal(raw, &spec); err != nil {
		r.Note = err.Error()
		return r
	}
	spec["root"] = map[string]any{"path": rootfs, "readonly": true}
	proc := spec["process"].(map[string]any)
	proc["terminal"] = false
	proc["args"] = []string{"/bin/true"}
	linux := spec["linux"].(map[string]any)
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("airlock-bench-%d-%d", os.Getpid(), i)
		// Keep runc's cgroup under Airlock's own parent, like the sandboxes'.
		linux["cgroupsPath"] = "/airlock/" + id
		raw, _ = json.Marshal(spec)
		if err := os.WriteFile(cfgPath, raw, 0o644); err != nil {
			r.Note = err.Error()
			return r
		}
		start := time.Now()
		cmd := exec.CommandContext(ctx, runc, "run", "--bundle", bundle, id)
		out, err := cmd.CombinedOutput()
		if err != nil {
			r.Note = fmt.Sprintf("runc run: %v: %s", err, bytes.TrimSpace(out))
			_ = exec.Command(runc, "delete", "--force", id).Run()
			return r
		}
		r.Samples = append(r.Samples, time.Since(start))
	}
	return r
}

// Print writes rows as a table with p50, p99, mean and max in milliseconds.
func Print(w io.Writer, rows []Row) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "measurement\tn\tp50 ms\tp99 ms\tmean ms\tmax ms\t")
	for _, r := range rows {
		if len(r.Samples) == 0 {
			fmt.Fprintf(tw, "%s\t0\t-\t-\t-\t-\t  %s\n", r.Name, r.Note)
			continue
		}
		s := append([]time.Duration(nil), r.Samples...)
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		var sum time.Duration
		for _, d := range s {
			sum += d
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t  %s\n", r.Name, len(s),
			ms(Percentile(s, 50)), ms(Percentile(s, 99)), ms(sum/time.Duration(len(s))), ms(s[len(s)-1]), r.Note)
	}
	tw.Flush()
}

// Percentile of sorted samples, nearest-rank.
func Percentile(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := (p*len(sorted) + 99) / 100
	return sorted[min(max(i-1, 0), len(sorted)-1)]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/float64(time.Millisecond)) }

// client speaks the E2B wire protocol the way the JS SDK does (REST to the API,
// Connect JSON to envd through the sandbox URL with routing headers), through
// e2bclient, with the calls the bench makes in its own terms.
type client struct {
	cfg Config
	c   *e2bclient.Client
}

func newClient(cfg Config) *client {
	// Concurrent creates each hold a connection to the proxy; the default two
	// idle connections per host would make them dial anew every time.
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	return &client{cfg: cfg, c: e2bclient.New(e2bclient.Config{
		APIURL: cfg.APIURL, SandboxURL: cfg.SandboxURL, APIKey: cfg.APIKey, HTTPClient: hc,
	})}
}

func (c *client) create(ctx context.Context) (*e2bclient.Sandbox, error) {
	sb, _, err := c.createTimed(ctx)
	return sb, err
}

// createTimed is create with the server's breakdown of its time.
func (c *client) createTimed(ctx context.Context) (*e2bclient.Sandbox, []timing.Span, error) {
	timeout := int64(300)
	sb, spans, err := c.c.CreateTimed(ctx, e2bwire.NewSandbox{TemplateID: c.cfg.Template, Timeout: &timeout})
	if err != nil {
		return nil, nil, fmt.Errorf("create: %w", err)
	}
	return c.c.Sandbox(sb.SandboxID, sb.EnvdAccessToken), spans, nil
}

// kill is best effort: the bench is done with the sandbox, and one that is
// already gone is no failure of the measurement.
func (c *client) kill(ctx context.Context, sb *e2bclient.Sandbox) {
	_ = c.c.Kill(ctx, sb.ID())
}

// run is commands.run: Start /bin/bash -l -c cmd and read the stream to its end.
func (c *client) run(ctx context.Context, sb *e2bclient.Sandbox, cmd string) (int32, error) {
	stream, err := sb.Start(ctx, &process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", cmd}},
	})
	if err != nil {
		return 0, err
	}
	defer stream.Close()
	// To the stream's end, past the end event, as the SDKs read it: a
	// stream closed early costs its connection, which the next command
	// dials again.
	var end *process.ProcessEvent_EndEvent
	for stream.Receive() {
		if e := stream.Msg().GetEvent().GetEnd(); e != nil {
			end = e
		}
	}
	if err := stream.Err(); err != nil {
		return 0, err
	}
	if end == nil {
		return 0, errors.New("stream ended without an end event")
	}
	return end.GetExitCode(), nil
}

// createAndRun is time to interactive; the kill afterwards is not timed.
// With phases, where the time went is added to it.
func (c *client) createAndRun(ctx context.Context, phases *Phases) (time.Duration, error) {
	start := time.Now()
	sb, spans, err := c.createTimed(ctx)
	if err != nil {
		return 0, err
	}
	created := time.Now()
	defer c.kill(context.WithoutCancel(ctx), sb)
	code, err := c.run(ctx, sb, "true")
	if err != nil {
		return 0, err
	}
	if code != 0 {
		return 0, fmt.Errorf("true exited %d", code)
	}
	end := time.Now()
	if phases != nil {
		phases.addCreate(created.Sub(start), spans, end.Sub(created))
	}
	return end.Sub(start), nil
}
