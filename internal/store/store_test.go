package store

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"
)

func TestSQLiteRoundTripAndReopen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "airlock.db")
	s, err := OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	yes := true
	in := Sandbox{
		ID: "abc123", TemplateID: "base", Alias: "base", ClientID: "local",
		Metadata: map[string]string{"a b": "c&d"}, EnvVars: map[string]string{"FOO": "bar"},
		AccessToken: "tok", StartedAt: time.Unix(100, 5), EndAt: time.Unix(400, 7),
		State: "running", CPUCount: 2, MemoryMB: 512, DiskSizeMB: 1024, AllowInternet: &yes,
	}
	if err := s.Put(ctx, in); err != nil {
		t.Fatal(err)
	}
	in.State = "paused"
	if err := s.Put(ctx, in); err != nil {
		t.Fatal(err)
	}
	s.Close()

	s, err = OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.Get(ctx, "abc123")
	if err != nil {
		t.Fatal(err)
	}
	if got.State != "paused" || got.Metadata["a b"] != "c&d" || got.EnvVars["FOO"] != "bar" ||
		!got.StartedAt.Equal(in.StartedAt) || !got.EndAt.Equal(in.EndAt) || got.AllowInternet == nil || !*got.AllowInternet {
		t.Fatalf("round trip lost data: %+v", got)
	}
	list, err := s.List(ctx)
	if err != nil || len(list) != 1 {
		t.Fatalf("List = %v, %v", list, err)
	}
	if err := s.Delete(ctx, "abc123"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "abc123"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get after Delete: %v", err)
	}
}
