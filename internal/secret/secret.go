// Package secret is the secret store: values an API key keeps on the server
// so that sandboxes can use them without ever holding them (E2B's secrets,
// `/secrets`). It creates, updates, lists, finds and destroys secrets per
// owner (the digest of an API key, e2b.OwnerOf, as volumes, sandboxes and
// templates are owned), keeps names unique per owner, and bounds each
// owner's count and each value's size.
//
// Values are write-only: nothing this package returns through Create,
// Update, Get or List carries one, and no error or log line it makes holds
// one. The only way to a value is Resolver.Value (and Fill over it), which
// the egress proxy calls to put a value into a request leaving a sandbox.
//
// At rest, values are sealed with AES-256-GCM under a key kept in a file of
// its own (<data>/secrets.key, LoadOrCreateKey), bound to their secret's
// owner and ID: a copy of the database alone gives no value away, and a
// value moved to another row does not decrypt. Only the current version of
// a value is kept (an update overwrites the old ciphertext): nothing reads
// an old version (the API never returns values, the egress proxy wants the
// current one), and an old value kept would only be one more thing a stolen
// database and key give away.
package secret

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/store"
)

// Limits (the spec's for names and metadata; Airlock's own for values and
// the default count).
const (
	DefaultMaxCount       = 100      // secrets per owner
	DefaultMaxValueBytes  = 64 << 10 // one value
	MaxNameLength         = 128
	MaxMetadataEntries    = 32
	MaxMetadataKeyBytes   = 128
	MaxMetadataValueBytes = 1024
	MaxMetadataBytes      = 8192 // keys and values of one secret together
	// IDPrefix starts every secret ID; names may not start with it.
	IDPrefix = "sec_"
	idBytes  = 12
)

// Errors the service returns (wrapped, with the details in the message);
// the API maps them to statuses. ErrNotFound is also the Resolver's.
var (
	ErrNotFound = errors.New("secret not found")
	ErrInvalid  = errors.New("invalid secret request")
	ErrExists   = errors.New("secret name already exists")
	ErrLimit    = errors.New("secret limit reached")
)

// Resolver gives the egress proxy a secret's current value.
//
// owner is the identity every per-key resource is scoped by: the digest of
// the API key (e2b.OwnerOf(apiKey), the 16 hex digits a sandbox's record
// keeps as its Owner, store.Sandbox.Owner). A sandbox's rules resolve with
// its own owner, so one key's sandbox never reaches another key's secrets.
type Resolver interface {
	// Value returns the current value of the owner's secret called name
	// (case-insensitive; a secret's sec_ ID works as well).
	// An unknown or deleted secret is an error wrapping ErrNotFound.
	Value(ctx context.Context, owner, name string) (string, error)
	// Exists reports whether owner has a secret called name.
	Exists(ctx context.Context, owner, name string) (bool, error)
}

// Store is what the service keeps its records in (store.SQLite).
type Store interface {
	InsertSecret(ctx context.Context, sec store.Secret, maxCount int) error
	UpdateSecret(ctx context.Context, owner, id string, u store.SecretUpdate) (store.Secret, error)
	GetSecret(ctx context.Context, owner, ref string, byName bool) (store.Secret, error)
	ListSecrets(ctx context.Context, owner, after string, limit int) ([]store.Secret, error)
	DeleteSecret(ctx context.Context, owner, id string) error
	CountSecretsNotUnder(ctx context.Context, keyID string) (int, error)
}

// Options configures the service.
type Options struct {
	Store Store // required
	// KeyFile holds the key values are sealed with (layout's SecretsKey);
	// made on first use. Key, when set, is used instead (tests).
	KeyFile string
	Key     []byte
	// MaxPerOwner bounds each owner's number of secrets: zero is
	// DefaultMaxCount, negative is no limit.
	MaxPerOwner int
	// MaxValueBytes bounds one value (zero: DefaultMaxValueBytes).
	MaxValueBytes int
	Logger        *slog.Logger
}

