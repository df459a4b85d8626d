package daemon_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/daemon/daemontest"
	"github.com/airlock-sandbox/airlock/internal/e2bclient"
	"github.com/airlock-sandbox/airlock/internal/e2bwire"
	"github.com/airlock-sandbox/airlock/internal/mcp"
)

// Snapshot names are per team: two teams snapshot under one name, each
// starts a sandbox from "its" name and finds its own file, each lists its
// own only, and team A deleting its snapshot (through the MCP tool's
// backend, whose lookup is the team's) leaves team B's.
func TestSnapshotNamesPerTeam(t *testing.T) {
	d := daemontest.Start(t, nil)
	ctx := context.Background()
	cfg := e2bclient.Config{APIURL: d.APIURL, SandboxURL: d.SandboxURL, APIKey: daemontest.Key}
	teamA := e2bclient.New(cfg)
	_, teamB := daemontest.TeamKey(t, d, "snapnames-b", "snapnames-test")

	const name, file = "nightly", "/home/user/team.txt"
	teams := []struct {
		label   string
		c       *e2bclient.Client
		content string
	}{{"A", teamA, "made by team A"}, {"B", teamB, "made by team B"}}

	for _, tm := range teams {
		sb, err := tm.c.Create(ctx, e2bwire.NewSandbox{TemplateID: "base"})
		if err != nil {
			t.Fatalf("team %s: create: %v", tm.label, err)
		}
		if err := tm.c.Sandbox(sb.SandboxID, sb.EnvdAccessToken).WriteFile(ctx, file, strings.NewReader(tm.content)); err != nil {
			t.Fatalf("team %s: write: %v", tm.label, err)
		}
		// Team B's snapshot takes the name team A has: neither a 409 nor a
		// replacement of A's.
		snap, err := tm.c.CreateSnapshot(ctx, sb.SandboxID, name)
		if err != nil {
			t.Fatalf("team %s: snapshot as %q: %v", tm.label, name, err)
		}
		if snap.SnapshotID != name+":default" {
			t.Fatalf("team %s: snapshot %+v", tm.label, snap)
		}
		if err := tm.c.Kill(ctx, sb.SandboxID); err != nil {
			t.Fatalf("team %s: kill: %v", tm.label, err)
		}
	}

	// startFrom starts a sandbox from ref as c's team and returns the file
	// it finds.
	startFrom := func(c *e2bclient.Client, ref string) (string, error) {
		t.Helper()
		sb, err := c.Create(ctx, e2bwire.NewSandbox{TemplateID: ref})
		if err != nil {
			return "", err
		}
		defer func() {
			if err := c.Kill(ctx, sb.SandboxID); err != nil {
				t.Errorf("kill %s: %v", sb.SandboxID, err)
			}
		}()
		rc, err := c.Sandbox(sb.SandboxID, sb.EnvdAccessToken).ReadFile(ctx, file)
		if err != nil {
			t.Fatalf("read %s in %s: %v", file, sb.SandboxID, err)
		}
		defer rc.Close()
		b, err := io.ReadAll(rc)
		if err != nil {
			t.Fatal(err)
		}
		return string(b), nil
	}
	for _, tm := range teams {
		for _, ref := range []string{name, name + ":default"} {
			if got, err := startFrom(tm.c, ref); err != nil || got != tm.content {
				t.Fatalf("team %s: sandbox from %q has %q, %v; want %q", tm.label, ref, got, err, tm.content)
			}
		}
		ss, err := tm.c.FindSnapshots(ctx, name)
		if err != nil || len(ss) != 1 || ss[0].SnapshotID != name+":default" {
			t.Fatalf("team %s: snapshots named %q: %+v, %v; want its own one", tm.label, name, ss, err)
		}
		all, err := tm.c.ListSnapshots(ctx, "")
		if err != nil || len(all) != 1 {
			t.Fatalf("team %s: lists %+v, %v; want its own snapshot only", tm.label, all, err)
		}
	}

	if err := mcp.NewHTTPBackend(cfg).(mcp.PersistBackend).DeleteSnapshot(ctx, name); err != nil {
		t.Fatalf("team A: delete_snapshot %q: %v", name, err)
	}
	var e *e2bclient.Error
	if _, err := startFrom(teamA, name); !errors.As(err, &e) || e.Status != http.StatusNotFound {
		t.Fatalf("team A: create from its deleted snapshot: %v, want 404", err)
	}
	if err := teamA.DeleteSnapshot(ctx, name); !errors.As(err, &e) || e.Status != http.StatusNotFound {
		t.Fatalf("team A: delete again: %v, want 404 (team B's is not A's to delete)", err)
	}
	if got, err := startFrom(teamB, name); err != nil || got != teams[1].content {
		t.Fatalf("team B: sandbox from %q after A's delete has %q, %v; want %q", name, got, err, teams[1].content)
	}
	if ss, err := teamB.FindSnapshots(ctx, name); err != nil || len(ss) != 1 {
		t.Fatalf("team B: snapshots named %q after A's delete: %+v, %v", name, ss, err)
	}
}
