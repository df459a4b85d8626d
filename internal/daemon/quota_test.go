package daemon_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/apikey"
	"github.com/airlock-sandbox/airlock/internal/daemon/daemontest"
	"github.com/airlock-sandbox/airlock/internal/e2bclient"
	"github.com/airlock-sandbox/airlock/internal/e2bwire"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// A team's quotas, set over the API, refuse with 429 (507 for disk) what
// would exceed them, naming the quota, its limit and its use, on real
// sandboxes: concurrent sandboxes, vCPUs (a resume too), memory, paused
// sandboxes and their disk; another team is not held back by them.
func TestTeamQuotas(t *testing.T) {
	d := daemontest.Start(t, nil)
	ctx := context.Background()
	admin := daemontest.Client(d, daemontest.Key)
	made, tight := daemontest.TeamKey(t, d, "tight", "quota-test")
	setQuotas := func(q e2bwire.TeamQuotas) {
		t.Helper()
		if _, err := admin.UpdateTeam(ctx, "tight", q); err != nil {
			t.Fatal(err)
		}
	}
	refused := func(err error, quota string) {
		t.Helper()
		var e *e2bclient.Error
		if !errors.As(err, &e) || e.Status != http.StatusTooManyRequests || !strings.Contains(e.Message, quota) {
			t.Fatalf("got %v, want 429 naming %q", err, quota)
		}
	}
	create := func(c *e2bclient.Client) (string, error) {
		sb, err := c.Create(ctx, e2bwire.NewSandbox{TemplateID: "base"})
		return sb.SandboxID, err
	}

	// base sandboxes have 2 vCPUs and 512 MiB each.
	setQuotas(e2bwire.TeamQuotas{Sandboxes: 2})
	a, err := create(tight)
	if err != nil {
		t.Fatal(err)
	}
	b, err := create(tight)
	if err != nil {
		t.Fatal(err)
	}
	_, err = create(tight)
	refused(err, "quota of concurrent sandboxes reached: team tight has 2 running, paused or starting, its limit is 2")
	if _, err := create(admin); err != nil {
		t.Fatalf("another team held back by tight's quota: %v", err)
	}

	setQuotas(e2bwire.TeamQuotas{VCPUs: 4, PausedSandboxes: 1})
	if err := tight.Pause(ctx, b, true); err != nil {
		t.Fatal(err)
	}
	c, err := create(tight) // a and c: 4 vCPUs
	if err != nil {
		t.Fatal(err)
	}
	_, err = create(tight)
	refused(err, "quota of vCPUs reached: team tight's running sandboxes use 4 of its 4 vCPUs, and this one needs 2")
	_, _, err = tight.Connect(ctx, b, time.Minute)
	refused(err, "quota of vCPUs")
	err = tight.Pause(ctx, a, true)
	refused(err, "quota of paused sandboxes reached: team tight has 1 paused, its limit is 1")
	if err := tight.Kill(ctx, a); err != nil {
		t.Fatal(err)
	}
	if _, _, err := tight.Connect(ctx, b, time.Minute); err != nil {
		t.Fatalf("resume once vCPUs are free: %v", err)
	}

	setQuotas(e2bwire.TeamQuotas{MemoryMB: 1024 + 256})
	_, err = create(tight)
	refused(err, "quota of memory reached: team tight's running sandboxes use 1024 of its 1280 MiB, and this one needs 512 MiB")

	// The team's metrics show its sandboxes (sampled every 5 s); another
	// team's answer 404.
	waitFor(t, "tight's metrics to show its two running sandboxes", func() bool {
		var pts []e2bwire.TeamMetric
		st := getJSON(t, d.APIURL+"/teams/tight/metrics", made.Key, &pts)
		return st == http.StatusOK && len(pts) > 0 && pts[len(pts)-1].ConcurrentSandboxes == 2
	})
	team, _ := d.Keys.TeamByRef("default")
	if st := getJSON(t, d.APIURL+"/teams/"+team.ID+"/metrics", made.Key, nil); st != http.StatusNotFound {
		t.Errorf("another team's metrics: %d, want 404", st)
	}

	// The paused sandboxes' disk: the first pause passes (nothing is held
	// yet) and is measured (its image and its writable layer, which holds a
	// 2 MiB file written before it); the next is refused with 507 until a
	// resume gives that disk back.
	setQuotas(e2bwire.TeamQuotas{PausedDiskMB: 1})
	if teams, err := tight.Teams(ctx); err != nil || len(teams) != 1 || teams[0].Quotas == nil || teams[0].Quotas.PausedDiskMB != 1 {
		t.Fatalf("tight's team as listed: %+v, %v", teams, err)
	}
	detail, err := tight.Get(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	ballast := make([]byte, 2<<20)
	if _, err := rand.Read(ballast); err != nil {
		t.Fatal(err)
	}
	if err := tight.Sandbox(b, detail.EnvdAccessToken).WriteFile(ctx, "/home/user/ballast", bytes.NewReader(ballast)); err != nil {
		t.Fatal(err)
	}
	if err := tight.Pause(ctx, b, true); err != nil {
		t.Fatalf("the first pause under the disk quota: %v", err)
	}
	info, err := d.Manager.Get(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	if info.PausedDiskBytes < 2<<20 {
		t.Errorf("paused %s holds %d bytes, want at least the 2 MiB file written in it", b, info.PausedDiskBytes)
	}
	if rec, err := d.Store.Get(ctx, b); err != nil || rec.PausedDiskBytes != info.PausedDiskBytes {
		t.Errorf("the record says %d bytes (%v), the manager %d", rec.PausedDiskBytes, err, info.PausedDiskBytes)
	}
	err = tight.Pause(ctx, c, true)
	var e *e2bclient.Error
	want := fmt.Sprintf("quota of paused sandboxes' disk reached: team tight's paused sandboxes hold %d MiB on disk, its limit is 1 MiB",
		(info.PausedDiskBytes+1<<20-1)>>20)
	if !errors.As(err, &e) || e.Status != http.StatusInsufficientStorage || !strings.Contains(e.Message, want) {
		t.Fatalf("second pause: %v, want 507 naming %q", err, want)
	}
	if got, err := d.Manager.Get(ctx, c); err != nil || got.State != sandbox.StateRunning {
		t.Fatalf("the refused pause touched %s: %+v, %v", c, got, err)
	}
	if _, _, err := tight.Connect(ctx, b, time.Minute); err != nil {
		t.Fatal(err)
	}
	if info, err := d.Manager.Get(ctx, b); err != nil || info.PausedDiskBytes != 0 {
		t.Errorf("resumed %s still counts %d bytes paused (%v)", b, info.PausedDiskBytes, err)
	}
	if err := tight.Pause(ctx, c, true); err != nil {
		t.Fatalf("pause once the disk was given back: %v", err)
	}

	// Only an admin sets quotas.
	if _, err := tight.UpdateTeam(ctx, "tight", e2bwire.TeamQuotas{}); err == nil || !strings.Contains(err.Error(), string(apikey.KeysAdmin)) {
		t.Errorf("a team key set its own quotas: %v", err)
	}
}

// getJSON GETs url with key and decodes a 200 answer into out.
func getJSON(t *testing.T, url, key string, out any) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set(e2bwire.HeaderAPIKey, key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK && out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			t.Fatal(err)
		}
	}
	return resp.StatusCode
}
