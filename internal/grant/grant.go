// Package grant makes the per-key credentials the API hands out for a
// resource that keeps one secret of its own — a sandbox's envd access
// token, a volume's content token — and checks them where they are
// presented: the sandbox proxy and the volume content API.
//
// A grant is "ak1.<keyID>.<mac>", mac being HMAC-SHA256 of the key ID
// under the resource's secret. It names the API key that obtained it, so
// it is worth exactly what that key is worth at the moment it is used:
// refused once the key is revoked or loses the scope, and told apart from
// a wrong token when it is another team's (which must look like a resource
// that does not exist). The resource's own secret stays on the server; the
// proxy puts it back in the request on its way to envd.
//
// The lifecycle: the API's handler calls Token(secret, keyID) for the key
// of the request that reads the resource; a client presents the grant (or
// a URL signature made with it); Checker.Check (or Checker.Signed for
// signatures) finds the key, and the caller forwards the request with the
// secret in the grant's place.
package grant

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/apikey"
)

const prefix = "ak1."

// Token is the grant of key keyID on a resource whose secret is secret.
func Token(secret, keyID string) string {
	return prefix + keyID + "." + mac(secret, keyID)
}

func mac(secret, keyID string) string {
	h := hmac.New(sha256.New, []byte(secret))
	h.Write([]byte("airlock grant v1\x00"))
	h.Write([]byte(keyID))
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil))
}

// KeyOf returns the key ID a grant names; ok is false for anything that
// is not shaped as a grant.
func KeyOf(token string) (keyID string, ok bool) {
	rest, ok := strings.CutPrefix(token, prefix)
	if !ok {
		return "", false
	}
	keyID, m, ok := strings.Cut(rest, ".")
	if !ok || keyID == "" || m == "" || strings.Contains(m, ".") {
		return "", false
	}
	return keyID, true
}

// Keys is what a Checker asks about keys (apikey.Service).
type Keys interface {
	// Key returns the live key of an ID: apikey.ErrRevoked or
	// apikey.ErrNotFound when there is none.
	Key(id string) (apikey.Principal, error)
	// TeamKeys returns a team's live keys.
	TeamKeys(team string) []apikey.Principal
}

// Errors of Check and Signed, which callers answer differently.
var (
	// ErrInvalid is a credential this resource does not take: not a
	// grant, a grant of no key, or a MAC that does not match.
	ErrInvalid = errors.New("invalid access token")
	// ErrRevoked is the grant of a key that was revoked.
	ErrRevoked = errors.New("the API key that obtained this access token was revoked")
	// ErrForeign is the grant of another team's key: callers answer it
	// exactly as a resource that does not exist.
	ErrForeign = errors.New("another team's access token")
)

// ScopeError is the grant of a key that no longer holds the scope the
// request needs (a key made read-only after it obtained the grant).
type ScopeError struct {
	Key   apikey.Principal
	Scope apikey.Scope
}

func (e *ScopeError) Error() string {
	return fmt.Sprintf("the API key that obtained this access token (%s) lacks the scope %s", e.Key.KeyName, e.Scope)
}

// Checker checks grants against the live keys.
type Checker struct {
	Keys Keys
	// Refused, when set, hears each grant refused to a key the grant
	// names truly (revoked, of another team, lacking the scope), for the
	// audit log; callers tell it through Report.
	Refused func(Refusal)
}

// Refusal is a grant refused to a known key.
type Refusal struct {
	Key apikey.Principal
	// Action is what was asked (a method and path); TargetKind and
	// TargetID what it was asked of.
	Action, TargetKind, TargetID string
	// Status is the HTTP status answered.
	Status int
	Reason error
}

// Report tells Refused of a refusal of Check or Signed, when the key it
// returned is known (a wrong MAC names no one).
func (c Checker) Report(r Refusal) {
	if c.Refused != nil && r.Key.KeyID != "" {
		c.Refused(r)
	}
}

// Check returns the key whose grant token is, on a resource of owner's
// team whose secret is secret, holding scope. Its errors are ErrInvalid,
// ErrRevoked, ErrForeign and *ScopeError, in the order a request meets
// them: which team comes before the MAC, so another team learns nothing
// from a forged one. With the last three it returns the key too, for
// Report; never as a key that may act.
func (c Checker) Check(token, owner, secret string, scope apikey.Scope) (apikey.Principal, error) {
	keyID, ok := KeyOf(token)
	if !ok {
		return apikey.Principal{}, ErrInvalid
	}
	p, err := c.Keys.Key(keyID)
	switch {
	case errors.Is(err, apikey.ErrRevoked):
		return p, ErrRevoked
	case err != nil:
		return apikey.Principal{}, ErrInvalid
	case p.Team != owner:
		return p, ErrForeign
	case !hmac.Equal([]byte(token), []byte(Token(secret, keyID))):
		return apikey.Principal{}, ErrInvalid
	case !p.Has(scope):
		return p, &ScopeError{Key: p, Scope: scope}
	}
	return p, nil
}

// Signed returns the key of owner's team whose grant on secret made a
// signature: made(token) says whether the signature was made with token.
// ErrInvalid when none did (a revoked key's grant included), a
// *ScopeError when the key that did lacks scope.
func (c Checker) Signed(owner, secret string, scope apikey.Scope, made func(token string) bool) (apikey.Principal, error) {
	return signedBy(c.Keys.TeamKeys(owner), secret, scope, made)
}

func signedBy(keys []apikey.Principal, secret string, scope apikey.Scope, made func(token string) bool) (apikey.Principal, error) {
	for _, p := range keys {
		if made(Token(secret, p.KeyID)) {
			if !p.Has(scope) {
				return p, &ScopeError{Key: p, Scope: scope}
			}
			return p, nil
		}
	}
	return apikey.Principal{}, ErrInvalid
}

// Signers is Signed over many resources at once (the proxy's routing of a
// signed URL that names no sandbox): each team's keys are looked up once.
type Signers struct {
	c     Checker
	teams map[string][]apikey.Principal
}

// Signers returns a fresh Signers.
func (c Checker) Signers() *Signers {
	return &Signers{c: c, teams: map[string][]apikey.Principal{}}
}

// Signed is Checker.Signed with the team's keys remembered.
func (s *Signers) Signed(owner, secret string, scope apikey.Scope, made func(token string) bool) (apikey.Principal, error) {
	keys, ok := s.teams[owner]
	if !ok {
		keys = s.c.Keys.TeamKeys(owner)
		s.teams[owner] = keys
	}
	return signedBy(keys, secret, scope, made)
}
