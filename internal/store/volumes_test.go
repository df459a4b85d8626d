package store

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestVolumesRecords(t *testing.T) { forEachDB(t, testVolumesRecords) }

func testVolumesRecords(t *testing.T, open func() *DB) {
	ctx := context.Background()
	s := open()
	lim := VolumeLimits{MaxCount: 2, MaxBytes: 3 << 20}
	v1 := Volume{ID: "id1", Owner: "k1", Name: "data", Token: "t1", SizeBytes: 1 << 20, CreatedAt: time.Unix(10, 0), State: VolumeCreating}
	if err := s.InsertVolume(ctx, v1, lim); err != nil {
		t.Fatal(err)
	}
	// Names are unique per owner, not across owners.
	if err := s.InsertVolume(ctx, Volume{ID: "id2", Owner: "k1", Name: "data", SizeBytes: 1, State: VolumeCreating}, lim); !errors.Is(err, ErrExists) {
		t.Fatalf("same name, same owner: %v", err)
	}
	if err := s.InsertVolume(ctx, Volume{ID: "id3", Owner: "k2", Name: "data", SizeBytes: 1 << 20, CreatedAt: time.Unix(11, 0), State: VolumeReady}, lim); err != nil {
		t.Fatalf("same name, other owner: %v", err)
	}
	// Total bytes, then count.
	if err := s.InsertVolume(ctx, Volume{ID: "id4", Owner: "k1", Name: "big", SizeBytes: 3 << 20, State: VolumeCreating}, lim); !errors.Is(err, ErrVolumeSpace) || !strings.Contains(err.Error(), "at most 3 MiB (1 MiB in use, 3 MiB asked)") {
		t.Fatalf("past the byte limit: %v", err)
	}
	if err := s.InsertVolume(ctx, Volume{ID: "id5", Owner: "k1", Name: "two", SizeBytes: 1 << 20, CreatedAt: time.Unix(12, 0), State: VolumeCreating}, lim); err != nil {
		t.Fatal(err)
	}
	if err := s.InsertVolume(ctx, Volume{ID: "id6", Owner: "k1", Name: "three", SizeBytes: 1, State: VolumeCreating}, lim); !errors.Is(err, ErrVolumeLimit) {
		t.Fatalf("past the count limit: %v", err)
	}
	if err := s.SetVolumeState(ctx, "id1", VolumeReady); err != nil {
		t.Fatal(err)
	}
	if err := s.SetVolumeState(ctx, "nope", VolumeReady); !errors.Is(err, ErrNotFound) {
		t.Fatalf("state of unknown: %v", err)
	}
	s.Close()
	s = open()
	got, err := s.GetVolume(ctx, "id1")
	if err != nil || got != (Volume{ID: "id1", Owner: "k1", Name: "data", Token: "t1", SizeBytes: 1 << 20, CreatedAt: time.Unix(10, 0), State: VolumeReady}) {
		t.Fatalf("GetVolume = %+v, %v", got, err)
	}
	if _, err := s.GetVolume(ctx, "nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("GetVolume(unknown) = %v", err)
	}
	k1, err := s.ListVolumes(ctx, "k1")
	if err != nil || len(k1) != 2 || k1[0].ID != "id1" || k1[1].ID != "id5" {
		t.Fatalf("ListVolumes(k1) = %+v, %v", k1, err)
	}
	if all, _ := s.ListVolumes(ctx, ""); len(all) != 3 {
		t.Fatalf("ListVolumes(all) = %d records", len(all))
	}
	if err := s.DeleteVolume(ctx, "id1"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteVolume(ctx, "id1"); err != nil {
		t.Fatalf("second delete: %v", err)
	}
	// The name is free again.
	if err := s.InsertVolume(ctx, Volume{ID: "id7", Owner: "k1", Name: "data", SizeBytes: 1, State: VolumeCreating}, lim); err != nil {
		t.Fatalf("reuse of a freed name: %v", err)
	}
}
