package sandbox_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/netpolicy"
	"github.com/airlock-sandbox/airlock/internal/netpolicy/netpolicytest"
	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/runtime/gvisor"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// fakeSecrets stands in for the secret store (internal/secret, tested on
// its own) behind the egress: name -> value, for every owner.
type fakeSecrets struct {
	mu sync.Mutex
	m  map[string]string
}

var secretMarker = regexp.MustCompile(`\$\{e2b\.secrets\.([A-Za-z0-9_-]+)\}`)

func (f *fakeSecrets) set(name, value string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.m[name] = value
}

func (f *fakeSecrets) fill(_ context.Context, _ string, v string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var err error
	out := secretMarker.ReplaceAllStringFunc(v, func(m string) string {
		name := secretMarker.FindStringSubmatch(m)[1]
		val, ok := f.m[name]
		if !ok && err == nil {
			err = fmt.Errorf("secret %q does not exist", name)
		}
		return val
	})
	return out, err
}

func (f *fakeSecrets) Missing(_ context.Context, _ string, values []string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, v := range values {
		for _, m := range secretMarker.FindAllStringSubmatch(v, -1) {
			if _, ok := f.m[m[1]]; !ok {
				return m[1], nil
			}
		}
	}
	return "", nil
}

func randomSecret(t *testing.T) string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return "sekrit-" + hex.EncodeToString(b)
}

func authRules(host, header string) map[string][]netpolicy.Rule {
	return map[string][]netpolicy.Rule{host: {{Transform: &netpolicy.Transform{Headers: map[string]string{"Authorization": header}}}}}
}

