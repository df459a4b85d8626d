package grant

import (
	"errors"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/apikey"
	"github.com/airlock-sandbox/airlock/internal/grant/granttest"
)

var live = granttest.Keys{Revoked: map[string]apikey.Principal{
	"revoked": {KeyID: "revoked", KeyName: "old", Team: "t1"},
}, Live: map[string]apikey.Principal{
	"k1": {KeyID: "k1", KeyName: "writer", Team: "t1", Scopes: apikey.All},
	"k2": {KeyID: "k2", KeyName: "reader", Team: "t1", Scopes: []apikey.Scope{apikey.SandboxesRead}},
	"k3": {KeyID: "k3", KeyName: "other", Team: "t2", Scopes: apikey.All},
	// a UUID-shaped ID, as apikey makes them
	"0f8fad5b-d9cb-469f-a165-70867728950e": {KeyID: "0f8fad5b-d9cb-469f-a165-70867728950e", Team: "t1", Scopes: apikey.All},
}}

func TestToken(t *testing.T) {
	a, b := Token("s1", "k1"), Token("s1", "k2")
	if a == b || a == Token("s2", "k1") || a != Token("s1", "k1") {
		t.Fatal("grants are not one per (secret, key)")
	}
	if strings.Contains(a, "s1") {
		t.Fatalf("the grant %q shows its secret", a)
	}
	for tok, want := range map[string]string{
		a: "k1", Token("x", "0f8fad5b-d9cb-469f-a165-70867728950e"): "0f8fad5b-d9cb-469f-a165-70867728950e",
		"ak1.k1": "", "ak1..abc": "", "ak1.k1.": "", "ak1.k1.a.b": "", "e2b_abc": "", "": "", "AK1.k1.abc": "",
	} {
		got, ok := KeyOf(tok)
		if got != want || ok != (want != "") {
			t.Errorf("KeyOf(%q) = %q, %v; want %q", tok, got, ok, want)
		}
	}
}

func TestCheck(t *testing.T) {
	c := Checker{Keys: live}
	var se *ScopeError
	for _, tc := range []struct {
		name, token, owner string
		scope              apikey.Scope
		err                error
	}{
		{"the key's own grant", Token("s", "k1"), "t1", apikey.SandboxesWrite, nil},
		{"a UUID key", Token("s", "0f8fad5b-d9cb-469f-a165-70867728950e"), "t1", apikey.SandboxesWrite, nil},
		{"the secret itself", "s", "t1", apikey.SandboxesWrite, ErrInvalid},
		{"another resource's grant", Token("other", "k1"), "t1", apikey.SandboxesWrite, ErrInvalid},
		{"a key never made", Token("s", "nobody"), "t1", apikey.SandboxesWrite, ErrInvalid},
		{"a revoked key", Token("s", "revoked"), "t1", apikey.SandboxesWrite, ErrRevoked},
		{"another team's key", Token("s", "k3"), "t1", apikey.SandboxesWrite, ErrForeign},
		{"another team's key with a forged MAC", "ak1.k3.AAAA", "t1", apikey.SandboxesWrite, ErrForeign},
		{"a forged MAC of the team's key", "ak1.k1.AAAA", "t1", apikey.SandboxesWrite, ErrInvalid},
		{"a read-only key reading", Token("s", "k2"), "t1", apikey.SandboxesRead, nil},
	} {
		p, err := c.Check(tc.token, tc.owner, "s", tc.scope)
		if !errors.Is(err, tc.err) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.err)
		}
		if err == nil && p.Team != tc.owner {
			t.Errorf("%s: key of team %s", tc.name, p.Team)
		}
	}
	if _, err := c.Check(Token("s", "k2"), "t1", "s", apikey.SandboxesWrite); !errors.As(err, &se) || se.Scope != apikey.SandboxesWrite || !strings.Contains(err.Error(), "reader") {
		t.Fatalf("a read-only key writing: %v", err)
	}
}

func TestSigned(t *testing.T) {
	c := Checker{Keys: live}
	sig := func(token string) string { return "sig:" + token }
	made := func(s string) func(string) bool { return func(tok string) bool { return sig(tok) == s } }
	if p, err := c.Signed("t1", "s", apikey.SandboxesWrite, made(sig(Token("s", "k1")))); err != nil || p.KeyID != "k1" {
		t.Fatalf("the writer's signature: %+v %v", p, err)
	}
	var se *ScopeError
	if _, err := c.Signed("t1", "s", apikey.SandboxesWrite, made(sig(Token("s", "k2")))); !errors.As(err, &se) {
		t.Fatalf("the reader's signature: %v", err)
	}
	for name, s := range map[string]string{
		"the secret's": sig("s"), "another team's key": sig(Token("s", "k3")), "a revoked key": sig(Token("s", "revoked")),
	} {
		if _, err := c.Signed("t1", "s", apikey.SandboxesWrite, made(s)); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
	ss := c.Signers()
	for range 2 { // the second from the remembered keys
		if _, err := ss.Signed("t2", "s", apikey.SandboxesWrite, made(sig(Token("s", "k3")))); err != nil {
			t.Fatal(err)
		}
	}
}