// Secret is a secret as the service hands it out: everything but its value.
type Secret struct {
	ID, Name, Owner string
	// Version is 1 at create, one more at every update.
	Version   int64
	Metadata  map[string]string // never nil
	CreatedAt time.Time
	UpdatedAt time.Time
}

// Service keeps secrets. Its methods are safe for concurrent use. It
// implements Resolver.
type Service struct {
	opts   Options
	sealer *sealer
	log    *slog.Logger
}

var _ Resolver = (*Service)(nil)

// New returns the service, loading (or making, once) the key file. Secrets
// the database holds under another key are reported in the log: their
// values cannot be read until they are updated.
func New(ctx context.Context, opts Options) (*Service, error) {
	if opts.Store == nil {
		return nil, errors.New("secret: a store is required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	switch {
	case opts.MaxPerOwner == 0:
		opts.MaxPerOwner = DefaultMaxCount
	case opts.MaxPerOwner < 0:
		opts.MaxPerOwner = 0
	}
	if opts.MaxValueBytes <= 0 {
		opts.MaxValueBytes = DefaultMaxValueBytes
	}
	key := opts.Key
	if key == nil {
		if opts.KeyFile == "" {
			return nil, errors.New("secret: a key file is required")
		}
		var created bool
		var err error
		if key, created, err = LoadOrCreateKey(opts.KeyFile); err != nil {
			return nil, fmt.Errorf("secret: %w", err)
		}
		if created {
			opts.Logger.Info("secrets: made a new key; back it up with the database: the secrets stored in it cannot be read without it", "file", opts.KeyFile)
		}
	}
	sl, err := newSealer(key)
	if err != nil {
		return nil, fmt.Errorf("secret: %w", err)
	}
	s := &Service{opts: opts, sealer: sl, log: opts.Logger}
	n, err := opts.Store.CountSecretsNotUnder(ctx, sl.keyID)
	if err != nil {
		return nil, fmt.Errorf("secret: %w", err)
	}
	if n > 0 {
		s.log.Error("secrets: some stored secrets were sealed with another key than the key file's; their values cannot be read (rules using them fail) until they are updated, or the old key file is restored",
			"secrets", n, "file", opts.KeyFile, "key_id", sl.keyID)
	}
	return s, nil
}

// KeyID identifies the key values are sealed with (a digest, not the key).
func (s *Service) KeyID() string { return s.sealer.keyID }

// Limits reports the per-owner count and the value size the service allows.
func (s *Service) Limits() (maxPerOwner, maxValueBytes int) {
	return s.opts.MaxPerOwner, s.opts.MaxValueBytes
}

var nameRE = regexp.MustCompile(`^[a-zA-Z0-9_-]+$`)

// ValidName checks a new secret's name: E2B's ^[a-zA-Z0-9_-]+$, 1 to 128
// characters, not starting with sec_ (in any case), which IDs start with.
func ValidName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: name is required: the secret's name (letters, digits, '_' and '-')", ErrInvalid)
	case len(name) > MaxNameLength:
		return fmt.Errorf("%w: invalid secret name: longer than %d characters", ErrInvalid, MaxNameLength)
	case !nameRE.MatchString(name):
		return fmt.Errorf("%w: invalid secret name %q: use letters, digits, '_' and '-' only", ErrInvalid, name)
	case strings.HasPrefix(strings.ToLower(name), IDPrefix):
		return fmt.Errorf("%w: invalid secret name %q: the %s prefix is reserved for secret IDs", ErrInvalid, name, IDPrefix)
	}
	return nil
}

// CanonicalName is the form a name is stored and returned in.
func CanonicalName(name string) string { return strings.ToLower(name) }