// TestEgressRulesFillSecrets: a rule's header reaches the real server with
// the secret filled in on the host; a host without rules on the same
// address is passed through untouched (its own certificate, no header);
// nothing inside the sandbox ever holds the value (its processes' memory
// and its files are searched); updateNetwork changes the header for the
// next request on a connection already open.
func TestEgressRulesFillSecrets(t *testing.T) {
	nr := newNetRig(t)
	es := nr.inet.StartEgress(t)
	nr.egressRoots.AppendCertsFromPEM(es.CAPEM)
	secret, secret2 := randomSecret(t), randomSecret(t)
	nr.secrets.set("tok", secret)
	nr.secrets.set("tok2", secret2)

	info := nr.create(t, sandbox.CreateRequest{Network: &sandbox.NetworkConfig{
		Rules: authRules(netpolicytest.RulesHost, "Bearer ${e2b.secrets.tok}"),
	}})
	out, code := run(t, nr.m, info, "curl -sS --max-time 5 https://"+netpolicytest.RulesHost+"/first")
	if code != 0 || !strings.Contains(out, "recorded request") {
		t.Fatalf("https to the rule host: %q (exit %d)", out, code)
	}
	reqs := es.Requests()
	if len(reqs) != 1 || reqs[0].Header.Get("Authorization") != "Bearer "+secret || reqs[0].SNI != netpolicytest.RulesHost {
		t.Fatalf("the server got %+v, want one request with the filled-in header over SNI %s", reqs, netpolicytest.RulesHost)
	}

	// Same address, no rule: the sandbox talks to the real server, whose
	// certificate (the stand-in CA's, untrusted inside) it sees.
	out, _ = run(t, nr.m, info, "curl -skv --max-time 5 https://"+netpolicytest.PlainHost+"/plain 2>&1")
	if !strings.Contains(out, "netpolicytest stand-in CA") || strings.Contains(out, "Airlock egress CA") {
		t.Errorf("a host without rules was intercepted (or not reached):\n%s", out)
	}
	reqs = es.Requests()
	if last := reqs[len(reqs)-1]; last.Path != "/plain" || last.Header.Get("Authorization") != "" {
		t.Errorf("plain host got %+v", last)
	}

	// updateNetwork while a keep-alive connection is open: the next request
	// on it carries the new rule's value.
	script := `import http.client, os, ssl, time
c = http.client.HTTPSConnection("` + netpolicytest.RulesHost + `", context=ssl.create_default_context())
c.request("GET", "/ka1"); r = c.getresponse(); r.read(); print(r.status, flush=True)
for _ in range(200):
    if os.path.exists("/tmp/go"): break
    time.sleep(0.05)
c.request("GET", "/ka2"); r = c.getresponse(); r.read(); print(r.status, flush=True)
`
	if _, code := run(t, nr.m, info, "cat > /tmp/ka.py <<'EOF'\n"+script+"EOF\n(python3 /tmp/ka.py > /tmp/ka.out 2>&1 &)"); code != 0 {
		t.Fatal("could not start the keep-alive client")
	}
	waitFor(t, 10*time.Second, "the first keep-alive request", func() bool { return hasPath(es.Requests(), "/ka1") })
	if err := nr.m.UpdateNetwork(context.Background(), info.ID, sandbox.NetworkUpdate{
		Rules: authRules(netpolicytest.RulesHost, "Token ${e2b.secrets.tok2}"),
	}); err != nil {
		t.Fatal(err)
	}
	run(t, nr.m, info, "touch /tmp/go")
	waitFor(t, 10*time.Second, "the second keep-alive request", func() bool { return hasPath(es.Requests(), "/ka2") })
	for _, r := range es.Requests() {
		switch r.Path {
		case "/ka1":
			if r.Header.Get("Authorization") != "Bearer "+secret {
				t.Errorf("/ka1 got Authorization %q", r.Header.Get("Authorization"))
			}
		case "/ka2":
			if r.Header.Get("Authorization") != "Token "+secret2 {
				t.Errorf("/ka2 (after updateNetwork, same connection) got Authorization %q", r.Header.Get("Authorization"))
			}
		}
	}
	if out, _ := run(t, nr.m, info, "cat /tmp/ka.out"); out != "200\n200\n" {
		t.Errorf("keep-alive client: %q", out)
	}

	// Nothing in the sandbox holds either value: not its processes' memory
	// (environment included), not its files.
	for _, s := range []string{secret, secret2} {
		if where := findInSandboxMemory(t, info.ID, s); where != "" {
			t.Errorf("a secret value is in the sandbox's memory: %s", where)
		}
		if where := findInDir(t, filepath.Join(nr.dataDir, "sandboxes", info.ID), []byte(s)); where != "" {
			t.Errorf("a secret value is in the sandbox's files: %s", where)
		}
	}
	// The search can find what is there: a value the sandbox was given.
	planted := randomSecret(t)
	run(t, nr.m, info, "echo "+planted+" > /tmp/planted; (sleep 30 &)")
	if findInDir(t, filepath.Join(nr.dataDir, "sandboxes", info.ID), []byte(planted)) == "" {
		t.Error("the file search does not find a planted value: it proves nothing")
	}
	if findInSandboxMemory(t, info.ID, planted) == "" {
		t.Error("the memory search does not find a planted value: it proves nothing")
	}

	// A server restart: the re-adopted sandbox keeps its rules (from its
	// record) and its trust (the CA is the data dir's).
	nr.stop()
	nr.start(t)
	out, code = run(t, nr.m, info, "curl -sS --max-time 5 https://"+netpolicytest.RulesHost+"/after-restart")
	if code != 0 || !strings.Contains(out, "recorded request") {
		t.Fatalf("after a restart: %q (exit %d)", out, code)
	}
	if reqs := es.Requests(); reqs[len(reqs)-1].Path != "/after-restart" || reqs[len(reqs)-1].Header.Get("Authorization") != "Token "+secret2 {
		t.Errorf("after a restart the server got %+v", reqs[len(reqs)-1])
	}
}

