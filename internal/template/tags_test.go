package template_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/template"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// oldRecord is a template.json as the layout before tags wrote it: one build.
const oldRecord = `{
  "name": "legacy",
  "key": "aaaaaaaaaaaaaaaaaaaaaaaa",
  "config": {"env": ["PATH=/bin"]},
  "settings": {"cpu_count": 2},
  "layers": [{"key": "aaaaaaaaaaaaaaaaaaaaaaaa", "kind": "copy", "text": "COPY x /x", "diffBytes": 1, "buildSeconds": 0.5, "cached": false}],
  "source": {"dockerfile": "/src/Dockerfile", "from": "base"},
  "createdAt": "2025-01-02T03:04:05Z",
  "builtAt": "2025-01-02T03:04:05Z",
  "buildSeconds": 0.5,
  "sizeBytes": 4096
}
`

// legacyStore is a store on a fresh data dir holding one template of the
// old layout (no layers on disk: these tests only read and tag records).
func legacyStore(t *testing.T) (*template.Store, string) {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "templates", "legacy"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "templates", "legacy", "template.json"), []byte(oldRecord), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := template.Open(template.Options{DataDir: dir, Mirror: "http://127.0.0.1:1/debian"})
	if err != nil {
		t.Fatal(err)
	}
	return s, dir
}

// TestOldLayoutReadsAsDefault: a template.json written before tags is one
// build named by "default", with the same build id on every read, and the
// first change rewrites it in the new layout with the default build still at
// the top level (what an older airlock, or a script reading "key", reads).
func TestOldLayoutReadsAsDefault(t *testing.T) {
	s, dir := legacyStore(t)
	a, err := s.Get("legacy")
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Get("legacy:default")
	if err != nil {
		t.Fatal(err)
	}
	if a.BuildID == "" || a.BuildID != b.BuildID || a.Key != "aaaaaaaaaaaaaaaaaaaaaaaa" || !slices.Equal(a.Tags, []string{"default"}) || a.Tag != "default" {
		t.Fatalf("old layout: %+v / %+v", a, b)
	}
	tags, err := s.Tags("legacy")
	if err != nil || len(tags) != 1 || tags[0].Tag != "default" || tags[0].BuildID != a.BuildID {
		t.Fatalf("tags of the old layout: %+v, %v", tags, err)
	}
	if _, err := s.AssignTags(context.Background(), "legacy", []string{"v1"}); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "templates", "legacy", "template.json"))
	if err != nil {
		t.Fatal(err)
	}
	var top struct {
		Key     string                     `json:"key"`
		BuildID string                     `json:"buildID"`
		Tags    map[string]json.RawMessage `json:"tags"`
		Builds  []json.RawMessage          `json:"builds"`
	}
	if err := json.Unmarshal(data, &top); err != nil {
		t.Fatal(err)
	}
	if top.Key != a.Key || top.BuildID != a.BuildID || len(top.Tags) != 2 || len(top.Builds) != 1 {
		t.Errorf("rewritten record: %s", data)
	}
	again, err := s.Get("legacy:v1")
	if err != nil || again.BuildID != a.BuildID || !slices.Equal(again.Tags, []string{"default", "v1"}) {
		t.Errorf("legacy:v1 after the rewrite: %+v, %v", again, err)
	}
}

