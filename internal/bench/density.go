package bench

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/cookiejar"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/airlock-sandbox/airlock/internal/e2bclient"
	"github.com/airlock-sandbox/airlock/internal/e2bwire"
)

// DensityConfig fills one server with idle sandboxes and measures, at each
// step, what a user and the host feel.
type DensityConfig struct {
	Config
	// Steps are the numbers of live sandboxes measured at, ascending.
	Steps []int
	// Sample is how many creates, commands and lists are timed at a step
	// (the creates are the step's last ones).
	Sample int
	// Fill is how many creates run at once between the timed ones.
	Fill int
	// Threads, Goroutines and FDs count the server's (the bench's process):
	// OS threads, goroutines and open file descriptors.
	Threads    func() int
	Goroutines func() int
	FDs        func() int
	// MemCgroups counts the host's memory cgroups, dying ones included:
	// cgroup v1 gives them ids below 65,536, one of the caps on density.
	MemCgroups func() int
	// Leftovers lists what the server left behind of the sandboxes ids
	// once they were all killed (mounts, cgroups, records...).
	Leftovers func(ids []string) []string
	// ListPageSize is the size of the timed list pages: the same at every
	// step, so that the list's time shows the number alive, not the page.
	ListPageSize int
	// KillProfile, when set, receives a CPU profile of this process while
	// every sandbox is killed (CPUProfile covers the last step's creates).
	KillProfile io.Writer
}

// DensityRow is one step.
type DensityRow struct {
	Alive                 int
	MiBPerSandbox         float64
	Create, Command, List []time.Duration
	// DashList and Overview are the web dashboard's live list (a page of
	// 100 with each sandbox's current use: what it asks every second) and
	// its overview page.
	DashList, Overview  []time.Duration
	Threads, Goroutines int
	FDs, MemCgroups     int
	// Phases is where the timed creates' time went (the server's spans).
	Phases Phases
}

// DensityResult is every step, then the teardown.
type DensityResult struct {
	Rows      []DensityRow
	KillAll   time.Duration // until every kill answered
	Clean     time.Duration // until nothing was left (or 2 minutes)
	Killed    int
	Leftovers []string
}

