// Package daemontest starts whole Airlock servers for tests: the same
// internal/daemon that `airlock serve` runs, on loopback ports and a fresh
// data dir, over the test data dir's built templates (AIRLOCK_TEST_DATA_DIR),
// with every sandbox killed when the test ends. The servers' logs fail the
// test if they show a panic (testenv.ServerLog).
package daemontest

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/daemon"
	"github.com/airlock-sandbox/airlock/internal/e2bclient"
	"github.com/airlock-sandbox/airlock/internal/e2bwire"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// Key is the API key of every test server.
const Key = "e2b_daemontest0000000000000000000000000000"

// Start starts a server serving the base template, with no network (loopback
// only in sandboxes), no disk pool and no warm pool; edit changes the
// configuration before it starts. The server closes when the test ends.
func Start(t testing.TB, edit func(*daemon.Config)) *daemon.Daemon {
	t.Helper()
	testenv.NeedRoot(t)
	testenv.BaseRootfs(t)
	logs := testenv.NewServerLog(t)
	cfg := daemon.Config{
		APIAddr: "127.0.0.1:0", SandboxAddr: "127.0.0.1:0",
		DataDir: t.TempDir(), TemplateDataDir: testenv.DataDir(),
		EnvdPath:   testenv.EnvdBinary(t),
		MaxTimeout: time.Hour,
		Templates:  []string{"base"},
		APIKeys:    []string{Key},
		// The test's sandboxes die with it; the next test starts clean.
		KillOnClose:  true,
		Logger:       logs.Slog(),
		HTTPErrorLog: logs.ErrorLog(),
		BuildOutput:  io.Discard,
	}
	if edit != nil {
		edit(&cfg)
	}
	d := daemon.New(cfg)
	if err := d.Start(context.Background()); err != nil {
		t.Fatalf("start the server: %v", err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("close the server: %v", err)
		}
	})
	return d
}

// BearerClient is an HTTP client that sends key as a bearer token (what MCP
// clients send to /mcp).
func BearerClient(key string) *http.Client {
	return &http.Client{Transport: bearer{key: key, next: http.DefaultTransport}}
}

type bearer struct {
	key  string
	next http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.key)
	return b.next.RoundTrip(r)
}

// Client is an E2B client of d's API and proxy acting as key.
func Client(d *daemon.Daemon, key string) *e2bclient.Client {
	return e2bclient.New(e2bclient.Config{APIURL: d.APIURL, SandboxURL: d.SandboxURL, APIKey: key})
}

// TeamKey makes a key named name in team (made when missing) with scopes
// (none given: the default), through d's API with the bootstrap Key, and
// returns it with a client acting as it.
func TeamKey(t testing.TB, d *daemon.Daemon, team, name string, scopes ...string) (e2bwire.TeamAPIKey, *e2bclient.Client) {
	t.Helper()
	k, err := Client(d, Key).CreateKey(context.Background(), e2bwire.NewTeamAPIKey{Name: &name, Team: team, Scopes: scopes})
	if err != nil {
		t.Fatal(err)
	}
	return k, Client(d, k.Key)
}
