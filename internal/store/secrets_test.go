package store

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestSecretsRecords(t *testing.T) { forEachDB(t, testSecretsRecords) }

func testSecretsRecords(t *testing.T, open func() *DB) {
	ctx := context.Background()
	s := open()
	at := func(sec int64) time.Time { return time.Unix(sec, 0) }
	rec := Secret{ID: "sec_1", Owner: "k1", Name: "api", Version: 1, Metadata: map[string]string{"a": "b"},
		Sealed: []byte{1, 2, 3}, KeyID: "key1", CreatedAt: at(10), UpdatedAt: at(10)}
	if err := s.InsertSecret(ctx, rec, 2); err != nil {
		t.Fatal(err)
	}
	if err := s.InsertSecret(ctx, Secret{ID: "sec_2", Owner: "k1", Name: "api", Sealed: []byte{1}}, 2); !errors.Is(err, ErrExists) {
		t.Fatalf("same name, same owner: %v", err)
	}
	if err := s.InsertSecret(ctx, Secret{ID: "sec_1", Owner: "k2", Name: "other", Sealed: []byte{1}}, 2); !errors.Is(err, ErrExists) {
		t.Fatalf("same ID: %v", err)
	}
	if err := s.InsertSecret(ctx, Secret{ID: "sec_3", Owner: "k2", Name: "api", Version: 1, Sealed: []byte{9}, KeyID: "key1", CreatedAt: at(11), UpdatedAt: at(11)}, 2); err != nil {
		t.Fatalf("same name, other owner: %v", err)
	}
	if err := s.InsertSecret(ctx, Secret{ID: "sec_4", Owner: "k1", Name: "b", Version: 1, Sealed: []byte{4}, KeyID: "key0", CreatedAt: at(12), UpdatedAt: at(12)}, 2); err != nil {
		t.Fatal(err)
	}
	if err := s.InsertSecret(ctx, Secret{ID: "sec_5", Owner: "k1", Name: "c", Sealed: []byte{5}}, 2); !errors.Is(err, ErrSecretLimit) {
		t.Fatalf("past the count: %v", err)
	}
	if err := s.InsertSecret(ctx, Secret{ID: "sec_5", Owner: "k1", Name: "c", Version: 1, Sealed: []byte{5}, KeyID: "key1", CreatedAt: at(13), UpdatedAt: at(13)}, 0); err != nil {
		t.Fatalf("no limit: %v", err)
	}

	// Update: one version up, value replaced, metadata kept or replaced,
	// the record as it now is returned without its value.
	got, err := s.UpdateSecret(ctx, "k1", "sec_1", SecretUpdate{Sealed: []byte{7, 7}, KeyID: "key1", UpdatedAt: at(20)})
	if err != nil || got.Version != 2 || got.Metadata["a"] != "b" || got.Sealed != nil || !got.UpdatedAt.Equal(at(20)) || !got.CreatedAt.Equal(at(10)) {
		t.Fatalf("update = %+v, %v", got, err)
	}
	got, err = s.UpdateSecret(ctx, "k1", "sec_1", SecretUpdate{Sealed: []byte{8}, KeyID: "key1", Metadata: map[string]string{}, UpdatedAt: at(21)})
	if err != nil || got.Version != 3 || len(got.Metadata) != 0 {
		t.Fatalf("update with metadata = %+v, %v", got, err)
	}
	if _, err := s.UpdateSecret(ctx, "k2", "sec_1", SecretUpdate{Sealed: []byte{1}}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("update of another owner's: %v", err)
	}

	s.Close()
	s = open()
	for _, c := range []struct {
		ref    string
		byName bool
	}{{"sec_1", false}, {"api", true}} {
		got, err := s.GetSecret(ctx, "k1", c.ref, c.byName)
		if err != nil || got.ID != "sec_1" || got.Version != 3 || string(got.Sealed) != "\x08" || got.KeyID != "key1" {
			t.Fatalf("GetSecret(%q) = %+v, %v", c.ref, got, err)
		}
	}
	if _, err := s.GetSecret(ctx, "k2", "sec_1", false); !errors.Is(err, ErrNotFound) {
		t.Fatalf("another owner's by ID: %v", err)
	}
	if _, err := s.GetSecret(ctx, "k1", "sec_1", true); !errors.Is(err, ErrNotFound) {
		t.Fatalf("an ID looked up as a name: %v", err)
	}
	if n, err := s.CountSecretsNotUnder(ctx, "key1"); err != nil || n != 1 {
		t.Fatalf("CountSecretsNotUnder = %d, %v", n, err)
	}

	// Lists: name order, after a name, limited, without values.
	names := func(l []Secret) (out []string) {
		for _, x := range l {
			if x.Sealed != nil || x.KeyID != "" {
				t.Fatalf("a listed record carries its value: %+v", x)
			}
			out = append(out, x.Owner+"/"+x.Name)
		}
		return out
	}
	for _, c := range []struct {
		owner, after string
		limit        int
		want         string
	}{
		{"k1", "", 0, "[k1/api k1/b k1/c]"},
		{"k1", "", 2, "[k1/api k1/b]"},
		{"k1", "b", 2, "[k1/c]"},
		{"k1", "c", 2, "[]"},
		{"k2", "", 0, "[k2/api]"},
		{"", "", 0, "[k1/api k2/api k1/b k1/c]"},
	} {
		l, err := s.ListSecrets(ctx, c.owner, c.after, c.limit)
		if got := fmtSlice(names(l)); err != nil || got != c.want {
			t.Errorf("ListSecrets(%q, %q, %d) = %s, %v; want %s", c.owner, c.after, c.limit, got, err, c.want)
		}
	}

	if err := s.DeleteSecret(ctx, "k2", "sec_1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("delete of another owner's: %v", err)
	}
	if err := s.DeleteSecret(ctx, "k1", "sec_1"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSecret(ctx, "k1", "sec_1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
	if _, err := s.GetSecret(ctx, "k1", "api", true); !errors.Is(err, ErrNotFound) {
		t.Fatalf("deleted: %v", err)
	}
}

func fmtSlice(s []string) string {
	out := "["
	for i, x := range s {
		if i > 0 {
			out += " "
		}
		out += x
	}
	return out + "]"
}
