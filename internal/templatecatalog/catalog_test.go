package templatecatalog

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/e2b"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/template"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// TestInfo: aliases are the template's alias and name (not its id); a
// built-in's id is its only alias.
func TestInfo(t *testing.T) {
	got := Info(template.Template{ID: "t1", Alias: "mine", Name: "mine"})
	if !slices.Equal(got.Aliases, []string{"mine"}) || got.ID != "t1" || !got.Public {
		t.Fatalf("%+v", got)
	}
	if got := Info(template.Template{ID: "base", Name: "base"}); !slices.Equal(got.Aliases, []string{"base"}) {
		t.Fatalf("built-in: %+v", got.Aliases)
	}
}

// TestServed: a catalog limited to the templates a replica serves lists
// and finds those only (another built template is not found, as one that
// never existed), and refuses every change as not supported (501).
func TestServed(t *testing.T) {
	testenv.BaseRootfs(t) // the test data dir has base built
	st, err := template.Open(template.Options{DataDir: testenv.DataDir(), EnvdPath: testenv.EnvdBinary(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	c := Catalog{Store: st, Served: []string{"base"}}
	list, err := c.List(ctx)
	if err != nil || len(list) != 1 || list[0].ID != "base" {
		t.Fatalf("list: %+v %v", list, err)
	}
	if info, err := c.Get(ctx, "base"); err != nil || info.ID != "base" || len(info.Builds) == 0 {
		t.Fatalf("get base: %+v %v", info, err)
	}
	all, err := Catalog{Store: st}.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, other := range all {
		if other.ID == "base" {
			continue
		}
		if _, err := c.Get(ctx, other.ID); !errors.Is(err, e2b.ErrTemplateNotFound) {
			t.Fatalf("a template not served, %s: %v", other.ID, err)
		}
		if _, err := c.Access(ctx, other.ID); !errors.Is(err, e2b.ErrTemplateNotFound) {
			t.Fatalf("access to a template not served, %s: %v", other.ID, err)
		}
		break
	}
	for name, err := range map[string]error{
		"delete":     c.Delete(ctx, "base"),
		"set public": c.SetPublic(ctx, "base", "someone", true),
		"remove tag": c.RemoveTags(ctx, "base", []string{"v1"}),
	} {
		if !errors.Is(err, sandbox.ErrNotSupported) {
			t.Errorf("%s on a read-only catalog: %v", name, err)
		}
	}
	if _, err := c.AssignTags(ctx, "base", []string{"v1"}); !errors.Is(err, sandbox.ErrNotSupported) {
		t.Errorf("assign tags on a read-only catalog: %v", err)
	}
}
