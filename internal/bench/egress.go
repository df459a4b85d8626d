package bench

// `airlock bench egress`: what the egress proxy adds to an HTTPS request
// (issue 18's benchmark; target ≤ 2 ms at p50 for a rule host). Three
// sandboxes of one server call the same HTTPS server (a stand-in in a
// network namespace of the bench's own) in the same run:
//
//   - no policy: the connection goes straight out (forwarded, masqueraded);
//   - a host without rules: the sandbox has rules for another name on the
//     same address, so its connection is redirected to the egress proxy,
//     which reads the ClientHello and splices it through untouched;
//   - the rule host: the proxy terminates TLS (its CA's leaf for the name),
//     sets the rule's header with a secret filled in from the secret store,
//     and sends the request upstream over TLS it verifies.
//
// One python3 process per sandbox and round makes the requests and times
// each one inside the sandbox (time.perf_counter), so neither process start
// nor the E2B wire is measured: with a new TLS connection per request (name
// lookup, TCP connect, TLS handshake, request, response; the lookup also
// timed alone) and on one kept-alive connection. Rounds rotate the order of
// the three so a drift of the machine spreads over all of them.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/airlock-sandbox/airlock/internal/e2bclient"
	"github.com/airlock-sandbox/airlock/internal/e2bwire"
)

// EgressConfig says what to measure.
type EgressConfig struct {
	Config
	// RuleHost and PlainHost name the stand-in HTTPS server (both resolve
	// to its address through the sandboxes' DNS); its certificate is
	// signed by ServerCA (PEM), which the sandboxes' trust store lacks.
	RuleHost, PlainHost string
	ServerCA            []byte
	// SecretName is a secret of APIKey's; the rule sets
	// "Authorization: Bearer <its value>".
	SecretName string
	// Requests are measured per configuration and mode, split over Rounds;
	// Warmup more per process are made first and not counted.
	Requests, Rounds, Warmup int
	// Received returns the requests the server has received (path and
	// Authorization header): the bench checks that each configuration
	// took the path it claims.
	Received func() []EgressRequest
	// WantAuth is the Authorization the rule host's requests must carry.
	WantAuth string
}

// EgressRequest is what the stand-in server saw of one request.
type EgressRequest struct {
	Path, SNI, Authorization string
}

// EgressMode is one way of making the requests.
type EgressMode struct {
	Name string
	// KeepAlive makes all of a process's requests on one connection.
	KeepAlive bool
}

// EgressSeries is one configuration's samples in one mode.
type EgressSeries struct {
	Config string
	// Total is each request's time; DNS the name lookup within it (new
	// connections only).
	Total, DNS []time.Duration
}

// EgressResult holds, per mode, the three configurations in display order
// (no policy first: the baseline).
type EgressResult struct {
	Modes  []EgressMode
	Series [][]EgressSeries
}

// egressScript is the client inside the sandbox. Arguments: mode (new or
// keepalive), host, requests (warm-up included), warm-up, path prefix,
// CA file ("-": the sandbox's own trust store), a name to look up (not
// timed) every 10 s ("-": none) and a host to fetch once first with the
// sandbox's own trust store ("-": none). It prints "total_ns dns_ns" per
// counted request.
const egressScript = `import http.client, socket, ssl, sys, time
mode, host, n, warm, prefix, cafile, refresh, check = sys.argv[1:9]
n, warm = int(n), int(warm)
pc = time.perf_counter_ns
ctx = ssl.create_default_context() if cafile == "-" else ssl.create_default_context(cafile=cafile)
if check != "-":
    c = http.client.HTTPSConnection(check, context=ssl.create_default_context(), timeout=10)
    c.request("GET", prefix + "/check"); r = c.getresponse(); r.read()
    if r.status != 200:
        sys.exit("check request to %s: status %d" % (check, r.status))
    c.close()
last = pc()
out = []
def fail(i, r, body):
    sys.exit("request %d: status %d: %r" % (i, r.status, body[:200]))
if mode == "new":
    for i in range(n):
        if refresh != "-" and pc() - last > 10e9:
            socket.getaddrinfo(refresh, 443, socket.AF_INET, socket.SOCK_STREAM); last = pc()
        t0 = pc()
        ai = socket.getaddrinfo(host, 443, socket.AF_INET, socket.SOCK_STREAM)
        t1 = pc()
        s = socket.create_connection(ai[0][4], timeout=10)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s = ctx.wrap_socket(s, server_hostname=host)
        s.sendall(("GET %s/%d HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (prefix, i, host)).encode())
        r = http.client.HTTPResponse(s)
        r.begin(); body = r.read()
        t2 = pc()
        r.close(); s.close()
        if r.status != 200: fail(i, r, body)
        if i >= warm: out.append("%d %d" % (t2 - t0, t1 - t0))
else:
    c = http.client.HTTPSConnection(host, context=ctx, timeout=10)
    for i in range(n):
        if refresh != "-" and pc() - last > 10e9:
            socket.getaddrinfo(refresh, 443, socket.AF_INET, socket.SOCK_STREAM); last = pc()
        t0 = pc()
        c.request("GET", "%s/%d" % (prefix, i)); r = c.getresponse(); body = r.read()
        t2 = pc()
        if r.status != 200: fail(i, r, body)
        if i >= warm: out.append("%d 0" % (t2 - t0))
    c.close()
print("\n".join(out))
`