// TestEgressRuleErrors: what cannot work is refused at create and update
// with ErrInvalid, and a secret deleted after create fails the request
// inside the sandbox with a 502 saying so, never a request without it.
func TestEgressRuleErrors(t *testing.T) {
	nr := newNetRig(t)
	es := nr.inet.StartEgress(t)
	nr.egressRoots.AppendCertsFromPEM(es.CAPEM)
	nr.secrets.set("present", "v")
	ctx := context.Background()
	bad := map[string]*sandbox.NetworkConfig{
		"unknown secret": {Rules: authRules(netpolicytest.RulesHost, "${e2b.secrets.nope}")},
		"blocked host": {DenyOut: []string{netpolicy.AllTraffic}, AllowOut: []string{"allowed.test"},
			Rules: authRules(netpolicytest.RulesHost, "x")},
		"bad header name":   {Rules: map[string][]netpolicy.Rule{"a.test": {{Transform: &netpolicy.Transform{Headers: map[string]string{"Bad Name": "x"}}}}}},
		"framing header":    {Rules: map[string][]netpolicy.Rule{"a.test": {{Transform: &netpolicy.Transform{Headers: map[string]string{"Content-Length": "1"}}}}}},
		"bad key":           {Rules: authRules("not a host", "x")},
		"proxy on loopback": {EgressProxy: &netpolicy.EgressProxy{Address: "127.0.0.1:1080"}},
		"proxy private":     {EgressProxy: &netpolicy.EgressProxy{Address: netpolicytest.Private192.String() + ":1080"}},
		"proxy no port":     {EgressProxy: &netpolicy.EgressProxy{Address: netpolicytest.Web2.String()}},
		"password alone":    {EgressProxy: &netpolicy.EgressProxy{Address: netpolicytest.SOCKSAddr.String(), Password: "p"}},
	}
	for name, n := range bad {
		_, err := nr.m.Create(ctx, sandbox.CreateRequest{Template: "base", Timeout: time.Minute, Network: n})
		if !errors.Is(err, sandbox.ErrInvalid) {
			t.Errorf("%s: Create = %v, want ErrInvalid", name, err)
		}
	}
	info := nr.create(t, sandbox.CreateRequest{Network: &sandbox.NetworkConfig{
		Rules: authRules(netpolicytest.RulesHost, "${e2b.secrets.present}"),
	}})
	err := nr.m.UpdateNetwork(ctx, info.ID, sandbox.NetworkUpdate{Rules: authRules(netpolicytest.RulesHost, "${e2b.secrets.nope}")})
	if !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("UpdateNetwork with an unknown secret = %v, want ErrInvalid", err)
	}
	// Deleted after the rule was accepted.
	nr.secrets.mu.Lock()
	delete(nr.secrets.m, "present")
	nr.secrets.mu.Unlock()
	before := len(es.Requests())
	out, _ := run(t, nr.m, info, "curl -sS --max-time 5 -w ' %{http_code}' https://"+netpolicytest.RulesHost+"/x")
	if !strings.Contains(out, "502") || !strings.Contains(out, `secret "present" does not exist`) {
		t.Errorf("request with a deleted secret: %q, want a 502 naming it", out)
	}
	if len(es.Requests()) != before {
		t.Error("the request went out without its secret")
	}
}