// TestTagErrors: malformed references and tags are ErrInvalid, unknown ones
// ErrNotFound naming the tag; "default" cannot be removed; a refused change
// leaves the record as it was, byte for byte.
func TestTagErrors(t *testing.T) {
	s, dir := legacyStore(t)
	ctx := context.Background()
	path := filepath.Join(dir, "templates", "legacy", "template.json")
	before, _ := os.ReadFile(path)
	for _, ref := range []string{"legacy:", "legacy:a:b", "legacy:V1", "legacy:a b"} {
		if _, err := s.Get(ref); !errors.Is(err, template.ErrInvalid) {
			t.Errorf("Get(%q): %v, want ErrInvalid", ref, err)
		}
	}
	if _, err := s.Get("legacy:v9"); !errors.Is(err, template.ErrNotFound) || !strings.Contains(err.Error(), `no tag "v9"`) {
		t.Errorf("Get of an unknown tag: %v", err)
	}
	for _, tc := range []struct {
		what string
		err  error
		want error
	}{
		{"assign no tags", assign(s, "legacy", nil), template.ErrInvalid},
		{"assign a bad tag", assign(s, "legacy", []string{"ok", "Not OK"}), template.ErrInvalid},
		{"assign from an unknown tag", assign(s, "legacy:v9", []string{"v1"}), template.ErrNotFound},
		{"assign on an unknown template", assign(s, "nope", []string{"v1"}), template.ErrNotFound},
		{"remove default", s.RemoveTags(ctx, "legacy", []string{"default"}), template.ErrInvalid},
		{"remove an unknown tag", s.RemoveTags(ctx, "legacy", []string{"v9"}), template.ErrNotFound},
		{"remove with a tagged name", s.RemoveTags(ctx, "legacy:default", []string{"v1"}), template.ErrInvalid},
		{"remove no tags", s.RemoveTags(ctx, "legacy", nil), template.ErrInvalid},
		{"remove by a tagged ref", s.Remove(ctx, "legacy:default", nil), template.ErrInvalid},
	} {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.what, tc.err, tc.want)
		}
	}
	if after, _ := os.ReadFile(path); string(after) != string(before) {
		t.Errorf("a refused change rewrote the record:\n%s", after)
	}
}

func assign(s *template.Store, target string, tags []string) error {
	_, err := s.AssignTags(context.Background(), target, tags)
	return err
}