// ValidMetadata checks metadata against the spec's bounds.
func ValidMetadata(md map[string]string) error {
	if len(md) > MaxMetadataEntries {
		return fmt.Errorf("%w: metadata has %d entries: at most %d are allowed", ErrInvalid, len(md), MaxMetadataEntries)
	}
	total := 0
	for k, v := range md {
		if len(k) > MaxMetadataKeyBytes {
			return fmt.Errorf("%w: metadata key %.32q... is %d bytes: keys may be at most %d bytes", ErrInvalid, k, len(k), MaxMetadataKeyBytes)
		}
		if len(v) > MaxMetadataValueBytes {
			return fmt.Errorf("%w: metadata value of %q is %d bytes: values may be at most %d bytes", ErrInvalid, k, len(v), MaxMetadataValueBytes)
		}
		total += len(k) + len(v)
	}
	if total > MaxMetadataBytes {
		return fmt.Errorf("%w: metadata is %d bytes in all: at most %d are allowed", ErrInvalid, total, MaxMetadataBytes)
	}
	return nil
}

// checkValue bounds a value's size; the message says how long it was, never
// what it held.
func (s *Service) checkValue(value string) error {
	if len(value) > s.opts.MaxValueBytes {
		return fmt.Errorf("%w: value is %d bytes: a secret's value may be at most %d bytes", ErrInvalid, len(value), s.opts.MaxValueBytes)
	}
	return nil
}

func newID() (string, error) {
	b := make([]byte, idBytes)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("secret: id: %w", err)
	}
	return IDPrefix + hex.EncodeToString(b), nil
}

// Create stores a new secret for owner, version 1.
func (s *Service) Create(ctx context.Context, owner, name, value string, metadata map[string]string) (Secret, error) {
	if err := ValidName(name); err != nil {
		return Secret{}, err
	}
	if err := s.checkValue(value); err != nil {
		return Secret{}, err
	}
	if err := ValidMetadata(metadata); err != nil {
		return Secret{}, err
	}
	id, err := newID()
	if err != nil {
		return Secret{}, err
	}
	sealed, err := s.sealer.seal(owner, id, []byte(value))
	if err != nil {
		return Secret{}, err
	}
	now := time.Now().UTC()
	if metadata == nil {
		metadata = map[string]string{}
	}
	rec := store.Secret{
		ID: id, Owner: owner, Name: CanonicalName(name), Version: 1, Metadata: metadata,
		Sealed: sealed, KeyID: s.sealer.keyID, CreatedAt: now, UpdatedAt: now,
	}
	if err := s.opts.Store.InsertSecret(ctx, rec, s.opts.MaxPerOwner); err != nil {
		switch {
		case errors.Is(err, store.ErrExists):
			return Secret{}, fmt.Errorf("%w: secret with name '%s' already exists", ErrExists, rec.Name)
		case errors.Is(err, store.ErrSecretLimit):
			return Secret{}, fmt.Errorf("%w: %s", ErrLimit, strings.TrimPrefix(err.Error(), store.ErrSecretLimit.Error()+": "))
		}
		return Secret{}, fmt.Errorf("secret: %w", err)
	}
	return toSecret(rec), nil
}

// Update stores value as owner's secret ref's new version (ref: its ID or
// name). metadata, when not nil (an empty map too), replaces the secret's
// metadata; nil keeps it.
func (s *Service) Update(ctx context.Context, owner, ref, value string, metadata map[string]string) (Secret, error) {
	if err := s.checkValue(value); err != nil {
		return Secret{}, err
	}
	if err := ValidMetadata(metadata); err != nil {
		return Secret{}, err
	}
	cur, err := s.find(ctx, owner, ref)
	if err != nil {
		return Secret{}, err
	}
	sealed, err := s.sealer.seal(owner, cur.ID, []byte(value))
	if err != nil {
		return Secret{}, err
	}
	rec, err := s.opts.Store.UpdateSecret(ctx, owner, cur.ID, store.SecretUpdate{
		Sealed: sealed, KeyID: s.sealer.keyID, Metadata: metadata, UpdatedAt: time.Now().UTC(),
	})
	if errors.Is(err, store.ErrNotFound) { // destroyed meanwhile
		return Secret{}, fmt.Errorf("%w: %q", ErrNotFound, ref)
	}
	if err != nil {
		return Secret{}, fmt.Errorf("secret: %w", err)
	}
	return toSecret(rec), nil
}

