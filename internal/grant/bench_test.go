package grant_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/apikey"
	"github.com/airlock-sandbox/airlock/internal/envdapi"
	"github.com/airlock-sandbox/airlock/internal/grant"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// keyService is the real key service with n keys in up to 100 teams; it
// returns the service and the last key made, with its team.
func keyService(b *testing.B, n int) (*apikey.Service, apikey.Principal) {
	ctx := context.Background()
	st, err := store.OpenSQLite(filepath.Join(b.TempDir(), "state.db"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	const boot = "e2b_bootstrap00000000000000000000000000000"
	s, err := apikey.New(ctx, st, apikey.Options{Bootstrap: []string{boot}, TeamOf: func(string) string { return "boot-team" }})
	if err != nil {
		b.Fatal(err)
	}
	key := boot
	for i := 1; i < n; i++ {
		t, err := s.EnsureTeam(ctx, fmt.Sprintf("t%d", i%100))
		if err != nil {
			b.Fatal(err)
		}
		c, err := s.Create(ctx, apikey.CreateRequest{TeamID: t.ID, Name: "k"})
		if err != nil {
			b.Fatal(err)
		}
		key = c.Key
	}
	p, err := s.Authenticate(key)
	if err != nil {
		b.Fatal(err)
	}
	return s, p
}

// BenchmarkCheck is what the sandbox proxy adds to every envd request: a
// key by its ID and one HMAC. BenchmarkSigned is a signed URL's check: a
// grant and a signature per live key of the team (10 with 1,000 keys in
// 100 teams).
func BenchmarkCheck(b *testing.B) {
	for _, n := range []int{1, 1000} {
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			s, p := keyService(b, n)
			c := grant.Checker{Keys: s}
			tok := grant.Token("sandbox-secret", p.KeyID)
			for b.Loop() {
				if _, err := c.Check(tok, p.Team, "sandbox-secret", apikey.SandboxesWrite); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkSigned(b *testing.B) {
	for _, n := range []int{1, 1000} {
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			s, p := keyService(b, n)
			c := grant.Checker{Keys: s}
			sig := envdapi.QuerySignature("/home/user/f", "read", "user", grant.Token("sandbox-secret", p.KeyID), "")
			for b.Loop() {
				if _, err := c.Signed(p.Team, "sandbox-secret", apikey.SandboxesWrite, func(tok string) bool {
					return envdapi.QuerySignature("/home/user/f", "read", "user", tok, "") == sig
				}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
