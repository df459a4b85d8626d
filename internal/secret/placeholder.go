package secret

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// markerPrefix starts a secret placeholder, as the SDKs' Secret.fill(name)
// writes it: ${e2b.secrets.<name>}.
const markerPrefix = "${e2b.secrets."

// markerRE matches a well-formed placeholder: the prefix, a name E2B allows
// (1 to 128 of [a-zA-Z0-9_-]), and the closing brace. Anything else that
// starts like one (a space, a dot, an unclosed brace, a longer name) is no
// placeholder and stays as written.
var markerRE = regexp.MustCompile(`\$\{e2b\.secrets\.([a-zA-Z0-9_-]{1,128})\}`)

// Placeholders returns the secret names referenced as ${e2b.secrets.<name>}
// in s, in order. Each name is given once (at its first reference), in its
// canonical lower-case form (names are case-insensitive).
func Placeholders(s string) []string {
	if !strings.Contains(s, markerPrefix) {
		return nil
	}
	var names []string
	seen := map[string]bool{}
	for _, m := range markerRE.FindAllStringSubmatch(s, -1) {
		name := CanonicalName(m[1])
		if !seen[name] {
			seen[name] = true
			names = append(names, name)
		}
	}
	return names
}

// Fill replaces each ${e2b.secrets.<name>} in s with its value from r
// (error naming the first unknown secret). It makes one pass: a value that
// itself looks like a placeholder is put in as it is, never resolved again.
// The error never holds a value.
func Fill(ctx context.Context, r Resolver, owner, s string) (string, error) {
	names := Placeholders(s)
	if len(names) == 0 {
		return s, nil
	}
	values := make(map[string]string, len(names))
	for _, name := range names {
		v, err := r.Value(ctx, owner, name)
		switch {
		case errors.Is(err, ErrNotFound):
			return "", fmt.Errorf("%w: the placeholder ${e2b.secrets.%s} names no secret of this API key", ErrNotFound, name)
		case err != nil:
			return "", fmt.Errorf("secret %q: %w", name, err)
		}
		values[name] = v
	}
	return markerRE.ReplaceAllStringFunc(s, func(m string) string {
		return values[CanonicalName(m[len(markerPrefix):len(m)-1])]
	}), nil
}