// TestEgressProxySOCKS: with an egressProxy every TCP connection the
// policy allows goes through it (any port; a name the sandbox resolved
// through an allowOut domain as ATYP=domain); the credentials never enter
// the sandbox; a wrong password or a dead proxy fails the sandbox's
// connection instead of going direct; the policy still applies first.
func TestEgressProxySOCKS(t *testing.T) {
	nr := newNetRig(t)
	es := nr.inet.StartEgress(t)
	proxyCfg := &netpolicy.EgressProxy{Address: netpolicytest.SOCKSAddr.String(), Username: netpolicytest.SOCKSUser, Password: netpolicytest.SOCKSPassword}
	info := nr.create(t, sandbox.CreateRequest{Network: &sandbox.NetworkConfig{EgressProxy: proxyCfg}})
	web1 := "http://" + netpolicytest.Web1.String() + "/"
	mustReach(t, nr.m, info, web1, "hello from 198.51.100.10")
	if !hasTarget(es.SOCKSConns(), netpolicytest.Web1.String()+":80", false) {
		t.Errorf("the connection did not go through the SOCKS proxy: %+v", es.SOCKSConns())
	}
	// Another port: the HTTPS stand-in, TLS end to end (no rules here).
	out, code := run(t, nr.m, info, "curl -sk --max-time 5 https://"+netpolicytest.Web2.String()+"/p")
	if code != 0 || !strings.Contains(out, "recorded request") {
		t.Errorf("https through the proxy: %q (exit %d)", out, code)
	}
	if !hasTarget(es.SOCKSConns(), netpolicytest.HTTPSAddr.String(), false) {
		t.Errorf("port 443 did not go through the SOCKS proxy: %+v", es.SOCKSConns())
	}
	// IPv6 (the rig gives sandboxes IPv6): not tunnelled, so refused at
	// once with a reset rather than sent around the proxy; a plain
	// sandbox reaches the same host over IPv6.
	web6 := "http://[" + netpolicytest.Web6.String() + "]/"
	start := time.Now()
	mustNotReach(t, nr.m, info, web6)
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("IPv6 from a proxied sandbox took %s to fail: dropped, not refused", d)
	}
	plain := nr.create(t, sandbox.CreateRequest{})
	mustReach(t, nr.m, plain, web6, "hello from "+netpolicytest.Web6.String())
	// Nor does UDP leave a proxied sandbox (the proxy carries TCP only, and
	// nothing may go around it); the same datagram from a plain one arrives.
	sink := netpolicytest.UDPSink
	for _, sb := range []sandbox.Info{info, plain} {
		run(t, nr.m, sb, fmt.Sprintf("for i in 1 2 3; do echo -n udp-%s > /dev/udp/%s/%d; sleep 0.1; done", sb.ID, sink.Addr(), sink.Port()))
	}
	waitFor(t, 5*time.Second, "the plain sandbox's datagram", func() bool { return len(nr.inet.UDPFrom("udp-"+plain.ID)) > 0 })
	if got := nr.inet.UDPFrom("udp-" + info.ID); len(got) > 0 {
		t.Errorf("UDP left a proxied sandbox around its proxy (from %v)", got)
	}
	if where := findInSandboxMemory(t, info.ID, netpolicytest.SOCKSPassword); where != "" {
		t.Errorf("the proxy password is in the sandbox's memory: %s", where)
	}

	// Domain allow-list: the name goes to the proxy (remote DNS).
	dom := nr.create(t, sandbox.CreateRequest{Network: &sandbox.NetworkConfig{
		EgressProxy: proxyCfg, AllowOut: []string{"allowed.test"}, DenyOut: []string{netpolicy.AllTraffic},
	}})
	mustReach(t, nr.m, dom, "http://allowed.test/", "hello from 203.0.113.10")
	if !hasTarget(es.SOCKSConns(), "allowed.test:80", true) {
		t.Errorf("an allowOut domain did not go to the proxy by name: %+v", es.SOCKSConns())
	}
	n := len(es.SOCKSConns())
	mustNotReach(t, nr.m, dom, web1) // the policy first: never reaches the proxy
	if len(es.SOCKSConns()) != n {
		t.Errorf("a connection the policy denies reached the proxy: %+v", es.SOCKSConns()[n:])
	}

	// Fail closed.
	wrong := *proxyCfg
	wrong.Password = "wrong"
	w := nr.create(t, sandbox.CreateRequest{Network: &sandbox.NetworkConfig{EgressProxy: &wrong}})
	mustNotReach(t, nr.m, w, web1)
	dead := nr.create(t, sandbox.CreateRequest{Network: &sandbox.NetworkConfig{
		EgressProxy: &netpolicy.EgressProxy{Address: netpolicytest.Web1.String() + ":1081"},
	}})
	mustNotReach(t, nr.m, dead, web1)

	// Taken away by updateNetwork: direct again.
	if err := nr.m.UpdateNetwork(context.Background(), dead.ID, sandbox.NetworkUpdate{}); err != nil {
		t.Fatal(err)
	}
	mustReach(t, nr.m, dead, web1, "hello from 198.51.100.10")

	// Killing them leaves no interception behind.
	nr.m.KillAll(context.Background())
	nr.assertClean(t, []string{info.ID, dom.ID, w.ID, dead.ID, plain.ID})
}

func hasPath(reqs []netpolicytest.Request, p string) bool {
	for _, r := range reqs {
		if r.Path == p {
			return true
		}
	}
	return false
}

func hasTarget(cs []netpolicytest.SOCKSConn, target string, domain bool) bool {
	for _, c := range cs {
		if c.Target == target && c.Domain == domain && c.User == netpolicytest.SOCKSUser {
			return true
		}
	}
	return false
}

func waitFor(t *testing.T, d time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// findInSandboxMemory searches the readable memory of every process in the
// sandbox's cgroup for s and says where it is ("" if nowhere).
func findInSandboxMemory(t *testing.T, id, s string) string {
	t.Helper()
	procs, _ := os.ReadDir("/proc")
	found := 0
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if err != nil || !bytes.Contains(cg, []byte(id)) {
			continue
		}
		found++
		if where := findInProcess(pid, []byte(s)); where != "" {
			return where
		}
	}
	if found == 0 {
		t.Fatalf("no process of sandbox %s found", id)
	}
	return ""
}

