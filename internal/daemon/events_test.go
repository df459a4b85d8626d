package daemon_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/daemon"
	"github.com/airlock-sandbox/airlock/internal/daemon/daemontest"
	"github.com/airlock-sandbox/airlock/internal/e2bclient"
	"github.com/airlock-sandbox/airlock/internal/e2bwire"
	"github.com/airlock-sandbox/airlock/internal/lifecycle"
	"github.com/airlock-sandbox/airlock/internal/runtime/linux"
)

// otherKey is a second API key of the events tests' servers: it must see
// none of the first key's events.
const otherKey = "e2b_daemontestother000000000000000000000"

// eventsServer starts a server with sandbox networking (for network
// updates) and both keys, on dataDir, that leaves its sandboxes running
// when closed unless kill.
func eventsServer(t *testing.T, dataDir string, kill bool) (*daemon.Daemon, *e2bclient.Client) {
	t.Helper()
	d := daemontest.Start(t, func(c *daemon.Config) {
		c.DataDir = dataDir
		c.KillOnClose = kill
		c.APIKeys = []string{daemontest.Key, otherKey}
		c.Network = daemon.NetworkConfig{Enabled: true, DNSListen: "127.0.0.1:0"}
	})
	return d, e2bclient.New(e2bclient.Config{APIURL: d.APIURL, SandboxURL: d.SandboxURL, APIKey: daemontest.Key})
}