// Get returns owner's secret by ID or name (any case); another owner's is
// ErrNotFound, as if it did not exist.
func (s *Service) Get(ctx context.Context, owner, ref string) (Secret, error) {
	rec, err := s.find(ctx, owner, ref)
	if err != nil {
		return Secret{}, err
	}
	return toSecret(rec), nil
}

// List returns up to limit of owner's secrets in name order, starting after
// the canonical name after ("": from the first). limit <= 0 lists all.
func (s *Service) List(ctx context.Context, owner, after string, limit int) ([]Secret, error) {
	if owner == "" { // the store reads "" as every owner
		return []Secret{}, nil
	}
	recs, err := s.opts.Store.ListSecrets(ctx, owner, after, limit)
	if err != nil {
		return nil, fmt.Errorf("secret: %w", err)
	}
	out := make([]Secret, 0, len(recs))
	for _, r := range recs {
		out = append(out, toSecret(r))
	}
	return out, nil
}

// Destroy removes owner's secret by ID or name, its value with it.
func (s *Service) Destroy(ctx context.Context, owner, ref string) error {
	rec, err := s.find(ctx, owner, ref)
	if err != nil {
		return err
	}
	if err := s.opts.Store.DeleteSecret(ctx, owner, rec.ID); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("%w: %q", ErrNotFound, ref)
		}
		return fmt.Errorf("secret: %w", err)
	}
	return nil
}

// Value returns the current value of owner's secret name (or ID). It is the
// one way to a value: the egress proxy's.
func (s *Service) Value(ctx context.Context, owner, name string) (string, error) {
	rec, err := s.find(ctx, owner, name)
	if err != nil {
		return "", err
	}
	if rec.KeyID != s.sealer.keyID {
		return "", fmt.Errorf("%w: secret %q (%s) was sealed with another key (id %s) than the server's (id %s): update it to set its value again", ErrKey, rec.Name, rec.ID, rec.KeyID, s.sealer.keyID)
	}
	v, err := s.sealer.open(owner, rec.ID, rec.Sealed)
	if err != nil {
		return "", fmt.Errorf("secret %q: %w", rec.Name, err)
	}
	return string(v), nil
}

// Exists reports whether owner has a secret called name (or with that ID).
func (s *Service) Exists(ctx context.Context, owner, name string) (bool, error) {
	_, err := s.find(ctx, owner, name)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, ErrNotFound):
		return false, nil
	}
	return false, err
}

// find looks ref up as an ID when it starts with sec_ and as a name
// otherwise, both in any case (IDs are lower-case hex).
func (s *Service) find(ctx context.Context, owner, ref string) (store.Secret, error) {
	canon := strings.ToLower(ref)
	byName := !strings.HasPrefix(canon, IDPrefix)
	if owner == "" || canon == "" || len(canon) > MaxNameLength+len(IDPrefix) || !nameRE.MatchString(canon) {
		return store.Secret{}, fmt.Errorf("%w: %q", ErrNotFound, ref)
	}
	rec, err := s.opts.Store.GetSecret(ctx, owner, canon, byName)
	if errors.Is(err, store.ErrNotFound) {
		return store.Secret{}, fmt.Errorf("%w: %q", ErrNotFound, ref)
	}
	if err != nil {
		return store.Secret{}, fmt.Errorf("secret: %w", err)
	}
	return rec, nil
}

func toSecret(r store.Secret) Secret {
	md := r.Metadata
	if md == nil {
		md = map[string]string{}
	}
	return Secret{
		ID: r.ID, Name: r.Name, Owner: r.Owner, Version: r.Version, Metadata: md,
		CreatedAt: r.CreatedAt.UTC(), UpdatedAt: r.UpdatedAt.UTC(),
	}
}