// RunDensity creates idle sandboxes up to each step, measures, and at the
// end kills them all at once, timing it and listing what is left.
func RunDensity(ctx context.Context, cfg DensityConfig) (DensityResult, error) {
	c := newClient(cfg.Config)
	var res DensityResult
	used0, err := hostMemUsed()
	if err != nil {
		return res, err
	}
	var (
		mu    sync.Mutex
		alive []*e2bclient.Sandbox
	)
	defer func() {
		// On an error, what was made is still killed.
		if len(alive) > 0 && res.Killed == 0 {
			killAll(context.WithoutCancel(ctx), c, alive, max(cfg.Fill, 8))
		}
	}()
	create := func(ctx context.Context, phases *Phases) (*e2bclient.Sandbox, time.Duration, error) {
		timeout := int64(time.Hour / time.Second)
		start := time.Now()
		sb, spans, err := c.c.CreateTimed(ctx, e2bwire.NewSandbox{TemplateID: c.cfg.Template, Timeout: &timeout})
		d := time.Since(start)
		if err != nil {
			return nil, d, fmt.Errorf("create %d: %w", len(alive)+1, err)
		}
		if phases != nil {
			phases.addCreate(d, spans, 0)
		}
		s := c.c.Sandbox(sb.SandboxID, sb.EnvdAccessToken)
		mu.Lock()
		alive = append(alive, s)
		mu.Unlock()
		return s, d, nil
	}
	pageSize := cmp.Or(cfg.ListPageSize, 10)
	dash, err := signInDashboard(ctx, cfg.APIURL, cfg.APIKey)
	if err != nil {
		return res, err
	}
	for _, step := range cfg.Steps {
		// Fill up to the step's timed creates, Fill at a time.
		for len(alive) < step-cfg.Sample {
			n := min(cfg.Fill, step-cfg.Sample-len(alive))
			errs := make(chan error, n)
			for i := 0; i < n; i++ {
				go func() {
					_, _, err := create(ctx, nil)
					errs <- err
				}()
			}
			for i := 0; i < n; i++ {
				if err := <-errs; err != nil {
					return res, err
				}
			}
			if cfg.Progress != nil && len(alive)%500 < n {
				fmt.Fprintf(cfg.Progress, "%d sandboxes alive\n", len(alive))
			}
		}
		row := DensityRow{Alive: step}
		if cfg.CPUProfile != nil && step == cfg.Steps[len(cfg.Steps)-1] {
			if err := pprof.StartCPUProfile(cfg.CPUProfile); err != nil {
				return res, fmt.Errorf("cpu profile: %w", err)
			}
		}
		for len(alive) < step {
			_, d, err := create(ctx, &row.Phases)
			if err != nil {
				return res, err
			}
			row.Create = append(row.Create, d)
		}
		for i := 0; i < cfg.Sample; i++ {
			sb := alive[rand.IntN(len(alive))]
			start := time.Now()
			if code, err := c.run(ctx, sb, "true"); err != nil || code != 0 {
				return res, fmt.Errorf("commands.run in %s with %d alive: exit %d, %v", sb.ID(), step, code, err)
			}
			row.Command = append(row.Command, time.Since(start))
		}
		for i := 0; i < cfg.Sample; i++ {
			start := time.Now()
			if _, err := c.c.ListPage(ctx, e2bclient.ListQuery{State: "running", PageSize: pageSize}); err != nil {
				return res, fmt.Errorf("list with %d alive: %w", step, err)
			}
			row.List = append(row.List, time.Since(start))
		}
		for _, page := range []struct {
			path string
			to   *[]time.Duration
		}{{"/dashboard/api/sandboxes?limit=100", &row.DashList}, {"/dashboard/api/overview", &row.Overview}} {
			for i := 0; i < cfg.Sample; i++ {
				start := time.Now()
				if err := dash.get(ctx, page.path); err != nil {
					return res, fmt.Errorf("dashboard with %d alive: %w", step, err)
				}
				*page.to = append(*page.to, time.Since(start))
			}
		}
		if cfg.CPUProfile != nil && step == cfg.Steps[len(cfg.Steps)-1] {
			pprof.StopCPUProfile()
		}
		used, err := hostMemUsed()
		if err != nil {
			return res, err
		}
		row.MiBPerSandbox = float64(used-used0) / float64(step) / (1 << 20)
		if cfg.Threads != nil {
			row.Threads = cfg.Threads()
		}
		if cfg.Goroutines != nil {
			row.Goroutines = cfg.Goroutines()
		}
		if cfg.FDs != nil {
			row.FDs = cfg.FDs()
		}
		if cfg.MemCgroups != nil {
			row.MemCgroups = cfg.MemCgroups()
		}
		res.Rows = append(res.Rows, row)
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, "measured %d alive: create p50 %s ms, %d threads, %d fds\n", step, ms(p50(row.Create)), row.Threads, row.FDs)
		}
	}
	// Every sandbox must still answer.
	for _, sb := range alive {
		if code, err := c.run(ctx, sb, "true"); err != nil || code != 0 {
			return res, fmt.Errorf("commands.run in %s with %d alive: exit %d, %v", sb.ID(), len(alive), code, err)
		}
	}
	if cfg.KillProfile != nil {
		if err := pprof.StartCPUProfile(cfg.KillProfile); err != nil {
			return res, fmt.Errorf("cpu profile: %w", err)
		}
	}
	start := time.Now()
	err = killAll(ctx, c, alive, 32)
	if cfg.KillProfile != nil {
		pprof.StopCPUProfile()
	}
	if err != nil {
		return res, err
	}
	res.KillAll, res.Killed = time.Since(start), len(alive)
	if cfg.Leftovers != nil {
		// A kill answers before the network is torn down (off the request
		// path): the teardown is over once nothing is left, within a bound.
		ids := make([]string, len(alive))
		for i, sb := range alive {
			ids[i] = sb.ID()
		}
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
			res.Leftovers = cfg.Leftovers(ids)
			if len(res.Leftovers) == 0 || time.Now().After(deadline) {
				break
			}
		}
		res.Clean = time.Since(start)
	}
	return res, nil
}