const (
	egressScriptPath = "/tmp/airlock-bench-egress.py"
	egressCAPath     = "/tmp/airlock-bench-server-ca.pem"
)

// egressSetup is one of the three configurations.
type egressSetup struct {
	name    string
	network *e2bwire.SandboxNetworkConfig
	// host is the name requested, prefix the path prefix (the server's
	// record tells the configurations apart by it), cafile what the
	// client trusts: the server's CA for the two that must reach the
	// real server untouched (an interception would fail verification),
	// the sandbox's own store for the rule host (a request that was not
	// intercepted would fail it).
	host, prefix, cafile string
	// refresh and check keep the rule host's address in the sandbox's
	// interception set, and prove it is there, for the spliced
	// configuration.
	refresh, check string
	sb             *e2bclient.Sandbox
}

// RunEgress measures; see the file comment.
func RunEgress(ctx context.Context, cfg EgressConfig) (EgressResult, error) {
	if cfg.Rounds <= 0 || cfg.Requests < cfg.Rounds {
		return EgressResult{}, fmt.Errorf("need at least one request per round (requests %d, rounds %d)", cfg.Requests, cfg.Rounds)
	}
	c := newClient(cfg.Config)
	rules := map[string][]e2bwire.SandboxNetworkRule{cfg.RuleHost: {{Transform: &e2bwire.SandboxNetworkTransform{
		Headers: map[string]string{"Authorization": "Bearer ${e2b.secrets." + cfg.SecretName + "}"},
	}}}}
	setups := []*egressSetup{
		{name: "no policy (direct)", host: cfg.PlainHost, prefix: "/bench/direct", cafile: egressCAPath, refresh: "-", check: "-"},
		{name: "host without rules (redirected, spliced)", network: &e2bwire.SandboxNetworkConfig{Rules: rules},
			host: cfg.PlainHost, prefix: "/bench/spliced", cafile: egressCAPath, refresh: cfg.RuleHost, check: cfg.RuleHost},
		{name: "rule host (terminated, header with secret)", network: &e2bwire.SandboxNetworkConfig{Rules: rules},
			host: cfg.RuleHost, prefix: "/bench/rules", cafile: "-", refresh: "-", check: "-"},
	}
	for _, s := range setups {
		timeout := int64(3600)
		sb, err := c.c.Create(ctx, e2bwire.NewSandbox{TemplateID: cfg.Template, Timeout: &timeout, Network: s.network})
		if err != nil {
			return EgressResult{}, fmt.Errorf("create the sandbox for %s: %w", s.name, err)
		}
		s.sb = c.c.Sandbox(sb.SandboxID, sb.EnvdAccessToken)
		defer c.kill(context.WithoutCancel(ctx), s.sb)
		for path, content := range map[string][]byte{egressScriptPath: []byte(egressScript), egressCAPath: cfg.ServerCA} {
			if err := s.sb.WriteFile(ctx, path, bytes.NewReader(content)); err != nil {
				return EgressResult{}, fmt.Errorf("%s: write %s: %w", s.name, path, err)
			}
		}
	}
	res := EgressResult{Modes: []EgressMode{{Name: "new TLS connection per request"}, {Name: "one kept-alive connection", KeepAlive: true}}}
	for range res.Modes {
		series := make([]EgressSeries, len(setups))
		for i, s := range setups {
			series[i].Config = s.name
		}
		res.Series = append(res.Series, series)
	}
	for round := range cfg.Rounds {
		n := cfg.Requests / cfg.Rounds
		if round < cfg.Requests%cfg.Rounds {
			n++
		}
		for m, mode := range res.Modes {
			for k := range setups {
				i := (k + round) % len(setups) // each round starts with another one
				s := setups[i]
				total, dns, err := c.egressRound(ctx, s, mode, n, cfg.Warmup)
				if err != nil {
					return EgressResult{}, fmt.Errorf("%s, %s: %w", s.name, mode.Name, err)
				}
				res.Series[m][i].Total = append(res.Series[m][i].Total, total...)
				res.Series[m][i].DNS = append(res.Series[m][i].DNS, dns...)
			}
		}
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, "round %d of %d: %d requests per configuration and mode\n", round+1, cfg.Rounds, n)
		}
	}
	if cfg.Received != nil {
		if err := checkEgressPaths(cfg.Received(), cfg.WantAuth); err != nil {
			return EgressResult{}, err
		}
	}
	return res, nil
}

