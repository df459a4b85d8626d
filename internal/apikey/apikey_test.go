package apikey

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/store"
)

func openStore(t *testing.T, dir string) *store.SQLite {
	t.Helper()
	st, err := store.OpenSQLite(filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

const boot = "e2b_bootstrap00000000000000000000000000000"

func teamOf(k string) string { return "digest-" + k[len(k)-4:] }

func TestParseScopes(t *testing.T) {
	got, err := ParseScopes([]string{"volumes:*", "sandboxes:read,templates:read"})
	if err != nil || joinScopes(got) != "sandboxes:read templates:read volumes:read volumes:write" {
		t.Errorf("ParseScopes = %v, %v", got, err)
	}
	if all, err := ParseScopes([]string{"*"}); err != nil || len(all) != len(All) {
		t.Errorf("* = %v, %v", all, err)
	}
	for _, bad := range [][]string{{"sandboxes:delete"}, {"nothing:*"}, {}, {" , "}} {
		if _, err := ParseScopes(bad); err == nil {
			t.Errorf("ParseScopes(%q) accepted", bad)
		} else if len(bad) > 0 && strings.Contains(bad[0], ":") && !strings.Contains(err.Error(), bad[0]) {
			t.Errorf("ParseScopes(%q): %v does not name it", bad, err)
		}
	}
}

// A key is shown once, kept as a hash, holds its scopes, and stops working
// the moment it is revoked; all of it survives a restart; a key cannot give
// what it does not hold.
func TestKeys(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st := openStore(t, dir)
	s, err := New(ctx, st, Options{Bootstrap: []string{boot}, TeamOf: teamOf})
	if err != nil {
		t.Fatal(err)
	}
	admin, err := s.Authenticate(boot)
	if err != nil || !admin.Bootstrap || !admin.Has(KeysAdmin) || admin.Team != teamOf(boot) {
		t.Fatalf("bootstrap = %+v, %v", admin, err)
	}
	if tm, ok := s.Team(admin.Team); !ok || tm.Name != "default" {
		t.Errorf("bootstrap team = %+v", tm)
	}
	if _, err := s.Authenticate("e2b_unknown0000000000000000000000000000000"); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown key: %v", err)
	}
	if _, err := s.Authenticate("not a key!"); !errors.Is(err, ErrMalformed) {
		t.Errorf("malformed key: %v", err)
	}

	blue, err := s.EnsureTeam(ctx, "blue")
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := s.EnsureTeam(ctx, "blue"); again.ID != blue.ID {
		t.Errorf("EnsureTeam made a second blue: %v", again)
	}
	if _, err := s.EnsureTeam(ctx, "Blue Team"); !errors.Is(err, ErrInvalid) {
		t.Errorf("bad team name: %v", err)
	}
	ro, err := s.Create(ctx, CreateRequest{TeamID: blue.ID, Name: "reader", Scopes: []Scope{SandboxesRead}, By: &admin})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(ro.Key, "e2b_") || len(ro.Key) != 44 || ro.Record.Hash == "" || strings.Contains(ro.Record.Hash, ro.Key) {
		t.Errorf("created %+v", ro)
	}
	p, err := s.Authenticate(ro.Key)
	if err != nil || p.Team != blue.ID || !p.Has(SandboxesRead) || p.Has(SandboxesWrite) || p.KeyName != "reader" {
		t.Fatalf("reader = %+v, %v", p, err)
	}
	// The reader cannot make or widen a key beyond what it holds.
	if _, err := s.Create(ctx, CreateRequest{TeamID: blue.ID, Name: "x", Scopes: []Scope{SandboxesWrite}, By: &p}); !errors.Is(err, ErrEscalation) {
		t.Errorf("reader made a writer: %v", err)
	}
	if _, err := s.Update(ctx, ro.Record.ID, "", []Scope{KeysAdmin}, &p); !errors.Is(err, ErrEscalation) {
		t.Errorf("reader widened itself: %v", err)
	}
	if _, err := s.Update(ctx, ro.Record.ID, "renamed", []Scope{SandboxesRead, TemplatesRead}, &admin); err != nil {
		t.Fatal(err)
	}
	if p, _ := s.Authenticate(ro.Key); p.KeyName != "renamed" || !p.Has(TemplatesRead) {
		t.Errorf("after update: %+v", p)
	}
	if err := s.FlushUsage(ctx); err != nil {
		t.Fatal(err)
	}
	if rec, _ := s.Get(ctx, ro.Record.ID); rec.LastUsed.IsZero() {
		t.Error("last use not recorded")
	}

	gone, err := s.Create(ctx, CreateRequest{TeamID: blue.ID, Name: "gone"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Revoke(ctx, gone.Record.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(gone.Key); !errors.Is(err, ErrRevoked) {
		t.Errorf("revoked key: %v, want ErrRevoked", err)
	}
	if err := s.Revoke(ctx, gone.Record.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("second revoke: %v", err)
	}

	// A restart: the same keys, teams and revocations, read back.
	st.Close()
	st2 := openStore(t, dir)
	s2, err := New(ctx, st2, Options{Bootstrap: []string{boot}, TeamOf: teamOf, Now: func() time.Time { return time.Now() }})
	if err != nil {
		t.Fatal(err)
	}
	if p, err := s2.Authenticate(ro.Key); err != nil || p.KeyName != "renamed" || p.Team != blue.ID {
		t.Errorf("after restart: %+v, %v", p, err)
	}
	if _, err := s2.Authenticate(gone.Key); !errors.Is(err, ErrRevoked) {
		t.Errorf("revoked key works after restart: %v", err)
	}
	if len(s2.Teams()) != 2 {
		t.Errorf("teams after restart: %v", s2.Teams())
	}
	keys, _ := s2.List(ctx, blue.ID)
	if len(keys) != 2 {
		t.Errorf("blue's keys: %v", keys)
	}
}

// BenchmarkAuthenticate is the per-request cost of knowing who a key is,
// with one key in the store and with 1,000 keys in 100 teams.
func BenchmarkAuthenticate(b *testing.B) {
	for _, n := range []int{1, 1000} {
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			ctx := context.Background()
			st, err := store.OpenSQLite(filepath.Join(b.TempDir(), "state.db"))
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			s, err := New(ctx, st, Options{Bootstrap: []string{boot}, TeamOf: teamOf})
			if err != nil {
				b.Fatal(err)
			}
			key := boot
			for i := 1; i < n; i++ {
				t, err := s.EnsureTeam(ctx, fmt.Sprintf("t%d", i%100))
				if err != nil {
					b.Fatal(err)
				}
				c, err := s.Create(ctx, CreateRequest{TeamID: t.ID, Name: "k"})
				if err != nil {
					b.Fatal(err)
				}
				key = c.Key
			}
			b.ResetTimer()
			for b.Loop() {
				if _, err := s.Authenticate(key); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestKeyByID is what grants are checked with: a key by its ID, from
// memory, revoked at once, and the same after a restart.
func TestKeyByID(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st := openStore(t, dir)
	s, err := New(ctx, st, Options{Bootstrap: []string{boot}, TeamOf: teamOf})
	if err != nil {
		t.Fatal(err)
	}
	admin, _ := s.Authenticate(boot)
	red, _ := s.EnsureTeam(ctx, "red")
	a, err := s.Create(ctx, CreateRequest{TeamID: red.ID, Name: "a", By: &admin})
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Create(ctx, CreateRequest{TeamID: red.ID, Name: "b", By: &admin})
	if err != nil {
		t.Fatal(err)
	}
	if p, err := s.Key(admin.KeyID); err != nil || p.Team != admin.Team || !p.Bootstrap {
		t.Fatalf("bootstrap by ID: %+v %v", p, err)
	}
	if p, err := s.Key(a.Record.ID); err != nil || p.Team != red.ID || p.KeyName != "a" {
		t.Fatalf("a by ID: %+v %v", p, err)
	}
	if _, err := s.Key("no-such-id"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown ID: %v", err)
	}
	if n := len(s.TeamKeys(red.ID)); n != 2 {
		t.Fatalf("red has %d live keys, want 2", n)
	}
	if _, err := s.Update(ctx, b.Record.ID, "b", []Scope{SandboxesRead}, &admin); err != nil {
		t.Fatal(err)
	}
	if p, err := s.Key(b.Record.ID); err != nil || p.Has(SandboxesWrite) {
		t.Fatalf("b after its scopes changed: %+v %v", p, err)
	}
	if err := s.Revoke(ctx, a.Record.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Update(ctx, a.Record.ID, "a", nil, &admin); err == nil {
		t.Fatal("a revoked key was updated")
	}
	for i, svc := range []*Service{s, func() *Service {
		again, err := New(ctx, st, Options{Bootstrap: []string{boot}, TeamOf: teamOf})
		if err != nil {
			t.Fatal(err)
		}
		return again
	}()} {
		if p, err := svc.Key(a.Record.ID); !errors.Is(err, ErrRevoked) || p.KeyName != "a" {
			t.Fatalf("run %d: revoked a by ID: %+v %v", i, p, err)
		}
		if keys := svc.TeamKeys(red.ID); len(keys) != 1 || keys[0].KeyID != b.Record.ID || keys[0].Has(SandboxesWrite) {
			t.Fatalf("run %d: red's live keys %+v, want b alone", i, keys)
		}
	}
}

// A team's quotas are 0 (the default) or more, and are kept across a
// restart; the paused sandboxes' disk among them.
func TestSetQuotas(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st := openStore(t, dir)
	s, err := New(ctx, st, Options{Bootstrap: []string{boot}, TeamOf: teamOf})
	if err != nil {
		t.Fatal(err)
	}
	team, err := s.EnsureTeam(ctx, "green")
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []Quotas{{PausedDiskMB: -1}, {PausedSandboxes: -1}, {VolumesMB: -5}} {
		if err := s.SetQuotas(ctx, team.ID, bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("SetQuotas(%+v) = %v, want ErrInvalid", bad, err)
		}
	}
	want := Quotas{PausedSandboxes: 3, PausedDiskMB: 512}
	if err := s.SetQuotas(ctx, team.ID, want); err != nil {
		t.Fatal(err)
	}
	if got := s.Quotas(team.ID); got != want {
		t.Errorf("Quotas = %+v, want %+v", got, want)
	}
	st.Close()
	s2, err := New(ctx, openStore(t, dir), Options{Bootstrap: []string{boot}, TeamOf: teamOf})
	if err != nil {
		t.Fatal(err)
	}
	if got := s2.Quotas(team.ID); got != want {
		t.Errorf("Quotas after a restart = %+v, want %+v", got, want)
	}
}

// TestReload: two services over one store, as two replicas over one
// database: a team and key made by one, then the key narrowed and revoked
// by it, reach the other at its next Reload, and not before; the
// bootstrap key stays live throughout.
func TestReload(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a, err := New(ctx, openStore(t, dir), Options{Bootstrap: []string{boot}, TeamOf: teamOf})
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(ctx, openStore(t, dir), Options{Bootstrap: []string{boot}, TeamOf: teamOf})
	if err != nil {
		t.Fatal(err)
	}
	blue, err := a.EnsureTeam(ctx, "blue")
	if err != nil {
		t.Fatal(err)
	}
	made, err := a.Create(ctx, CreateRequest{TeamID: blue.ID, Name: "runner"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Authenticate(made.Key); !errors.Is(err, ErrNotFound) {
		t.Fatalf("before a reload, the other service knows the key: %v", err)
	}
	if err := b.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	p, err := b.Authenticate(made.Key)
	if err != nil || p.Team != blue.ID || !p.Has(SandboxesWrite) {
		t.Fatalf("after a reload: %+v %v", p, err)
	}
	if tm, ok := b.Team(blue.ID); !ok || tm.Name != "blue" {
		t.Fatalf("the team after a reload: %+v", tm)
	}
	if _, err := a.Update(ctx, made.Record.ID, "runner", []Scope{SandboxesRead}, nil); err != nil {
		t.Fatal(err)
	}
	if err := b.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if p, _ := b.Authenticate(made.Key); p.Has(SandboxesWrite) || !p.Has(SandboxesRead) {
		t.Fatalf("narrowed key after a reload: %+v", p)
	}
	if err := a.Revoke(ctx, made.Record.ID); err != nil {
		t.Fatal(err)
	}
	if err := b.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Authenticate(made.Key); !errors.Is(err, ErrRevoked) {
		t.Fatalf("revoked key after a reload: %v", err)
	}
	if _, err := b.Key(made.Record.ID); !errors.Is(err, ErrRevoked) {
		t.Fatalf("revoked key by ID after a reload: %v", err)
	}
	if p, err := b.Authenticate(boot); err != nil || !p.Bootstrap {
		t.Fatalf("bootstrap after reloads: %+v %v", p, err)
	}
}