// call sends one API request with key and returns the status and body.
func call(t *testing.T, method, url, key string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(e2bwire.HeaderAPIKey, key)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func events(t *testing.T, d *daemon.Daemon, key, path string) []lifecycle.Event {
	t.Helper()
	status, body := call(t, "GET", d.APIURL+path, key, nil)
	if status != 200 {
		t.Fatalf("GET %s: %d %s", path, status, body)
	}
	var evs []lifecycle.Event
	if err := json.Unmarshal(body, &evs); err != nil {
		t.Fatalf("GET %s: %v: %s", path, err, body)
	}
	return evs
}

func data(t *testing.T, e lifecycle.Event) lifecycle.EventData {
	t.Helper()
	var d lifecycle.EventData
	if err := json.Unmarshal(e.EventData, &d); err != nil {
		t.Fatalf("eventData of %s: %v: %s", e.Type, err, e.EventData)
	}
	return d
}

func typesOf(evs []lifecycle.Event) string {
	var s []string
	for _, e := range evs {
		s = append(s, strings.TrimPrefix(e.Type, "sandbox.lifecycle."))
	}
	return strings.Join(s, " ")
}

// TestLifecycleEvents walks a sandbox through every transition through the
// E2B API, then reads its events back: their order, payloads, executions,
// kill reasons (request, timeout, orphaned at restart), paging, bad
// queries, scoping to the key, and that they outlive the sandbox and a
// restart of the server.
func TestLifecycleEvents(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dataDir := t.TempDir()
	d, c := eventsServer(t, dataDir, false)

	sb, err := c.Create(ctx, e2bwire.NewSandbox{TemplateID: "base", Metadata: map[string]any{"job": "events"}})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.SandboxID
	if err := c.SetTimeout(ctx, id, 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	if st, b := call(t, "PUT", d.APIURL+"/sandboxes/"+id+"/network", daemontest.Key,
		map[string]any{"allowOut": []string{"1.1.1.1", "example.com"}, "denyOut": []string{"0.0.0.0/0"}}); st != 204 && st != 200 {
		t.Fatalf("network update: %d %s", st, b)
	}
	if err := c.Pause(ctx, id, true); err != nil {
		t.Fatal(err)
	}
	if _, resumed, err := c.Connect(ctx, id, 10*time.Minute); err != nil || !resumed {
		t.Fatalf("connect: resumed=%v %v", resumed, err)
	}
	snap, err := c.CreateSnapshot(ctx, id, "events-snap")
	if err != nil {
		t.Fatal(err)
	}
	forks, err := c.Fork(ctx, id, 1, 5*time.Minute)
	if err != nil || len(forks) != 1 || forks[0].Sandbox == nil {
		t.Fatalf("fork: %+v %v", forks, err)
	}
	fork := forks[0].Sandbox.SandboxID
	if err := c.Kill(ctx, id); err != nil {
		t.Fatal(err)
	}

	want := "created updated updated paused resumed checkpointed checkpointed killed"
	evs := events(t, d, daemontest.Key, "/events/sandboxes/"+id+"?orderAsc=true&limit=100")
	if got := typesOf(evs); got != want {
		t.Fatalf("events of the sandbox: %q, want %q", got, want)
	}
	owner := evs[0].SandboxTeamID
	for i, e := range evs {
		if e.Version != "v1" || len(e.ID) != 36 || e.SandboxID != id || e.SandboxTemplateID != "base" || owner == "" || e.SandboxTeamID != owner || e.SandboxBuildID == "" {
			t.Fatalf("event %d: %+v", i, e)
		}
		if md := data(t, e).SandboxMetadata; md["job"] != "events" {
			t.Fatalf("event %d (%s): metadata %v", i, e.Type, md)
		}
		if i > 0 && e.Timestamp.Before(evs[i-1].Timestamp) {
			t.Fatalf("event %d is older than the one before it", i)
		}
	}
	// One execution until the pause, another from the resume.
	first, second := evs[0].SandboxExecutionID, evs[4].SandboxExecutionID
	if first == "" || second == "" || first == second {
		t.Fatalf("executions: %q then %q", first, second)
	}
	for i, e := range evs {
		if want := map[bool]string{true: first, false: second}[i < 4]; e.SandboxExecutionID != want {
			t.Fatalf("event %d (%s) names execution %q, want %q", i, e.Type, e.SandboxExecutionID, want)
		}
	}
	if ts := data(t, evs[1]).SetTimeout; ts == "" {
		t.Fatalf("timeout update carries no set_timeout: %s", evs[1].EventData)
	} else if at, err := time.Parse(time.RFC3339, ts); err != nil || time.Until(at) < 8*time.Minute {
		t.Fatalf("set_timeout %q: %v", ts, err)
	}
	if n := data(t, evs[2]).NetworkEgress; n == nil || fmt.Sprint(n.AllowedCIDRs, n.AllowedDomains, n.DeniedCIDRs) != "[1.1.1.1] [example.com] [0.0.0.0/0]" {
		t.Fatalf("network update: %s", evs[2].EventData)
	}
	for _, i := range []int{3, 7} {
		x := data(t, evs[i]).Execution
		if x == nil || x.VCPUCount < 1 || x.MemoryMB < 1 || x.ExecutionTime <= 0 || x.StartedAt == "" {
			t.Fatalf("%s carries no execution: %s", evs[i].Type, evs[i].EventData)
		}
	}
	if x := data(t, evs[7]).Execution; x.StartedAt < data(t, evs[3]).Execution.StartedAt {
		t.Fatalf("the killed execution started before the paused one: %s / %s", evs[7].EventData, evs[3].EventData)
	}
	if s := data(t, evs[5]).SnapshotID; s != snap.SnapshotID {
		t.Fatalf("snapshot checkpoint names %q, the snapshot is %q", s, snap.SnapshotID)
	}
	if n := data(t, evs[6]).ForkCount; n != 1 {
		t.Fatalf("fork checkpoint: %s", evs[6].EventData)
	}
	if r := data(t, evs[7]).KillReason; r != lifecycle.KillRequest {
		t.Fatalf("kill reason %q, want %q", r, lifecycle.KillRequest)
	}
	forkEvs := events(t, d, daemontest.Key, "/events/sandboxes/"+fork)
	if typesOf(forkEvs) != "created" || forkEvs[0].SandboxExecutionID == second {
		t.Fatalf("the fork's events: %q %+v", typesOf(forkEvs), forkEvs)
	}

	// A sandbox that reaches its timeout.
	short, err := c.Create(ctx, e2bwire.NewSandbox{TemplateID: "base", Timeout: ptr(int64(1))})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		evs := events(t, d, daemontest.Key, "/events/sandboxes/"+short.SandboxID)
		if len(evs) > 0 && evs[0].Type == lifecycle.Killed {
			if r := data(t, evs[0]).KillReason; r != lifecycle.KillTimeout {
				t.Fatalf("timed-out sandbox's kill reason %q", r)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no killed event 30 s after a 1 s timeout: %q", typesOf(evs))
		}
		time.Sleep(200 * time.Millisecond)
	}

	// The key's events: newest first; paging walks them all once.
	all := events(t, d, daemontest.Key, "/events/sandboxes?limit=100")
	if len(all) != 8+1+2 || all[0].Type != lifecycle.Killed || all[0].SandboxID != short.SandboxID {
		t.Fatalf("the key's events: %d, newest %+v", len(all), all[0])
	}
	var paged []string
	for off := 0; off < len(all)+3; off += 3 {
		for _, e := range events(t, d, daemontest.Key, fmt.Sprintf("/events/sandboxes?limit=3&offset=%d", off)) {
			paged = append(paged, e.ID)
		}
	}
	for i, e := range all {
		if i >= len(paged) || paged[i] != e.ID {
			t.Fatalf("pages of 3 differ from one page at %d: %v", i, paged)
		}
	}
	if got := events(t, d, daemontest.Key, "/events/sandboxes?types=sandbox.lifecycle.paused&types=sandbox.lifecycle.resumed"); typesOf(got) != "resumed paused" {
		t.Fatalf("types filter: %q", typesOf(got))
	}
	if got := events(t, d, daemontest.Key, "/events/sandboxes"); len(got) != 10 {
		t.Fatalf("default limit: %d events", len(got))
	}
	// Bad queries are 400s that say what was wrong.
	for q, msg := range map[string]string{
		"limit=0": "limit", "limit=101": "limit", "limit=x": "limit", "offset=-1": "offset",
		"orderAsc=maybe": "orderAsc", "types=sandbox.lifecycle.exploded": "types",
	} {
		st, body := call(t, "GET", d.APIURL+"/events/sandboxes?"+q, daemontest.Key, nil)
		if st != 400 || !strings.Contains(string(body), msg) {
			t.Fatalf("?%s: %d %s", q, st, body)
		}
	}
	if st, body := call(t, "GET", d.APIURL+"/events/sandboxes/NOT_AN_ID", daemontest.Key, nil); st != 400 {
		t.Fatalf("bad sandbox id: %d %s", st, body)
	}
	// Another key sees none of it.
	if got := events(t, d, otherKey, "/events/sandboxes?limit=100"); len(got) != 0 {
		t.Fatalf("another key sees %d events", len(got))
	}
	if got := events(t, d, otherKey, "/events/sandboxes/"+id); len(got) != 0 {
		t.Fatalf("another key sees the sandbox's events: %q", typesOf(got))
	}

	// A restart: the events stay; a sandbox whose processes did not
	// survive it is reported killed as orphaned, and one that did is
	// re-adopted with its execution.
	lost, err := c.Create(ctx, e2bwire.NewSandbox{TemplateID: "base"})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	rt, err := linux.New(d.Layout.Runtime("linux"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if s, err := rt.Load(lost.SandboxID); err != nil {
		t.Fatalf("load the sandbox to lose: %v", err)
	} else if err := s.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	d2, c2 := eventsServer(t, dataDir, true)
	if got := events(t, d2, daemontest.Key, "/events/sandboxes/"+id+"?orderAsc=true&limit=100"); typesOf(got) != want || got[0].ID != evs[0].ID {
		t.Fatalf("after a restart the events are %q", typesOf(got))
	}
	lostEvs := events(t, d2, daemontest.Key, "/events/sandboxes/"+lost.SandboxID)
	if typesOf(lostEvs) != "killed created" || data(t, lostEvs[0]).KillReason != lifecycle.KillOrphaned ||
		lostEvs[0].SandboxExecutionID != lostEvs[1].SandboxExecutionID {
		t.Fatalf("a sandbox lost in a restart: %q %s", typesOf(lostEvs), lostEvs[0].EventData)
	}
	// The fork survived: its events go on in the execution it had.
	if err := c2.Kill(ctx, fork); err != nil {
		t.Fatal(err)
	}
	forkEvs = events(t, d2, daemontest.Key, "/events/sandboxes/"+fork)
	if typesOf(forkEvs) != "killed created" || forkEvs[0].SandboxExecutionID != forkEvs[1].SandboxExecutionID {
		t.Fatalf("the re-adopted fork's events: %q %+v", typesOf(forkEvs), forkEvs)
	}
}

func ptr[T any](v T) *T { return &v }

// TestLifecycleEventsRetention: the server drops events older than
// --events-retention, a killed sandbox's included, and keeps newer ones.
func TestLifecycleEventsRetention(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d := daemontest.Start(t, func(c *daemon.Config) { c.EventsRetention = 3 * time.Second })
	c := e2bclient.New(e2bclient.Config{APIURL: d.APIURL, SandboxURL: d.SandboxURL, APIKey: daemontest.Key})
	old, err := c.Create(ctx, e2bwire.NewSandbox{TemplateID: "base"})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Kill(ctx, old.SandboxID); err != nil {
		t.Fatal(err)
	}
	if got := events(t, d, daemontest.Key, "/events/sandboxes/"+old.SandboxID); typesOf(got) != "killed created" {
		t.Fatalf("the killed sandbox's events before the retention: %q", typesOf(got))
	}
	deadline := time.Now().Add(20 * time.Second)
	for len(events(t, d, daemontest.Key, "/events/sandboxes/"+old.SandboxID)) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("a killed sandbox's events outlive a 3 s retention by 20 s")
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Newer events stay until their own time comes.
	fresh, err := c.Create(ctx, e2bwire.NewSandbox{TemplateID: "base"})
	if err != nil {
		t.Fatal(err)
	}
	if got := events(t, d, daemontest.Key, "/events/sandboxes/"+fresh.SandboxID); typesOf(got) != "created" {
		t.Fatalf("a new sandbox's events right after pruning: %q", typesOf(got))
	}
}
