// Package granttest is a grant.Keys for tests: keys in memory, by ID.
package granttest

import "github.com/airlock-sandbox/airlock/internal/apikey"

// Keys holds live keys by ID; a key whose ID is in Revoked is revoked
// (Key returns it with apikey.ErrRevoked, as apikey.Service does).
type Keys struct {
	Live    map[string]apikey.Principal
	Revoked map[string]apikey.Principal
}

// Key returns a key by ID.
func (k Keys) Key(id string) (apikey.Principal, error) {
	if p, ok := k.Revoked[id]; ok {
		return p, apikey.ErrRevoked
	}
	if p, ok := k.Live[id]; ok {
		return p, nil
	}
	return apikey.Principal{}, apikey.ErrNotFound
}

// TeamKeys returns a team's live keys.
func (k Keys) TeamKeys(team string) []apikey.Principal {
	var out []apikey.Principal
	for _, p := range k.Live {
		if p.Team == team {
			out = append(out, p)
		}
	}
	return out
}
