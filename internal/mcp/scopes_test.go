package mcp

import (
	"context"
	"slices"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/apikey"
)

// Every tool has its scope written down, and a key sees exactly the tools
// its scopes allow: a read-only key lists and reads, and cannot create.
func TestToolScopes(t *testing.T) {
	ctx := context.Background()
	names := func(opts Options) []string {
		res, err := connectClientWith(t, newFullBackend(), opts).ListTools(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, tl := range res.Tools {
			out = append(out, tl.Name)
		}
		slices.Sort(out)
		return out
	}
	all := names(Options{})
	for _, n := range all {
		if _, ok := toolScopes[n]; !ok {
			t.Errorf("tool %s has no scope in toolScopes", n)
		}
	}
	if got := names(Options{Scopes: apikey.All}); !slices.Equal(got, all) {
		t.Errorf("every scope: %v, want %v", got, all)
	}
	ro := names(Options{Scopes: []apikey.Scope{apikey.SandboxesRead}})
	want := []string{"get_metrics", "list_sandboxes", "list_snapshots", "sandbox_events", "sandbox_logs"}
	if !slices.Equal(ro, want) {
		t.Errorf("sandboxes:read alone: %v, want %v", ro, want)
	}
	if got := names(Options{Scopes: []apikey.Scope{apikey.VolumesRead}}); !slices.Equal(got, []string{"get_volume", "list_volumes"}) {
		t.Errorf("volumes:read alone: %v", got)
	}
}
