package bench_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/bench"
	"github.com/airlock-sandbox/airlock/internal/daemon/daemontest"
	"github.com/airlock-sandbox/airlock/internal/template"
)

// TestTemplateBuilds runs `airlock bench templates`' build half once per
// path on a real server, so that it cannot rot: every path builds (the Go
// client's hash and upload are checked by the server, and a build that
// fails fails the run), every row has its sample, each API row is compared
// with `airlock template build` against the target, and nothing the bench
// built is left. The npm SDK rows run when tests/sdk has its node_modules.
func TestTemplateBuilds(t *testing.T) {
	d := daemontest.Start(t, nil)
	sdk, _ := filepath.Abs("../../tests/sdk")
	_, nodeErr := exec.LookPath("node")
	_, sdkErr := os.Stat(filepath.Join(sdk, "node_modules", "e2b"))
	withNode := nodeErr == nil && sdkErr == nil

	rows, err := bench.TemplateBuilds(context.Background(), bench.BuildsConfig{
		APIURL: d.APIURL, APIKey: d.APIKeys[0], Store: d.Templates, Base: "base",
		Iterations: 1, SDKDir: sdk,
	})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	bench.Print(&out, rows)
	t.Logf("\n%s", out.String())

	if len(rows) != 8 {
		t.Fatalf("%d rows, want cold and cached for four paths: %+v", len(rows), rows)
	}
	for i, r := range rows {
		node := strings.Contains(r.Name, "npm e2b")
		if node && !withNode {
			if len(r.Samples) != 0 || !strings.HasPrefix(r.Note, "skipped") {
				t.Errorf("%s: without node or tests/sdk/node_modules: %d samples, note %q", r.Name, len(r.Samples), r.Note)
			}
			continue
		}
		if len(r.Samples) != 1 || r.Samples[0] <= 0 {
			t.Errorf("%s: samples %v, want one", r.Name, r.Samples)
		}
		api := i%4 != 0
		if api && !strings.Contains(r.Note, "to template build; target <=") {
			t.Errorf("%s: note %q does not compare with template build", r.Name, r.Note)
		}
	}
	for _, name := range []string{"bench-build-cli", "bench-build-api-go", "bench-build-api-go-fastpoll", "bench-build-api-node"} {
		if _, err := d.Templates.Get(name); !errors.Is(err, template.ErrNotFound) {
			t.Errorf("template %s left behind: %v", name, err)
		}
	}
}

func TestTemplateBuildsNeedsIterations(t *testing.T) {
	_, err := bench.TemplateBuilds(context.Background(), bench.BuildsConfig{Iterations: 0})
	if err == nil {
		t.Fatal("0 iterations accepted")
	}
}

// The notes say what the API path adds to `airlock template build`.
func TestAddedNote(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		var s []time.Duration
		for _, x := range v {
			s = append(s, time.Duration(x)*time.Millisecond)
		}
		return s
	}
	cases := []struct {
		s, base []time.Duration
		cold    bool
		want    string
	}{
		{ms(1100, 1050, 1300), ms(1000, 990, 1200), true, "adds +100 ms (+10.0%) to template build; target <= 10%: met"},
		{ms(1200), ms(1000), true, "adds +200 ms (+20.0%) to template build; target <= 10%: MISSED"},
		{ms(300), ms(5), false, "adds +295 ms to template build; target <= 1s: met"},
		{ms(1500), ms(100), false, "adds +1400 ms to template build; target <= 1s: MISSED"},
	}
	for _, c := range cases {
		if got := bench.AddedNote(c.s, c.base, c.cold); got != c.want {
			t.Errorf("AddedNote(%v, %v, %v) = %q, want %q", c.s, c.base, c.cold, got, c.want)
		}
	}
}
