package secret

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// mapResolver resolves from a map of canonical names.
type mapResolver map[string]string

func (m mapResolver) Value(_ context.Context, owner, name string) (string, error) {
	if owner != "k1" {
		return "", fmt.Errorf("%w: owner %s", ErrNotFound, owner)
	}
	v, ok := m[CanonicalName(name)]
	if !ok {
		return "", fmt.Errorf("%w: %s", ErrNotFound, name)
	}
	return v, nil
}

func (m mapResolver) Exists(ctx context.Context, owner, name string) (bool, error) {
	_, err := m.Value(ctx, owner, name)
	return err == nil, nil
}

func TestPlaceholders(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"Bearer token", nil},
		{"Bearer ${e2b.secrets.openai-api-key}", []string{"openai-api-key"}},
		{"${e2b.secrets.A_b-9}", []string{"a_b-9"}},
		{"${e2b.secrets.user}:${e2b.secrets.pass}@${e2b.secrets.USER}", []string{"user", "pass"}},
		{"x${e2b.secrets.a}${e2b.secrets.b}y", []string{"a", "b"}},
		// Malformed markers are not placeholders.
		{"${e2b.secrets.}", nil},
		{"${e2b.secrets.has space}", nil},
		{"${e2b.secrets.dot.name}", nil},
		{"${e2b.secrets.unclosed", nil},
		{"$e2b.secrets.x}", nil},
		{"${E2B.SECRETS.x}", nil},
		{"${ e2b.secrets.x }", nil},
		{"${e2b.secrets." + strings.Repeat("a", 129) + "}", nil},
		{"${e2b.secrets." + strings.Repeat("a", 128) + "}", []string{strings.Repeat("a", 128)}},
		// A marker nested in a malformed one is still found.
		{"${e2b.secrets.${e2b.secrets.inner}}", []string{"inner"}},
		{"${e2b.secrets.bad name} and ${e2b.secrets.good}", []string{"good"}},
	} {
		if got := Placeholders(c.in); !slices.Equal(got, c.want) {
			t.Errorf("Placeholders(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestFill(t *testing.T) {
	ctx := context.Background()
	r := mapResolver{"user": "alice", "pass": "s3cr3t", "token-1": "tok", "evil": "${e2b.secrets.pass}", "a_b": "AB"}
	for _, c := range []struct{ in, want string }{
		{"no markers", "no markers"},
		{"Bearer ${e2b.secrets.token-1}", "Bearer tok"},
		{"${e2b.secrets.user}:${e2b.secrets.pass}", "alice:s3cr3t"},
		{"${e2b.secrets.USER}/${e2b.secrets.user}", "alice/alice"},
		{"${e2b.secrets.A_B}", "AB"},
		// Malformed markers stay as written, next to filled ones.
		{"${e2b.secrets.user name} ${e2b.secrets.user}", "${e2b.secrets.user name} alice"},
		{"${e2b.secrets.user", "${e2b.secrets.user"},
		{"${e2b.secrets.}", "${e2b.secrets.}"},
		// One pass: a value that looks like a marker is not resolved again.
		{"${e2b.secrets.evil}", "${e2b.secrets.pass}"},
	} {
		got, err := Fill(ctx, r, "k1", c.in)
		if err != nil || got != c.want {
			t.Errorf("Fill(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	_, err := Fill(ctx, r, "k1", "${e2b.secrets.user} ${e2b.secrets.missing} ${e2b.secrets.gone}")
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "missing") || strings.Contains(err.Error(), "gone") {
		t.Fatalf("unknown secret: %v", err)
	}
	if strings.Contains(err.Error(), "alice") {
		t.Fatalf("the error holds a value: %v", err)
	}
	// Another owner resolves nothing of k1's.
	if _, err := Fill(ctx, r, "k2", "${e2b.secrets.user}"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("other owner: %v", err)
	}
	// A resolver's other failures come back wrapped, naming the secret.
	boom := errors.New("boom")
	if _, err := Fill(ctx, failing{boom}, "k1", "${e2b.secrets.x}"); !errors.Is(err, boom) || !strings.Contains(err.Error(), `"x"`) {
		t.Fatalf("failing resolver: %v", err)
	}
}

type failing struct{ err error }

func (f failing) Value(context.Context, string, string) (string, error) { return "", f.err }
func (f failing) Exists(context.Context, string, string) (bool, error)  { return false, f.err }

var canonicalNameRE = regexp.MustCompile(`^[a-z0-9_-]{1,128}$`)

func FuzzPlaceholders(f *testing.F) {
	for _, s := range []string{
		"", "plain", "${e2b.secrets.a}", "${e2b.secrets.A-b_c}x${e2b.secrets.d}",
		"${e2b.secrets.}", "${e2b.secrets.a", "${e2b.secrets.${e2b.secrets.a}}",
		"$${e2b.secrets.a}}", "${e2b.secrets.a b}", "${e2b.secrets.ü}", "\x00${e2b.secrets.\x00}",
		"${e2b.secrets." + strings.Repeat("z", 129) + "}",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		names := Placeholders(s)
		if !strings.Contains(s, markerPrefix) && names != nil {
			t.Fatalf("Placeholders(%q) = %q without any marker prefix", s, names)
		}
		seen := map[string]bool{}
		lower := strings.ToLower(s)
		for _, n := range names {
			if !canonicalNameRE.MatchString(n) {
				t.Fatalf("Placeholders(%q): %q is no canonical name", s, n)
			}
			if seen[n] {
				t.Fatalf("Placeholders(%q): %q twice", s, n)
			}
			seen[n] = true
			if !strings.Contains(lower, strings.ToLower(markerPrefix)+n+"}") {
				t.Fatalf("Placeholders(%q): %q is not referenced", s, n)
			}
		}
		// Filling every placeholder with itself changes nothing but the
		// case of names: Fill replaces the markers and nothing else.
		r := mapResolver{}
		for _, n := range names {
			r[n] = markerPrefix + n + "}"
		}
		got, err := Fill(context.Background(), r, "k1", s)
		if err != nil {
			t.Fatalf("Fill(%q): %v", s, err)
		}
		if strings.ToLower(got) != lower {
			t.Fatalf("Fill(%q) with markers for values = %q", s, got)
		}
	})
}