func killAll(ctx context.Context, c *client, sbs []*e2bclient.Sandbox, workers int) error {
	ch := make(chan *e2bclient.Sandbox)
	errs := make(chan error, len(sbs))
	var wg sync.WaitGroup
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for sb := range ch {
				if err := c.c.Kill(ctx, sb.ID()); err != nil {
					errs <- fmt.Errorf("kill %s: %w", sb.ID(), err)
				}
			}
		}()
	}
	for _, sb := range sbs {
		ch <- sb
	}
	close(ch)
	wg.Wait()
	close(errs)
	return <-errs
}

// hostMemUsed is MemTotal - MemAvailable: what the host could not give to
// a new program without swapping, sandboxes' page cache left out.
func hostMemUsed() (int64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	var total, avail int64
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "MemTotal:":
			total = v << 10
		case "MemAvailable:":
			avail = v << 10
		}
	}
	if total == 0 || avail == 0 {
		return 0, fmt.Errorf("/proc/meminfo has no MemTotal/MemAvailable")
	}
	return total - avail, nil
}

// PrintDensity writes the steps as a table, each latency also as a ratio to
// the first step's.
func PrintDensity(w io.Writer, r DensityResult) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "alive\tMiB/sandbox\tcreate p50\tp99\tvs first\tcommand p50\tp99\tvs first\tlist p50\tvs first\tdash list p50\tvs first\toverview p50\tthreads\tgoroutines\tfds\tmemcgs\t")
	for _, row := range r.Rows {
		first := r.Rows[0]
		c50, c99 := percentiles(row.Create)
		m50, m99 := percentiles(row.Command)
		fmt.Fprintf(tw, "%d\t%.2f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t\n", row.Alive, row.MiBPerSandbox,
			ms(c50), ms(c99), ratio(c50, p50(first.Create)),
			ms(m50), ms(m99), ratio(m50, p50(first.Command)),
			ms(p50(row.List)), ratio(p50(row.List), p50(first.List)),
			ms(p50(row.DashList)), ratio(p50(row.DashList), p50(first.DashList)), ms(p50(row.Overview)), row.Threads, row.Goroutines, row.FDs, row.MemCgroups)
	}
	tw.Flush()
	for _, row := range []DensityRow{r.Rows[0], r.Rows[len(r.Rows)-1]} {
		PrintBreakdown(w, Row{Name: fmt.Sprintf("create with %d alive", row.Alive), Samples: row.Create, Phases: row.Phases})
		if len(r.Rows) == 1 {
			break
		}
	}
	fmt.Fprintf(w, "\nkilled %d sandboxes in %.1f s (every kill answered), all torn down in %.1f s; left behind: %s\n",
		r.Killed, r.KillAll.Seconds(), r.Clean.Seconds(), leftovers(r.Leftovers))
}

func leftovers(l []string) string {
	if len(l) == 0 {
		return "nothing"
	}
	return strings.Join(l, ", ")
}

// dashboardClient is a browser's session with the web dashboard.
type dashboardClient struct {
	base string
	hc   *http.Client
}

// signInDashboard signs in to the dashboard with key, as its page does.
func signInDashboard(ctx context.Context, apiURL, key string) (*dashboardClient, error) {
	jar, err := cookiejar.New(nil)
	if err != nil {
		return nil, err
	}
	c := &dashboardClient{base: strings.TrimRight(apiURL, "/"), hc: &http.Client{Jar: jar, Timeout: time.Minute}}
	body, _ := json.Marshal(map[string]string{"apiKey": key})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/dashboard/api/session", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("dashboard sign-in: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
		return nil, fmt.Errorf("dashboard sign-in: %s: %s", resp.Status, msg)
	}
	return c, nil
}

// get reads one of the dashboard's API answers whole.
func (c *dashboardClient) get(ctx context.Context, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+path, nil)
	if err != nil {
		return err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return nil
}
