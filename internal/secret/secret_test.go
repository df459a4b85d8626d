package secret

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/store"
)

// newService opens a service over a real SQLite store and key file in a
// temporary data dir.
func newService(t *testing.T, opts Options) (*Service, *store.SQLite, string) {
	t.Helper()
	dir := t.TempDir()
	st, err := store.OpenSQLite(filepath.Join(dir, "airlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	opts.Store = st
	if opts.KeyFile == "" {
		opts.KeyFile = filepath.Join(dir, "secrets.key")
	}
	s, err := New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	return s, st, dir
}

func TestService(t *testing.T) {
	ctx := context.Background()
	s, _, _ := newService(t, Options{MaxPerOwner: 3})

	sec, err := s.Create(ctx, "k1", "OpenAI-Key", "sk-value-1", map[string]string{"team": "ml"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(sec.ID, IDPrefix) || len(sec.ID) != len(IDPrefix)+2*idBytes || sec.Name != "openai-key" || sec.Version != 1 ||
		sec.Metadata["team"] != "ml" || sec.CreatedAt.IsZero() || !sec.CreatedAt.Equal(sec.UpdatedAt) || sec.Owner != "k1" {
		t.Fatalf("created %+v", sec)
	}
	// By ID or by name, in any case.
	for _, ref := range []string{sec.ID, strings.ToUpper(sec.ID), "openai-key", "OPENAI-KEY"} {
		got, err := s.Get(ctx, "k1", ref)
		if err != nil || got.ID != sec.ID || got.Version != 1 || got.Metadata["team"] != "ml" {
			t.Fatalf("Get(%q) = %+v, %v", ref, got, err)
		}
	}
	if v, err := s.Value(ctx, "k1", "OpenAI-KEY"); err != nil || v != "sk-value-1" {
		t.Fatalf("Value = %q, %v", v, err)
	}
	if v, err := s.Value(ctx, "k1", sec.ID); err != nil || v != "sk-value-1" {
		t.Fatalf("Value by ID = %q, %v", v, err)
	}

	// Another owner sees nothing of it, and may use the name.
	for _, ref := range []string{sec.ID, "openai-key"} {
		if _, err := s.Get(ctx, "k2", ref); !errors.Is(err, ErrNotFound) {
			t.Fatalf("k2 Get(%q): %v", ref, err)
		}
		if _, err := s.Value(ctx, "k2", ref); !errors.Is(err, ErrNotFound) {
			t.Fatalf("k2 Value(%q): %v", ref, err)
		}
		if ok, err := s.Exists(ctx, "k2", ref); ok || err != nil {
			t.Fatalf("k2 Exists(%q) = %v, %v", ref, ok, err)
		}
		if _, err := s.Update(ctx, "k2", ref, "x", nil); !errors.Is(err, ErrNotFound) {
			t.Fatalf("k2 Update(%q): %v", ref, err)
		}
		if err := s.Destroy(ctx, "k2", ref); !errors.Is(err, ErrNotFound) {
			t.Fatalf("k2 Destroy(%q): %v", ref, err)
		}
	}
	if _, err := s.Create(ctx, "k2", "openai-key", "other", nil); err != nil {
		t.Fatalf("same name, other owner: %v", err)
	}
	if _, err := s.Get(ctx, "", "openai-key"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("no owner: %v", err)
	}

	// Names: unique per owner in any case, validated, sec_ reserved.
	if _, err := s.Create(ctx, "k1", "OPENAI-key", "x", nil); !errors.Is(err, ErrExists) {
		t.Fatalf("duplicate: %v", err)
	}
	for _, bad := range []string{"", "a b", "dot.name", "ünï", "a/b", strings.Repeat("a", 129), "sec_x", "SEC_abc"} {
		if _, err := s.Create(ctx, "k1", bad, "x", nil); !errors.Is(err, ErrInvalid) {
			t.Fatalf("name %q: %v", bad, err)
		}
	}
	if _, err := s.Create(ctx, "k1", strings.Repeat("a", 128), "x", nil); err != nil {
		t.Fatalf("128-character name: %v", err)
	}

	// Values: bounded, and never in an error.
	big := strings.Repeat("v", DefaultMaxValueBytes+1)
	if _, err := s.Create(ctx, "k1", "big", big, nil); !errors.Is(err, ErrInvalid) || strings.Contains(err.Error(), "vvvv") {
		t.Fatalf("big value: %v", err)
	}
	if _, err := s.Create(ctx, "k1", "max", big[1:], nil); err != nil {
		t.Fatalf("value at the bound: %v", err)
	}
	// The per-owner count (3): openai-key, aaa..., max.
	if _, err := s.Create(ctx, "k1", "fourth", "x", nil); !errors.Is(err, ErrLimit) || !strings.Contains(err.Error(), "at most 3 secrets") {
		t.Fatalf("past the limit: %v", err)
	}

	// Update: version up, value replaced, metadata kept (nil) or replaced.
	up, err := s.Update(ctx, "k1", "OpenAI-Key", "sk-value-2", nil)
	if err != nil || up.Version != 2 || up.Metadata["team"] != "ml" || !up.UpdatedAt.After(up.CreatedAt) || !up.CreatedAt.Equal(sec.CreatedAt) {
		t.Fatalf("update = %+v, %v", up, err)
	}
	up, err = s.Update(ctx, "k1", sec.ID, "sk-value-3", map[string]string{"env": "prod"})
	if err != nil || up.Version != 3 || len(up.Metadata) != 1 || up.Metadata["env"] != "prod" {
		t.Fatalf("update with metadata = %+v, %v", up, err)
	}
	up, err = s.Update(ctx, "k1", sec.ID, "sk-value-4", map[string]string{})
	if err != nil || up.Version != 4 || len(up.Metadata) != 0 {
		t.Fatalf("update with empty metadata = %+v, %v", up, err)
	}
	if v, _ := s.Value(ctx, "k1", "openai-key"); v != "sk-value-4" {
		t.Fatalf("value after updates = %q", v)
	}
	if _, err := s.Update(ctx, "k1", "openai-key", big, nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("big update: %v", err)
	}
	if _, err := s.Update(ctx, "k1", "nope", "x", nil); !errors.Is(err, ErrNotFound) {
		t.Fatalf("update unknown: %v", err)
	}

	// List: name order, pages, only the owner's.
	all, err := s.List(ctx, "k1", "", 0)
	if err != nil || len(all) != 3 || all[0].Name != strings.Repeat("a", 128) || all[1].Name != "max" || all[2].Name != "openai-key" {
		t.Fatalf("List = %+v, %v", all, err)
	}
	page, err := s.List(ctx, "k1", "max", 1)
	if err != nil || len(page) != 1 || page[0].Name != "openai-key" || page[0].Version != 4 {
		t.Fatalf("List after max = %+v, %v", page, err)
	}
	if l, _ := s.List(ctx, "", "", 0); len(l) != 0 {
		t.Fatalf("List of no owner = %+v", l)
	}

	// Destroy: gone for every way in.
	if err := s.Destroy(ctx, "k1", "OPENAI-KEY"); err != nil {
		t.Fatal(err)
	}
	if err := s.Destroy(ctx, "k1", sec.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second destroy: %v", err)
	}
	if _, err := s.Value(ctx, "k1", "openai-key"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Value of destroyed: %v", err)
	}
	if ok, err := s.Exists(ctx, "k1", "openai-key"); ok || err != nil {
		t.Fatalf("Exists of destroyed = %v, %v", ok, err)
	}
	if v, err := s.Value(ctx, "k2", "openai-key"); err != nil || v != "other" {
		t.Fatalf("k2's value = %q, %v", v, err)
	}
}

func TestMetadataBounds(t *testing.T) {
	ok := map[string]string{strings.Repeat("k", 128): strings.Repeat("v", 1024)}
	if err := ValidMetadata(ok); err != nil {
		t.Fatal(err)
	}
	many := map[string]string{}
	for i := range 33 {
		many[string(rune('a'+i%26))+strings.Repeat("x", i)] = "v"
	}
	total := map[string]string{}
	for i := range 8 {
		total[strings.Repeat(string(rune('a'+i)), 100)] = strings.Repeat("v", 1000) // 8 * 1100 > 8192
	}
	for name, md := range map[string]map[string]string{
		"33 entries": many,
		"long key":   {strings.Repeat("k", 129): "v"},
		"long value": {"k": strings.Repeat("v", 1025)},
		"total":      total,
	} {
		if err := ValidMetadata(md); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestEncryptedAtRest: the database file holds no value in the clear, and a
// value moved to another row does not decrypt.
func TestEncryptedAtRest(t *testing.T) {
	ctx := context.Background()
	s, st, dir := newService(t, Options{})
	const value = "PLAINTEXT-secret-value-7d1f0c"
	a, err := s.Create(ctx, "k1", "a", value, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Update(ctx, "k1", "a", value+"-v2", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(ctx, "k2", "b", "other-value", nil); err != nil {
		t.Fatal(err)
	}
	// Everything SQLite wrote: the database and its WAL.
	for _, f := range []string{"airlock.db", "airlock.db-wal"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte(value)) || bytes.Contains(b, []byte("other-value")) {
			t.Fatalf("%s holds a value in the clear", f)
		}
	}
	// k2's sealed value pasted into k1's row: authentication fails.
	b, err := st.GetSecret(ctx, "k2", "b", true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.UpdateSecret(ctx, "k1", a.ID, store.SecretUpdate{Sealed: b.Sealed, KeyID: b.KeyID}); err != nil {
		t.Fatal(err)
	}
	_, err = s.Value(ctx, "k1", "a")
	if !errors.Is(err, ErrKey) || strings.Contains(err.Error(), "other-value") {
		t.Fatalf("moved value: %v", err)
	}
}

// TestWrongKey: secrets sealed under one key file, read with another, fail
// with an error that says so (and no value); an update seals them again.
func TestWrongKey(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.OpenSQLite(filepath.Join(dir, "airlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	keyFile := filepath.Join(dir, "secrets.key")
	s1, err := New(ctx, Options{Store: st, KeyFile: keyFile})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s1.Create(ctx, "k1", "api", "value-under-key-1", nil); err != nil {
		t.Fatal(err)
	}
	// The key file lost and made again.
	if err := os.Remove(keyFile); err != nil {
		t.Fatal(err)
	}
	var logBuf bytes.Buffer
	s2, err := New(ctx, Options{Store: st, KeyFile: keyFile, Logger: newTestLogger(&logBuf)})
	if err != nil {
		t.Fatal(err)
	}
	if s2.KeyID() == s1.KeyID() {
		t.Fatal("a new key file has the old key's ID")
	}
	if !strings.Contains(logBuf.String(), "sealed with another key") || !strings.Contains(logBuf.String(), "secrets=1") {
		t.Fatalf("start log: %s", logBuf.String())
	}
	_, err = s2.Value(ctx, "k1", "api")
	if !errors.Is(err, ErrKey) || !strings.Contains(err.Error(), "another key") || strings.Contains(err.Error(), "value-under-key-1") {
		t.Fatalf("Value under a new key: %v", err)
	}
	// The metadata is still served, and Fill names the trouble.
	if got, err := s2.Get(ctx, "k1", "api"); err != nil || got.Version != 1 {
		t.Fatalf("Get under a new key = %+v, %v", got, err)
	}
	if _, err := Fill(ctx, s2, "k1", "${e2b.secrets.api}"); !errors.Is(err, ErrKey) {
		t.Fatalf("Fill under a new key: %v", err)
	}
	// The same key ID but other key bytes (a damaged key file of the right
	// shape): GCM authentication fails.
	s3, err := New(ctx, Options{Store: st, Key: bytes.Repeat([]byte{7}, KeySize)})
	if err != nil {
		t.Fatal(err)
	}
	s3.sealer.keyID = s1.KeyID()
	if _, err := s3.Value(ctx, "k1", "api"); !errors.Is(err, ErrKey) || !strings.Contains(err.Error(), "authentication failed") {
		t.Fatalf("Value with wrong key bytes: %v", err)
	}
	// An update seals the value under the current key again.
	if _, err := s2.Update(ctx, "k1", "api", "value-under-key-2", nil); err != nil {
		t.Fatal(err)
	}
	if v, err := s2.Value(ctx, "k1", "api"); err != nil || v != "value-under-key-2" {
		t.Fatalf("after update = %q, %v", v, err)
	}
}

func TestKeyFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "secrets.key")
	// A crash between writing the temporary key and linking it left one.
	leftover := filepath.Join(dir, tmpPrefix+"123")
	if err := os.WriteFile(leftover, []byte("half"), 0o600); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(leftover, old, old); err != nil {
		t.Fatal(err)
	}
	key, created, err := LoadOrCreateKey(path)
	if err != nil || !created || len(key) != KeySize {
		t.Fatalf("first load = %x, %v, %v", key, created, err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode: %v, %v", fi.Mode(), err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, tmpPrefix+"*")); len(left) != 0 {
		t.Fatalf("temporary files left: %v", left)
	}
	again, created, err := LoadOrCreateKey(path)
	if err != nil || created || !bytes.Equal(again, key) {
		t.Fatalf("second load = %x, %v, %v", again, created, err)
	}

	// Racing creators all end with the one key.
	dir2 := t.TempDir()
	path2 := filepath.Join(dir2, "secrets.key")
	keys := make([][]byte, 8)
	var wg sync.WaitGroup
	for i := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k, _, err := LoadOrCreateKey(path2)
			if err != nil {
				t.Error(err)
			}
			keys[i] = k
		}()
	}
	wg.Wait()
	for _, k := range keys[1:] {
		if !bytes.Equal(k, keys[0]) {
			t.Fatal("racing creators got different keys")
		}
	}

	// A file that holds no key is refused, and left as it is.
	for _, bad := range []string{"", "not hex\n", "abcd\n"} {
		if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, _, err := LoadOrCreateKey(path); err == nil || !strings.Contains(err.Error(), "not replaced") {
			t.Fatalf("key file %q: %v", bad, err)
		}
		if b, _ := os.ReadFile(path); string(b) != bad {
			t.Fatalf("key file %q was replaced by %q", bad, b)
		}
	}
}

func newTestLogger(w io.Writer) *slog.Logger { return slog.New(slog.NewTextHandler(w, nil)) }