// egressRound runs the client once in s's sandbox.
func (c *client) egressRound(ctx context.Context, s *egressSetup, mode EgressMode, n, warm int) (total, dns []time.Duration, err error) {
	m := "new"
	if mode.KeepAlive {
		m = "keepalive"
	}
	args := []string{egressScriptPath, m, s.host, strconv.Itoa(n + warm), strconv.Itoa(warm), s.prefix, s.cafile, s.refresh, s.check}
	out, code, err := c.output(ctx, s.sb, "/usr/bin/python3", args...)
	if err != nil {
		return nil, nil, err
	}
	if code != 0 {
		return nil, nil, fmt.Errorf("client exited %d: %s", code, strings.TrimSpace(out))
	}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			return nil, nil, fmt.Errorf("client printed %q", sc.Text())
		}
		t, err1 := strconv.ParseInt(f[0], 10, 64)
		d, err2 := strconv.ParseInt(f[1], 10, 64)
		if err := errors.Join(err1, err2); err != nil {
			return nil, nil, fmt.Errorf("client printed %q: %w", sc.Text(), err)
		}
		total = append(total, time.Duration(t))
		if !mode.KeepAlive {
			dns = append(dns, time.Duration(d))
		}
	}
	if len(total) != n {
		return nil, nil, fmt.Errorf("client printed %d samples, want %d: %s", len(total), n, out)
	}
	return total, dns, nil
}

// output runs a program (no shell) in the sandbox and returns its stdout
// and stderr together, and its exit code.
func (c *client) output(ctx context.Context, sb *e2bclient.Sandbox, cmd string, args ...string) (string, int32, error) {
	return c.outputAs(ctx, sb, nil, cmd, args...)
}

// checkEgressPaths checks the server's record: the rule host's requests
// carried the filled-in header, the others none, and each configuration's
// requests arrived.
func checkEgressPaths(reqs []EgressRequest, wantAuth string) error {
	counts := map[string]int{}
	for _, r := range reqs {
		prefix, _, _ := strings.Cut(strings.TrimPrefix(r.Path, "/bench/"), "/")
		counts[prefix]++
		rule := prefix == "rules" || (prefix == "spliced" && strings.HasSuffix(r.Path, "/check"))
		switch {
		case rule && r.Authorization != wantAuth:
			return fmt.Errorf("the rule host's request %s arrived without the rule's header with the secret filled in", r.Path)
		case !rule && r.Authorization != "":
			return fmt.Errorf("request %s to a host without rules arrived with an Authorization header", r.Path)
		}
	}
	for _, p := range []string{"direct", "spliced", "rules"} {
		if counts[p] == 0 {
			return fmt.Errorf("the server received no request under /bench/%s", p)
		}
	}
	return nil
}

// egressTarget is issue 18's bound on what a rule host adds at p50.
const egressTarget = 2 * time.Millisecond

// PrintEgress prints one table per mode: percentiles of each configuration
// and what it adds to no policy; for new connections also the name lookup's
// p50 and what the rest of the request (connect, TLS, request, response)
// adds without it.
func PrintEgress(w io.Writer, res EgressResult) {
	for m, mode := range res.Modes {
		series := res.Series[m]
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
		head := "HTTPS GET, " + mode.Name + "\tn\tp50 ms\tp90 ms\tp99 ms\tadded p50 ms\tadded p90 ms\t"
		if !mode.KeepAlive {
			head += "lookup p50 ms\tadded p50 w/o lookup ms\t"
		}
		fmt.Fprintln(tw, head)
		base := sortedCopy(series[0].Total)
		baseRest := sortedCopy(withoutLookup(series[0]))
		for i, s := range series {
			t := sortedCopy(s.Total)
			line := fmt.Sprintf("%s\t%d\t%s\t%s\t%s\t", s.Config, len(t), ms(Percentile(t, 50)), ms(Percentile(t, 90)), ms(Percentile(t, 99)))
			added := Percentile(t, 50) - Percentile(base, 50)
			if i == 0 {
				line += "-\t-\t"
			} else {
				line += fmt.Sprintf("%s\t%s\t", signedMS(added), signedMS(Percentile(t, 90)-Percentile(base, 90)))
			}
			if !mode.KeepAlive {
				line += ms(Percentile(sortedCopy(s.DNS), 50)) + "\t"
				if i == 0 {
					line += "-\t"
				} else {
					line += signedMS(Percentile(sortedCopy(withoutLookup(s)), 50)-Percentile(baseRest, 50)) + "\t"
				}
			}
			note := ""
			switch {
			case i == 0:
				note = "baseline"
			case i == len(series)-1:
				verdict := "met"
				if added > egressTarget {
					verdict = "MISSED"
				}
				note = fmt.Sprintf("target ≤ %s added at p50: %s", egressTarget, verdict)
			}
			fmt.Fprintf(tw, "%s  %s\n", line, note)
		}
		tw.Flush()
		fmt.Fprintln(w)
	}
}

// withoutLookup is each request's time less its name lookup.
func withoutLookup(s EgressSeries) []time.Duration {
	out := make([]time.Duration, len(s.Total))
	for i, t := range s.Total {
		out[i] = t
		if i < len(s.DNS) {
			out[i] -= s.DNS[i]
		}
	}
	return out
}

func sortedCopy(s []time.Duration) []time.Duration {
	c := slices.Clone(s)
	slices.Sort(c)
	return c
}

func signedMS(d time.Duration) string {
	return fmt.Sprintf("%+.2f", float64(d)/float64(time.Millisecond))
}
