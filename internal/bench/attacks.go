package bench

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/airlock-sandbox/airlock/api/gen/process"
	"github.com/airlock-sandbox/airlock/internal/e2bclient"
)

// AttacksConfig says where the server is and how many neighbour round trips
// to measure per attack.
type AttacksConfig struct {
	APIURL, SandboxURL, APIKey string
	Template                   string
	RoundTrips                 int
	// Settle is how long an attack runs before the neighbour is measured.
	Settle   time.Duration
	Progress io.Writer
}

// Attack is one abuse a sandbox can commit against its limits, started
// detached (setsid, no stdio) so that it keeps going while the neighbour is
// measured; it ends when its sandbox is killed.
type Attack struct {
	Name string
	// Cmd starts the attack in the background and returns.
	Cmd string
	// Stream, when set, is a command whose output the bench reads (and
	// discards) through the server for the whole measurement.
	Stream string
}

// Attacks are the attacks of issue 3, in display order.
var Attacks = []Attack{
	{Name: "fork bomb", Cmd: `setsid bash -c ':(){ :|:& };:' >/dev/null 2>&1 </dev/null &`},
	{Name: "memory bomb (OOM loop)", Cmd: `setsid bash -c 'while :; do python3 -c "
a = []
while True: a.append(b\"x\" * (16 << 20))
"; done' >/dev/null 2>&1 </dev/null &`},
	{Name: "CPU spin on all cores", Cmd: `for i in $(seq $(nproc)); do setsid bash -c 'while :; do :; done' >/dev/null 2>&1 </dev/null & done`},
	{Name: "disk fill to quota (loop)", Cmd: `setsid bash -c 'while :; do dd if=/dev/zero of=$HOME/fill bs=1M count=1000000 conv=fsync; rm -f $HOME/fill; done' >/dev/null 2>&1 </dev/null &`},
	{Name: "output flood via commands.run", Stream: `cat /dev/zero`},
	{Name: "fd exhaustion (8 procs)", Cmd: `for i in $(seq 8); do setsid bash -c 'while exec {fd}</dev/null; do :; done 2>/dev/null; sleep 3600' >/dev/null 2>&1 </dev/null & done`},
}

// AttackRow is the neighbour's round trip during one attack, and just before
// it with the attacker sandbox created but quiet: the machine is shared, so
// each attack is compared with an idle series measured next to it.
type AttackRow struct {
	Name    string
	Idle    []time.Duration
	Samples []time.Duration
	Note    string
}

// RunAttacks measures a neighbour sandbox's commands.run('true') round trip
// while idle, then while a second sandbox commits each attack in turn (a fresh
// attacker per attack, killed afterwards).
func RunAttacks(ctx context.Context, cfg AttacksConfig) ([]AttackRow, error) {
	if cfg.Settle <= 0 {
		cfg.Settle = 3 * time.Second
	}
	c := newClient(Config{APIURL: cfg.APIURL, SandboxURL: cfg.SandboxURL, APIKey: cfg.APIKey, Template: cfg.Template})
	neighbour, err := c.create(ctx)
	if err != nil {
		return nil, err
	}
	defer c.kill(context.WithoutCancel(ctx), neighbour)
	measure := func(name string) (AttackRow, error) {
		row := AttackRow{Name: name}
		for i := 0; i < cfg.RoundTrips; i++ {
			start := time.Now()
			code, err := c.run(ctx, neighbour, "true")
			if err != nil {
				return row, fmt.Errorf("neighbour during %s: %w", name, err)
			}
			if code != 0 {
				return row, fmt.Errorf("neighbour during %s: true exited %d", name, code)
			}
			row.Samples = append(row.Samples, time.Since(start))
		}
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, "measured neighbour during %s\n", name)
		}
		return row, nil
	}
	// Warm-up: the first commands pay for page-cache misses.
	for range 10 {
		if _, err := c.run(ctx, neighbour, "true"); err != nil {
			return nil, err
		}
	}
	var rows []AttackRow
	for _, a := range Attacks {
		row, err := c.attack(ctx, a, cfg, measure)
		if err != nil {
			return nil, err
		}
		rows = append(rows, row)
	}
	return rows, nil
}

func (c *client) attack(ctx context.Context, a Attack, cfg AttacksConfig, measure func(string) (AttackRow, error)) (AttackRow, error) {
	attacker, err := c.create(ctx)
	if err != nil {
		return AttackRow{}, err
	}
	defer c.kill(context.WithoutCancel(ctx), attacker)
	idle, err := measure(a.Name + " (idle before)")
	if err != nil {
		return AttackRow{}, err
	}
	var (
		wg       sync.WaitGroup
		streamed int64
		stop     = func() {}
	)
	if a.Cmd != "" {
		if code, err := c.run(ctx, attacker, a.Cmd); err != nil || code != 0 {
			return AttackRow{}, fmt.Errorf("start %s: exit %d, %v", a.Name, code, err)
		}
	}
	if a.Stream != "" {
		sctx, cancel := context.WithCancel(ctx)
		stop = cancel
		wg.Add(1)
		go func() {
			defer wg.Done()
			streamed = c.drain(sctx, attacker, a.Stream)
		}()
	}
	time.Sleep(cfg.Settle)
	row, err := measure(a.Name)
	row.Idle = idle.Samples
	stop()
	wg.Wait()
	var notes []string
	if a.Stream != "" {
		notes = append(notes, fmt.Sprintf("%d MiB of stream read", streamed>>20))
	}
	// The attacker's own sandbox must survive its attack (issue 11): it still
	// runs a command, within 2 s, while the attack goes on.
	actx, cancel := context.WithTimeout(ctx, 2*time.Second)
	t0 := time.Now()
	code, aerr := c.run(actx, attacker, "echo ok")
	cancel()
	if aerr != nil || code != 0 {
		notes = append(notes, fmt.Sprintf("attacker's sandbox unusable: exit %d, %v", code, aerr))
	} else {
		notes = append(notes, fmt.Sprintf("attacker answers in %s ms", ms(time.Since(t0))))
	}
	row.Note = strings.Join(notes, "; ")
	return row, err
}

// drain runs cmd and reads its output until ctx ends, returning the bytes
// read. It reads the raw Connect stream without decoding it: the bench runs in
// the server's process, and decoding JSON here would charge the client's work
// to the server.
func (c *client) drain(ctx context.Context, sb *e2bclient.Sandbox, cmd string) int64 {
	body, err := sb.StartUndecoded(ctx, &process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", cmd}},
	})
	if err != nil {
		return 0
	}
	defer body.Close()
	n, _ := io.Copy(io.Discard, body)
	return n
}

// PrintAttacks writes, per attack, the neighbour's p50/p99 while idle (just
// before) and during the attack, and the ratios.
func PrintAttacks(w io.Writer, rows []AttackRow) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "neighbour commands.run('true') during\tn\tidle p50 ms\tidle p99 ms\tp50 ms\tp99 ms\tp50/idle\tp99/idle\t")
	for _, r := range rows {
		i50, i99 := percentiles(r.Idle)
		p50, p99 := percentiles(r.Samples)
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t  %s\n", r.Name, len(r.Samples), ms(i50), ms(i99),
			ms(p50), ms(p99), ratio(p50, i50), ratio(p99, i99), r.Note)
	}
	tw.Flush()
}

func percentiles(samples []time.Duration) (p50, p99 time.Duration) {
	s := append([]time.Duration(nil), samples...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return Percentile(s, 50), Percentile(s, 99)
}

func ratio(a, b time.Duration) string {
	if b <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", float64(a)/float64(b))
}
