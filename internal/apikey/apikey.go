// Package apikey is who may call Airlock: teams, the API keys Airlock makes
// for them (kept only as a SHA-256, shown once), the scopes each key holds,
// and the bootstrap keys of AIRLOCK_API_KEY (or the data dir's key file),
// which hold every scope.
//
// A key's lifecycle: Create makes it (random, e2b_<40 hex>, the shape the
// Python SDK insists on) and returns it once; Authenticate turns a key a
// request carries into a Principal from memory (no database read per
// request); Update changes its name and scopes; Revoke ends it, at once for
// every later request of this process. The team is the owner of everything
// a key makes: sandboxes, templates, snapshots, volumes, secrets, webhooks
// and events carry the team's ID where they carried the key's digest, and
// a bootstrap key's team ID is that digest, so what it made stays its own.
package apikey

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/store"
)

// Scope is one permission a key holds.
type Scope string

// The scopes. A read scope lists and reads; a write scope also changes.
const (
	SandboxesRead  Scope = "sandboxes:read"
	SandboxesWrite Scope = "sandboxes:write"
	TemplatesRead  Scope = "templates:read"
	TemplatesWrite Scope = "templates:write"
	VolumesRead    Scope = "volumes:read"
	VolumesWrite   Scope = "volumes:write"
	WebhooksRead   Scope = "webhooks:read"
	WebhooksWrite  Scope = "webhooks:write"
	SecretsRead    Scope = "secrets:read"
	SecretsWrite   Scope = "secrets:write"
	// KeysAdmin manages teams, keys and quotas and reads the audit log of
	// every team.
	KeysAdmin Scope = "keys:admin"
)

// All is every scope, in the order they are shown.
var All = []Scope{SandboxesRead, SandboxesWrite, TemplatesRead, TemplatesWrite, VolumesRead, VolumesWrite,
	WebhooksRead, WebhooksWrite, SecretsRead, SecretsWrite, KeysAdmin}

// Everyday is what a key gets when its maker names no scopes: all but
// keys:admin.
var Everyday = All[:len(All)-1]

// ParseScopes reads scopes given as a list (each may hold several,
// separated by commas or spaces): a scope's name, "<area>:*" for its read
// and write, or "*" for every scope. An unknown name is an error that
// names it; so is an empty list.
func ParseScopes(list []string) ([]Scope, error) {
	set := map[Scope]bool{}
	for _, item := range list {
		for _, name := range strings.FieldsFunc(item, func(r rune) bool { return r == ',' || r == ' ' }) {
			switch {
			case name == "*":
				for _, s := range All {
					set[s] = true
				}
			case strings.HasSuffix(name, ":*"):
				area := strings.TrimSuffix(name, ":*")
				found := false
				for _, s := range All {
					if strings.HasPrefix(string(s), area+":") {
						set[s], found = true, true
					}
				}
				if !found {
					return nil, fmt.Errorf("unknown scope %q (known: %s)", name, knownScopes())
				}
			case slices.Contains(All, Scope(name)):
				set[Scope(name)] = true
			default:
				return nil, fmt.Errorf("unknown scope %q (known: %s)", name, knownScopes())
			}
		}
	}
	if len(set) == 0 {
		return nil, errors.New("no scope given")
	}
	var out []Scope
	for _, s := range All {
		if set[s] {
			out = append(out, s)
		}
	}
	return out, nil
}

func knownScopes() string {
	names := make([]string, len(All))
	for i, s := range All {
		names[i] = string(s)
	}
	return strings.Join(names, ", ") + `, "<area>:*" or "*"`
}

func joinScopes(ss []Scope) string {
	names := make([]string, len(ss))
	for i, s := range ss {
		names[i] = string(s)
	}
	return strings.Join(names, " ")
}

// Principal is who a request acts as.
type Principal struct {
	// KeyID is the key's ID; a bootstrap key's is "bootstrap-<n>".
	KeyID, KeyName string
	// Team owns what the key makes and is all it can see.
	Team   string
	Scopes []Scope
	// Bootstrap keys come from the server's configuration.
	Bootstrap bool
}

// Has reports whether the principal holds scope s.
func (p Principal) Has(s Scope) bool { return slices.Contains(p.Scopes, s) }

// Errors callers map to statuses.
var (
	ErrInvalid  = errors.New("invalid request")
	ErrNotFound = errors.New("not found")
	// ErrEscalation is a key asking for more than it holds.
	ErrEscalation = errors.New("scope escalation")
	// ErrRevoked is a key that was revoked (Authenticate tells it apart
	// from one never made, so its holder learns why).
	ErrRevoked = errors.New("revoked API key")
)