func findInProcess(pid int, needle []byte) string {
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return ""
	}
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		return ""
	}
	defer mem.Close()
	for _, line := range strings.Split(string(maps), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || !strings.HasPrefix(f[1], "r") {
			continue
		}
		lo, hi, ok := strings.Cut(f[0], "-")
		if !ok {
			continue
		}
		start, _ := strconv.ParseUint(lo, 16, 64)
		end, _ := strconv.ParseUint(hi, 16, 64)
		if end <= start || end-start > 1<<30 {
			continue
		}
		buf := make([]byte, end-start)
		n, _ := mem.ReadAt(buf, int64(start))
		if bytes.Contains(buf[:n], needle) {
			comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
			return fmt.Sprintf("pid %d (%s) at %s", pid, strings.TrimSpace(string(comm)), line)
		}
	}
	return ""
}

// findInDir searches the regular files under dir (not crossing into mounts:
// the upper layer holds what the sandbox wrote).
func findInDir(t *testing.T, dir string, needle []byte) string {
	t.Helper()
	var where string
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || where != "" {
			return nil
		}
		if d.IsDir() && p != dir && isMountPoint(p) {
			return filepath.SkipDir
		}
		if !d.Type().IsRegular() {
			return nil
		}
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, needle) {
			where = p
		}
		return nil
	})
	return where
}

func isMountPoint(p string) bool {
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(mi), "\n") {
		if f := strings.Fields(l); len(f) > 4 && f[4] == p {
			return true
		}
	}
	return false
}

// TestEgressRulesAcrossPauseAndGVisor: the trust store and the interception
// hold on both runtimes and through a pause with memory (the restored
// sandbox keeps its mounts and its network).
func TestEgressRulesAcrossPauseAndGVisor(t *testing.T) {
	nr := newNetRig(t)
	testenv.NeedRunsc(t)
	es := nr.inet.StartEgress(t)
	nr.egressRoots.AppendCertsFromPEM(es.CAPEM)
	secret := randomSecret(t)
	nr.secrets.set("tok", secret)
	gv, err := gvisor.New(filepath.Join(nr.dataDir, "runtime-gvisor"), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	m := sandbox.New(sandbox.Options{
		Runtime: nr.rt, Runtimes: []runtime.Runtime{gv}, Store: nr.db, Templates: twoRuntimes{nr.tpl},
		DataDir: nr.dataDir, EnvdPath: nr.envd, MaxTimeout: time.Hour,
		Network: nr.net, EgressTrust: nr.egressCA, Secrets: nr.secrets,
	})
	m.Start()
	t.Cleanup(func() { m.KillAll(ctx); m.Close() })
	for _, tpl := range []string{"base", "base-gvisor"} {
		info, err := m.Create(ctx, sandbox.CreateRequest{Template: tpl, Timeout: 5 * time.Minute, Secure: true,
			Network: &sandbox.NetworkConfig{Rules: authRules(netpolicytest.RulesHost, "Bearer ${e2b.secrets.tok}")}})
		if err != nil {
			t.Fatalf("%s: Create: %v", tpl, err)
		}
		get := func(path string) {
			t.Helper()
			out, code := run(t, m, info, "curl -sS --max-time 5 https://"+netpolicytest.RulesHost+path)
			if code != 0 || !strings.Contains(out, "recorded request") {
				t.Fatalf("%s: %s: %q (exit %d)", tpl, path, out, code)
			}
			for _, r := range es.Requests() {
				if r.Path == path && r.Header.Get("Authorization") != "Bearer "+secret {
					t.Errorf("%s: %s arrived with Authorization %q", tpl, path, r.Header.Get("Authorization"))
				}
			}
			if !hasPath(es.Requests(), path) {
				t.Errorf("%s: %s never arrived", tpl, path)
			}
		}
		get("/" + tpl + "-before")
		if err := m.Pause(ctx, info.ID, sandbox.PauseOptions{}); err != nil {
			t.Fatalf("%s: Pause: %v", tpl, err)
		}
		if _, resumed, err := m.Connect(ctx, info.ID, time.Minute); err != nil || !resumed {
			t.Fatalf("%s: Connect: resumed=%v err=%v", tpl, resumed, err)
		}
		get("/" + tpl + "-after")
	}
}