// TestConcurrentTagChanges: tag changes from many goroutines are serialized
// (each reads the record the previous one wrote), so none is lost; a temp
// file a crash left before its rename is not read as the record.
func TestConcurrentTagChanges(t *testing.T) {
	s, dir := legacyStore(t)
	// What a crash between writing the temp file and renaming it leaves.
	if err := os.WriteFile(filepath.Join(dir, "templates", "legacy", ".template-crash.json"), []byte(`{"name":"legacy","key":"bbbb"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- assign(s, "legacy", []string{fmt.Sprintf("t%d", i)})
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	tags, err := s.Tags("legacy")
	if err != nil || len(tags) != 21 {
		t.Fatalf("after 20 concurrent assignments: %d tags (%v), want 21", len(tags), err)
	}
	if got, err := s.Get("legacy:t7"); err != nil || got.Key != "aaaaaaaaaaaaaaaaaaaaaaaa" {
		t.Errorf("legacy:t7: %+v, %v", got, err)
	}
}

// TestTagsNameBuilds builds one name three times with different content and
// checks each tag starts its own build; moving and removing tags drops the
// builds no tag names and garbage-collects their layers, and keeps every
// layer of every tagged build.
func TestTagsNameBuilds(t *testing.T) {
	s := storeFor(t)
	ctx := context.Background()
	name := uniqueName(t, s, "tags")
	ctxDir := t.TempDir()
	// COPY steps only: no build sandbox needed, each build is quick.
	buildWith := func(content string, tags ...string) template.Template {
		writeFiles(t, ctxDir, map[string]string{"which.txt": content})
		tpl, _ := build(t, s, template.BuildRequest{
			Name: name, Dockerfile: []byte("FROM base\nCOPY which.txt /which.txt\n"), ContextDir: ctxDir, Replace: true, Tags: tags,
		})
		return tpl
	}
	content := func(tpl template.Template) string {
		data, err := os.ReadFile(filepath.Join(tpl.RootFS, "which.txt"))
		if err != nil {
			t.Fatalf("%s: %v", tpl.BuildID, err)
		}
		return string(data)
	}
	get := func(ref string) template.Template {
		t.Helper()
		tpl, err := s.Get(ref)
		if err != nil {
			t.Fatalf("Get(%s): %v", ref, err)
		}
		return tpl
	}

	// The first build of a name gets "default" too, whatever its tag.
	v1 := buildWith("one "+name, "v1")
	if !slices.Equal(v1.Tags, []string{"default", "v1"}) || v1.BuildID == "" {
		t.Fatalf("first build: tags %v, id %q", v1.Tags, v1.BuildID)
	}
	v2 := buildWith("two "+name, "v2", "stable")
	if !slices.Equal(v2.Tags, []string{"stable", "v2"}) {
		t.Errorf("second build: tags %v, want [stable v2] (default stays with the first)", v2.Tags)
	}
	three := buildWith("three " + name)
	for ref, want := range map[string]string{name: "three", name + ":default": "three", name + ":v1": "one", name + ":v2": "two", name + ":stable": "two"} {
		if got := content(get(ref)); got != want+" "+name {
			t.Errorf("%s has %q, want %q", ref, got, want)
		}
	}
	builds, err := s.Builds(name)
	if err != nil || len(builds) != 3 || builds[0].BuildID != three.BuildID || builds[2].BuildID != v1.BuildID {
		t.Fatalf("builds: %+v, %v; want three, v2, v1", builds, err)
	}
	for _, b := range builds {
		for _, l := range b.Layers {
			if _, err := os.Stat(filepath.Join(testenv.DataDir(), "layers", l.Key, "layer.json")); err != nil {
				t.Errorf("a layer of tagged build %s was collected: %v", b.BuildID, err)
			}
		}
	}

	// Moving "default" off the third build leaves it untagged: dropped, and
	// its own top layer collected.
	moved, err := s.AssignTags(ctx, name+":v2", []string{"default"})
	if err != nil || moved.BuildID != v2.BuildID {
		t.Fatalf("assign default to v2: %+v, %v", moved, err)
	}
	if got := content(get(name)); got != "two "+name {
		t.Errorf("%s after moving default: %q", name, got)
	}
	if _, err := os.Stat(three.RootFS); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the untagged build's layer is still there: %v", err)
	}
	if _, err := os.Stat(three.BuildLog); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the untagged build's log is still there: %v", err)
	}
	if _, err := os.Stat(v1.RootFS); err != nil {
		t.Errorf("v1's layer went with the untagged build: %v", err)
	}

	if err := s.RemoveTags(ctx, name, []string{"v1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(name + ":v1"); !errors.Is(err, template.ErrNotFound) {
		t.Errorf("%s:v1 after removing the tag: %v", name, err)
	}
	if _, err := os.Stat(v1.RootFS); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("v1's layer survived its last tag: %v", err)
	}
	tags, err := s.Tags(name)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tg := range tags {
		names = append(names, tg.Tag)
		if tg.BuildID != v2.BuildID {
			t.Errorf("tag %s names %s, want v2's build %s", tg.Tag, tg.BuildID, v2.BuildID)
		}
	}
	if !slices.Equal(names, []string{"default", "stable", "v2"}) {
		t.Errorf("tags: %v", names)
	}

	// A FROM of name:tag builds on that build.
	child := uniqueName(t, s, "tagchild")
	c, _ := build(t, s, template.BuildRequest{Name: child, Dockerfile: []byte("FROM " + name + ":stable\n")})
	if c.Key != v2.Key {
		t.Errorf("FROM %s:stable has top layer %s, want v2's %s", name, c.Key, v2.Key)
	}

	// Built-ins have only "default".
	if _, err := s.AssignTags(ctx, "base", []string{"mine"}); !errors.Is(err, template.ErrBuiltinTags) {
		t.Errorf("tagging base: %v", err)
	}
	// Removing the template takes every build (and the tags with them).
	if err := s.Remove(ctx, child, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(ctx, name, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(v2.RootFS); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("v2's layer survived the template's removal: %v", err)
	}
}