// Store is what the service keeps its records in (store.SQLite).
type Store interface {
	PutTeam(ctx context.Context, t store.Team) error
	Teams(ctx context.Context) ([]store.Team, error)
	SetTeamQuotas(ctx context.Context, id, quotas string) error
	PutAPIKey(ctx context.Context, k store.APIKey) error
	APIKeys(ctx context.Context) ([]store.APIKey, error)
	APIKey(ctx context.Context, id string) (store.APIKey, error)
	UpdateAPIKey(ctx context.Context, id, name, scopes string) error
	RevokeAPIKey(ctx context.Context, id string, at time.Time) error
	TouchAPIKeys(ctx context.Context, used map[string]time.Time) error
}

// Service keeps the teams and keys, and answers who a key is.
type Service struct {
	st  Store
	log *slog.Logger
	now func() time.Time

	mu sync.RWMutex
	// byHash is every live key by its SHA-256 (hex), bootstrap keys too.
	byHash map[string]Principal
	// byID is every key's hash by its ID, revoked ones too: grants name
	// the key that obtained them by ID (Key).
	byID map[string]string
	// byTeam is the hashes of each team's live keys (TeamKeys: a signed
	// URL is checked against each).
	byTeam map[string]map[string]bool
	teams  map[string]store.Team // by ID
	// used is when each stored key was last seen, not yet written.
	used map[string]time.Time
	// revoked holds the revoked keys by hash: who they were, for the audit
	// log of a request that still uses one.
	revoked map[string]Principal
	// bootstrap are the bootstrap keys (Options.Bootstrap).
	bootstrap []bootstrapKey
}

// Options configures New.
type Options struct {
	// Bootstrap keys hold every scope; each is its own team, whose ID is
	// TeamOf(key) (the digest Airlock has always recorded as the owner).
	Bootstrap []string
	TeamOf    func(key string) string
	Logger    *slog.Logger
	Now       func() time.Time
}

// New loads the teams and keys and adds the bootstrap keys' teams when
// they are missing.
func New(ctx context.Context, st Store, o Options) (*Service, error) {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	s := &Service{st: st, log: o.Logger, now: o.Now, byHash: map[string]Principal{}, byID: map[string]string{}, byTeam: map[string]map[string]bool{}, teams: map[string]store.Team{}, used: map[string]time.Time{}, revoked: map[string]Principal{}}
	teams, err := st.Teams(ctx)
	if err != nil {
		return nil, err
	}
	names := map[string]bool{}
	for _, t := range teams {
		names[t.Name] = true
	}
	have := map[string]bool{}
	for _, t := range teams {
		have[t.ID] = true
	}
	for i, key := range o.Bootstrap {
		team := o.TeamOf(key)
		if !have[team] {
			name := "default"
			if i > 0 || names[name] {
				name = "team-" + team[:min(8, len(team))]
			}
			t := store.Team{ID: team, Name: name, CreatedAt: o.Now()}
			if err := st.PutTeam(ctx, t); err != nil {
				return nil, fmt.Errorf("bootstrap key %d's team: %w", i+1, err)
			}
			have[team], names[name] = true, true
		}
		s.bootstrap = append(s.bootstrap, bootstrapKey{hashKey(key),
			Principal{KeyID: fmt.Sprintf("bootstrap-%d", i+1), KeyName: "bootstrap", Team: team, Scopes: All, Bootstrap: true}})
	}
	if err := s.Reload(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// bootstrapKey is a bootstrap key: live whatever the store holds.
type bootstrapKey struct {
	hash string
	p    Principal
}

// Reload reads the teams and keys from the store again, in place of what
// the service held: the keys and teams another process made, changed or
// revoked since are taken up. Replicas sharing one store call it every
// few seconds; one server alone needs it only at New, since every change
// goes through it.
func (s *Service) Reload(ctx context.Context) error {
	teams, err := s.st.Teams(ctx)
	if err != nil {
		return err
	}
	keys, err := s.st.APIKeys(ctx)
	if err != nil {
		return err
	}
	fresh := &Service{byHash: map[string]Principal{}, byID: map[string]string{}, byTeam: map[string]map[string]bool{},
		teams: map[string]store.Team{}, revoked: map[string]Principal{}}
	for _, t := range teams {
		fresh.teams[t.ID] = t
	}
	for _, b := range s.bootstrap {
		fresh.putLive(b.hash, b.p)
	}
	for _, k := range keys {
		if !k.RevokedAt.IsZero() {
			fresh.byID[k.ID] = k.Hash // Key tells a revoked key's grants why
			fresh.revoked[k.Hash] = Principal{KeyID: k.ID, KeyName: k.Name, Team: k.TeamID}
			continue
		}
		p, err := principalOf(k)
		if err != nil {
			s.log.Warn("api key with unreadable scopes left out", "key", k.ID, "err", err)
			continue
		}
		fresh.putLive(k.Hash, p)
	}
	s.mu.Lock()
	s.byHash, s.byID, s.byTeam, s.teams, s.revoked = fresh.byHash, fresh.byID, fresh.byTeam, fresh.teams, fresh.revoked
	s.mu.Unlock()
	return nil
}

func principalOf(k store.APIKey) (Principal, error) {
	scopes, err := ParseScopes([]string{k.Scopes})
	if err != nil {
		return Principal{}, err
	}
	return Principal{KeyID: k.ID, KeyName: k.Name, Team: k.TeamID, Scopes: scopes}, nil
}

func hashKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// keyShape is what a key looks like; anything else is refused before any
// lookup, with a message that says so.
var keyShape = regexp.MustCompile(`^[A-Za-z0-9_\-]{8,200}$`)

// ErrMalformed is a key that cannot be a key of any shape.
var ErrMalformed = errors.New("malformed API key")

// Authenticate returns who key is; ErrMalformed, ErrNotFound (unknown) or
// ErrRevoked otherwise, the last with who the key was and no scopes. It
// reads memory only.
func (s *Service) Authenticate(key string) (Principal, error) {
	if !keyShape.MatchString(key) {
		return Principal{}, ErrMalformed
	}
	h := hashKey(key)
	s.mu.RLock()
	p, ok := s.byHash[h]
	was, revoked := s.revoked[h]
	s.mu.RUnlock()
	if revoked { // who it was, without scopes: for the audit log only
		return was, ErrRevoked
	}
	if !ok {
		return Principal{}, ErrNotFound
	}
	if !p.Bootstrap {
		s.mu.Lock()
		s.used[p.KeyID] = s.now()
		s.mu.Unlock()
	}
	return p, nil
}

// Key returns the live key of ID id, from memory: ErrRevoked (with who the
// key was) or ErrNotFound when there is none. Grants are checked with it,
// so a revoked key's grants fail from the moment Revoke starts.
func (s *Service) Key(id string) (Principal, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	h, ok := s.byID[id]
	if !ok {
		return Principal{}, ErrNotFound
	}
	if p, ok := s.byHash[h]; ok {
		return p, nil
	}
	if was, ok := s.revoked[h]; ok {
		return was, ErrRevoked
	}
	return Principal{}, ErrNotFound
}

// TeamKeys returns the live keys of team, in no order.
func (s *Service) TeamKeys(team string) []Principal {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]Principal, 0, len(s.byTeam[team]))
	for h := range s.byTeam[team] {
		out = append(out, s.byHash[h])
	}
	return out
}

// putLive makes a key live (or changes it), in every index of live keys;
// the caller holds s.mu.
func (s *Service) putLive(hash string, p Principal) {
	if old, ok := s.byHash[hash]; ok && old.Team != p.Team {
		delete(s.byTeam[old.Team], hash)
	}
	s.byHash[hash] = p
	s.byID[p.KeyID] = hash
	if s.byTeam[p.Team] == nil {
		s.byTeam[p.Team] = map[string]bool{}
	}
	s.byTeam[p.Team][hash] = true
}

// dropLive ends a live key; the caller holds s.mu.
func (s *Service) dropLive(hash string) {
	if p, ok := s.byHash[hash]; ok {
		delete(s.byTeam[p.Team], hash)
		if len(s.byTeam[p.Team]) == 0 {
			delete(s.byTeam, p.Team)
		}
	}
	delete(s.byHash, hash)
}

// FlushUsage writes when keys were last used; the server calls it every
// few seconds and at shutdown.
func (s *Service) FlushUsage(ctx context.Context) error {
	s.mu.Lock()
	used := s.used
	s.used = map[string]time.Time{}
	s.mu.Unlock()
	return s.st.TouchAPIKeys(ctx, used)
}

// Team returns a team by ID.
func (s *Service) Team(id string) (store.Team, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	t, ok := s.teams[id]
	return t, ok
}

// Teams returns every team, by name.
func (s *Service) Teams() []store.Team {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]store.Team, 0, len(s.teams))
	for _, t := range s.teams {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

var teamName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// EnsureTeam returns the team named name, made now when there is none.
func (s *Service) EnsureTeam(ctx context.Context, name string) (store.Team, error) {
	if !teamName.MatchString(name) {
		return store.Team{}, fmt.Errorf("%w: team name %q must be 1-63 of a-z, 0-9, _ and -, starting with a letter or digit", ErrInvalid, name)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range s.teams {
		if t.Name == name {
			return t, nil
		}
	}
	t := store.Team{ID: randomHex(8), Name: name, CreatedAt: s.now()}
	if err := s.st.PutTeam(ctx, t); err != nil {
		return store.Team{}, err
	}
	s.teams[t.ID] = t
	return t, nil
}

// TeamByRef finds a team by ID or name.
func (s *Service) TeamByRef(ref string) (store.Team, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if t, ok := s.teams[ref]; ok {
		return t, true
	}
	for _, t := range s.teams {
		if t.Name == ref {
			return t, true
		}
	}
	return store.Team{}, false
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails on Linux
	return hex.EncodeToString(b)
}

// CreateRequest asks for a key.
type CreateRequest struct {
	TeamID string
	Name   string
	Scopes []Scope // nil: Everyday
	// By is who asks; nil is the operator at the command line. A key can
	// give no scope it does not hold itself.
	By *Principal
}

// Created is a new key: its record and, this once, the key itself.
type Created struct {
	Record store.APIKey
	Key    string
}

// maxKeyName bounds a key's name.
const maxKeyName = 128

// Create makes a key for a team.
func (s *Service) Create(ctx context.Context, r CreateRequest) (Created, error) {
	r.Name = strings.TrimSpace(r.Name)
	if r.Name == "" || len(r.Name) > maxKeyName {
		return Created{}, fmt.Errorf("%w: a key's name must be 1-%d characters", ErrInvalid, maxKeyName)
	}
	if _, ok := s.Team(r.TeamID); !ok {
		return Created{}, fmt.Errorf("%w: team %s", ErrNotFound, r.TeamID)
	}
	if r.Scopes == nil {
		r.Scopes = Everyday
	}
	if err := mayGrant(r.By, r.Scopes); err != nil {
		return Created{}, err
	}
	key := "e2b_" + randomHex(20)
	rec := store.APIKey{
		ID: newID(), TeamID: r.TeamID, Name: r.Name, Hash: hashKey(key),
		Prefix: "e2b_", MaskPrefix: key[4:6], MaskSuffix: key[len(key)-4:], Length: len(key),
		Scopes: joinScopes(r.Scopes), CreatedAt: s.now(),
	}
	if r.By != nil {
		rec.CreatedBy = r.By.KeyID
	}
	if err := s.st.PutAPIKey(ctx, rec); err != nil {
		return Created{}, err
	}
	p, _ := principalOf(rec)
	s.mu.Lock()
	s.putLive(rec.Hash, p)
	s.mu.Unlock()
	return Created{Record: rec, Key: key}, nil
}

// mayGrant refuses scopes the asker does not hold itself.
func mayGrant(by *Principal, scopes []Scope) error {
	if by == nil {
		return nil
	}
	for _, sc := range scopes {
		if !by.Has(sc) {
			return fmt.Errorf("%w: the key %s does not hold %s, so it cannot give it", ErrEscalation, by.KeyName, sc)
		}
	}
	return nil
}

// newID is a UUID (version 4), the shape E2B's TeamAPIKey.id declares.
func newID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// List returns the keys of a team ("" every team), revoked ones too.
func (s *Service) List(ctx context.Context, teamID string) ([]store.APIKey, error) {
	all, err := s.st.APIKeys(ctx)
	if err != nil {
		return nil, err
	}
	if teamID == "" {
		return all, nil
	}
	return slices.DeleteFunc(all, func(k store.APIKey) bool { return k.TeamID != teamID }), nil
}

// Get returns one key's record.
func (s *Service) Get(ctx context.Context, id string) (store.APIKey, error) {
	k, err := s.st.APIKey(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return store.APIKey{}, fmt.Errorf("%w: api key %s", ErrNotFound, id)
	}
	return k, err
}

// Update renames a key and, when scopes is not nil, replaces its scopes;
// by may give no scope it does not hold.
func (s *Service) Update(ctx context.Context, id, name string, scopes []Scope, by *Principal) (store.APIKey, error) {
	k, err := s.Get(ctx, id)
	if err != nil {
		return store.APIKey{}, err
	}
	if !k.RevokedAt.IsZero() {
		return store.APIKey{}, fmt.Errorf("%w: api key %s is revoked", ErrNotFound, id)
	}
	if name = strings.TrimSpace(name); name == "" {
		name = k.Name
	}
	if len(name) > maxKeyName {
		return store.APIKey{}, fmt.Errorf("%w: a key's name must be 1-%d characters", ErrInvalid, maxKeyName)
	}
	if scopes != nil {
		if err := mayGrant(by, scopes); err != nil {
			return store.APIKey{}, err
		}
		k.Scopes = joinScopes(scopes)
	}
	k.Name = name
	if err := s.st.UpdateAPIKey(ctx, id, k.Name, k.Scopes); err != nil {
		return store.APIKey{}, err
	}
	p, _ := principalOf(k)
	s.mu.Lock()
	// Only while live: a Revoke since the Get above must not be undone.
	if _, live := s.byHash[k.Hash]; live {
		s.putLive(k.Hash, p)
	}
	s.mu.Unlock()
	return k, nil
}

// Revoke ends a key: every later request with it is refused.
func (s *Service) Revoke(ctx context.Context, id string) error {
	k, err := s.Get(ctx, id)
	if err != nil {
		return err
	}
	// Out of memory first: a request racing the revocation is refused
	// whether or not the record is written yet.
	s.mu.Lock()
	p, live := s.byHash[k.Hash]
	s.dropLive(k.Hash)
	s.revoked[k.Hash] = Principal{KeyID: k.ID, KeyName: k.Name, Team: k.TeamID}
	s.mu.Unlock()
	if err := s.st.RevokeAPIKey(ctx, id, s.now()); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("%w: api key %s (or revoked already)", ErrNotFound, id)
		}
		if live { // not revoked after all: the record says so, and so does memory
			s.mu.Lock()
			s.putLive(k.Hash, p)
			delete(s.revoked, k.Hash)
			s.mu.Unlock()
		}
		return err
	}
	return nil
}

// Quotas are a team's limits; a zero field is the server's default (for
// Sandboxes, serve's per-key cap) or no limit.
type Quotas struct {
	// Sandboxes alive at once: running, paused or starting.
	Sandboxes int `json:"sandboxes,omitempty"`
	// VCPUs and MemoryMB of the running sandboxes together.
	VCPUs    int `json:"vcpus,omitempty"`
	MemoryMB int `json:"memoryMB,omitempty"`
	// PausedSandboxes at once.
	PausedSandboxes int `json:"pausedSandboxes,omitempty"`
	// PausedDiskMB is what the paused sandboxes hold on disk together:
	// their checkpoint images and writable layers.
	PausedDiskMB int `json:"pausedDiskMB,omitempty"`
	// RequestsPerSecond to the API, bursts of a second's worth.
	RequestsPerSecond float64 `json:"requestsPerSecond,omitempty"`
	// Builds of templates waiting or building at once.
	Builds int `json:"builds,omitempty"`
	// VolumesMB is the total size of the team's volumes.
	VolumesMB int `json:"volumesMB,omitempty"`
}

// Quotas returns a team's quotas (zero for a team without any, or unknown).
func (s *Service) Quotas(teamID string) Quotas {
	s.mu.RLock()
	t, ok := s.teams[teamID]
	s.mu.RUnlock()
	var q Quotas
	if ok && t.Quotas != "" {
		_ = json.Unmarshal([]byte(t.Quotas), &q) // written by SetQuotas only
	}
	return q
}

// SetQuotas replaces a team's quotas.
func (s *Service) SetQuotas(ctx context.Context, teamID string, q Quotas) error {
	if q.Sandboxes < 0 || q.VCPUs < 0 || q.MemoryMB < 0 || q.PausedSandboxes < 0 || q.PausedDiskMB < 0 || q.RequestsPerSecond < 0 || q.Builds < 0 || q.VolumesMB < 0 {
		return fmt.Errorf("%w: a quota is 0 (the default) or more", ErrInvalid)
	}
	b, err := json.Marshal(q)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.teams[teamID]
	if !ok {
		return fmt.Errorf("%w: team %s", ErrNotFound, teamID)
	}
	if err := s.st.SetTeamQuotas(ctx, teamID, string(b)); err != nil {
		return err
	}
	t.Quotas = string(b)
	s.teams[teamID] = t
	return nil
}
