// Package volume is the volume service: storage that outlives sandboxes, is
// shared between them, and is reachable without one (E2B's volumes). It
// creates, lists, finds and destroys volumes per owner (the digest of an API
// key, as sandboxes and templates are owned), keeps names unique per owner,
// gives each volume a token for its content API, and enforces the server's
// size default and maximum and the per-owner limits.
//
// Storage: each volume is a btrfs subvolume in the volume store of the
// sandboxes' disk pool (diskquota.VolumesDir), with a qgroup limit of its
// size: a write past it fails with EDQUOT ("Disk quota exceeded") inside a
// sandbox exactly as a sandbox's own disk does, and the content API answers
// 507. Files are stored with the ids a sandbox sees (uid 1000 is the
// template's "user"), unshifted: a mount into a sandbox maps them (idmapped
// bind mount onto the sandbox's user namespace).
//
// Crash safety: a record is written (state creating) before the directory is
// made and marked ready after; a destroy marks it deleting, removes the
// directory, then the record. Recover, at start, finishes or undoes what a
// crash interrupted, so each create or destroy leaves the old state or the
// new one.
package volume

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/airlock-sandbox/airlock/internal/crashpoint"
	"github.com/airlock-sandbox/airlock/internal/diskquota"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// Defaults for Options fields left zero.
const (
	DefaultSize     = 1 << 30  // a volume's quota when its create names none
	DefaultMaxSize  = 16 << 30 // the largest quota a create may ask for
	DefaultMaxCount = 100      // volumes per owner
	DefaultMaxBytes = 64 << 30 // total quota of one owner's volumes
	MaxNameLength   = 128
	minSize         = 1 << 20
	tokenBytes      = 32
	ownerUID        = 1000 // the templates' default user ("user"), who must be able to write
	ownerGID        = 1000
	volumeRootMode  = 0o755
)

// Errors the service returns (wrapped, with the details in the message); the
// API maps them to statuses.
var (
	ErrNotFound = errors.New("volume not found")
	ErrInvalid  = errors.New("invalid volume request")
	ErrExists   = errors.New("volume name already exists")
	ErrLimit    = errors.New("volume limit reached")
	// ErrNoSpace is a create past the owner's total size (507).
	ErrNoSpace = errors.New("volume space used up")
	ErrInUse   = errors.New("volume is mounted by sandboxes")
	ErrToken   = errors.New("volume token does not open this volume")
	ErrClosed  = errors.New("volume service is shutting down")
)

// InUseError is the refusal to destroy a volume that running sandboxes
// mount; errors.Is(err, ErrInUse) holds.
type InUseError struct {
	VolumeID  string
	Sandboxes []string
}

func (e *InUseError) Error() string {
	return fmt.Sprintf("volume %s is mounted by sandbox(es) %s: kill them first, or destroy with ?force=true", e.VolumeID, strings.Join(e.Sandboxes, ", "))
}

func (e *InUseError) Is(target error) bool { return target == ErrInUse }

// MountChecker tells which sandboxes mount a volume. The sandbox manager
// implements it; a destroy is refused while the list is not empty.
type MountChecker interface {
	SandboxesMounting(volumeID string) []string
}

// Store is what the service keeps its records in (store.SQLite).
type Store interface {
	InsertVolume(ctx context.Context, v store.Volume, lim store.VolumeLimits) error
	SetVolumeState(ctx context.Context, id, state string) error
	GetVolume(ctx context.Context, id string) (store.Volume, error)
	ListVolumes(ctx context.Context, owner string) ([]store.Volume, error)
	DeleteVolume(ctx context.Context, id string) error
}

// Options configures the service.
type Options struct {
	Pool  *diskquota.Pool // required: volumes live in its volume store
	Store Store           // required
	// DefaultSize is a new volume's quota in bytes when the create names
	// none; MaxSize the largest one a create may ask for.
	DefaultSize, MaxSize int64
	// PerOwner bounds each owner's number of volumes and their total quota.
	// Zero fields get DefaultMaxCount and DefaultMaxBytes; negative ones
	// limit nothing.
	PerOwner store.VolumeLimits
	// SpaceFor, when set, gives an owner's (team's) total size in bytes
	// instead of PerOwner.MaxBytes (0: PerOwner's).
	SpaceFor func(owner string) int64
	// Mounts, when set, is asked before a destroy (SetMountChecker sets it
	// later, once the manager exists).
	Mounts MountChecker
	Logger *slog.Logger
}

// Volume is a volume as the service hands it out.
type Volume struct {
	ID, Name, Owner string
	Token           string
	SizeBytes       int64
	CreatedAt       time.Time
	// Path is the volume's directory on the host (the root of what a
	// sandbox mounts and of what the content API serves).
	Path string
}

// Service manages volumes. Its methods are safe for concurrent use.
type Service struct {
	opts Options
	log  *slog.Logger

	mu     sync.Mutex
	mounts MountChecker
	// leases counts Acquire calls not yet released, per volume ID: a mount
	// on its way, which the MountChecker may not show yet.
	leases map[string]int
	// destroying holds the volumes a destroy is removing: Acquire and the
	// content API refuse them.
	destroying map[string]bool
	// ops are the creates and destroys under way; Close waits for them, so
	// the store is not closed under one.
	ops    sync.WaitGroup
	closed bool
}

// New returns the service; call Recover before serving.
func New(opts Options) (*Service, error) {
	if opts.Pool == nil || opts.Store == nil {
		return nil, errors.New("volume: a disk pool and a store are required")
	}
	if opts.DefaultSize <= 0 {
		opts.DefaultSize = DefaultSize
	}
	if opts.MaxSize <= 0 {
		opts.MaxSize = DefaultMaxSize
	}
	if opts.DefaultSize > opts.MaxSize {
		return nil, fmt.Errorf("volume: the default size (%d MiB) is above the maximum (%d MiB)", opts.DefaultSize>>20, opts.MaxSize>>20)
	}
	if opts.DefaultSize < minSize {
		return nil, fmt.Errorf("volume: the default size must be at least 1 MiB")
	}
	switch {
	case opts.PerOwner.MaxCount == 0:
		opts.PerOwner.MaxCount = DefaultMaxCount
	case opts.PerOwner.MaxCount < 0:
		opts.PerOwner.MaxCount = 0
	}
	switch {
	case opts.PerOwner.MaxBytes == 0:
		opts.PerOwner.MaxBytes = DefaultMaxBytes
	case opts.PerOwner.MaxBytes < 0:
		opts.PerOwner.MaxBytes = 0
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Service{
		opts: opts, log: opts.Logger, mounts: opts.Mounts,
		leases: map[string]int{}, destroying: map[string]bool{},
	}, nil
}

// SetMountChecker sets what a destroy asks about mounts. The manager needs
// the service (to mount volumes) and the service the manager (to know the
// mounts), so one of the two is set after both exist.
func (s *Service) SetMountChecker(mc MountChecker) {
	s.mu.Lock()
	s.mounts = mc
	s.mu.Unlock()
}

// begin registers a create or destroy; ErrClosed once Close has begun.
func (s *Service) begin() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	s.ops.Add(1)
	return nil
}

// Close refuses new creates and destroys and waits for those under way,
// which run to their end even when their request was cancelled.
func (s *Service) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.ops.Wait()
	return nil
}

// Limits reports the sizes the service allows, for messages and docs.
func (s *Service) Limits() (defaultSize, maxSize int64, perOwner store.VolumeLimits) {
	return s.opts.DefaultSize, s.opts.MaxSize, s.opts.PerOwner
}

var nameRE = regexp.MustCompile(`^[a-zA-Z0-9_-]+$`)

// ValidName checks a volume name as E2B does (^[a-zA-Z0-9_-]+$), with a
// length cap of Airlock's own.
func ValidName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("%w: Invalid volume name %q: use letters, digits, '_' and '-' only", ErrInvalid, name)
	}
	if len(name) > MaxNameLength {
		return fmt.Errorf("%w: Invalid volume name: longer than %d characters", ErrInvalid, MaxNameLength)
	}
	return nil
}

// Create makes a volume for owner with a quota of size bytes (0: the
// default).
func (s *Service) Create(ctx context.Context, owner, name string, size int64) (Volume, error) {
	if err := ValidName(name); err != nil {
		return Volume{}, err
	}
	if err := s.begin(); err != nil {
		return Volume{}, err
	}
	defer s.ops.Done()
	switch {
	case size == 0:
		size = s.opts.DefaultSize
	case size < minSize:
		return Volume{}, fmt.Errorf("%w: a volume's size must be at least 1 MiB", ErrInvalid)
	case size > s.opts.MaxSize:
		return Volume{}, fmt.Errorf("%w: size %d MiB is above this server's maximum of %d MiB per volume", ErrInvalid, size>>20, s.opts.MaxSize>>20)
	}
	token, err := newToken()
	if err != nil {
		return Volume{}, err
	}
	rec := store.Volume{
		ID: uuid.NewString(), Owner: owner, Name: name, Token: token, SizeBytes: size,
		CreatedAt: time.Now().UTC(), State: store.VolumeCreating,
	}
	// The record first: it claims the name and counts against the limits in
	// one transaction, and a crash after it leaves a "creating" record that
	// Recover undoes, never a directory nothing names.
	limits := s.opts.PerOwner
	if s.opts.SpaceFor != nil {
		if b := s.opts.SpaceFor(owner); b > 0 {
			limits.MaxBytes = b
		}
	}
	if err := s.opts.Store.InsertVolume(ctx, rec, limits); err != nil {
		switch {
		case errors.Is(err, store.ErrExists):
			// Upstream's wording and status (400).
			return Volume{}, fmt.Errorf("%w: Volume with name '%s' already exists", ErrExists, name)
		case errors.Is(err, store.ErrVolumeLimit):
			return Volume{}, fmt.Errorf("%w: %s", ErrLimit, strings.TrimPrefix(err.Error(), store.ErrVolumeLimit.Error()+": "))
		case errors.Is(err, store.ErrVolumeSpace):
			return Volume{}, fmt.Errorf("%w: %s", ErrNoSpace, strings.TrimPrefix(err.Error(), store.ErrVolumeSpace.Error()+": "))
		}
		return Volume{}, fmt.Errorf("volume: %w", err)
	}
	crashpoint.Hit(crashpoint.VolumeRecorded)
	// Not the request's context from here: a client that goes away must
	// not leave a half-made volume behind until the next start.
	bg := context.WithoutCancel(ctx)
	undo := func(cause error) (Volume, error) {
		if err := s.opts.Pool.RemoveVolume(rec.ID); err != nil {
			s.log.Warn("volume: removing a volume whose create failed", "volume", rec.ID, "err", err)
		}
		if err := s.opts.Store.DeleteVolume(bg, rec.ID); err != nil {
			s.log.Warn("volume: deleting the record of a volume whose create failed", "volume", rec.ID, "err", err)
		}
		return Volume{}, cause
	}
	if err := s.opts.Pool.CreateVolume(rec.ID, size); err != nil {
		return undo(fmt.Errorf("volume: %w", err))
	}
	dir := s.opts.Pool.VolumeDir(rec.ID)
	// The default user of a sandbox must be able to write to a fresh volume.
	if err := os.Chown(dir, ownerUID, ownerGID); err != nil {
		return undo(fmt.Errorf("volume: %w", err))
	}
	if err := os.Chmod(dir, volumeRootMode); err != nil {
		return undo(fmt.Errorf("volume: %w", err))
	}
	crashpoint.Hit(crashpoint.VolumeMade)
	rec.State = store.VolumeReady
	if err := s.opts.Store.SetVolumeState(bg, rec.ID, store.VolumeReady); err != nil {
		return undo(fmt.Errorf("volume: %w", err))
	}
	return s.toVolume(rec), nil
}

func newToken() (string, error) {
	b := make([]byte, tokenBytes)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("volume: token: %w", err)
	}
	return "vol_" + hex.EncodeToString(b), nil
}

func (s *Service) toVolume(r store.Volume) Volume {
	return Volume{
		ID: r.ID, Name: r.Name, Owner: r.Owner, Token: r.Token, SizeBytes: r.SizeBytes,
		CreatedAt: r.CreatedAt, Path: s.opts.Pool.VolumeDir(r.ID),
	}
}

// List returns owner's volumes, oldest first (those being made or destroyed
// are left out).
func (s *Service) List(ctx context.Context, owner string) ([]Volume, error) {
	recs, err := s.opts.Store.ListVolumes(ctx, owner)
	if err != nil {
		return nil, fmt.Errorf("volume: %w", err)
	}
	out := []Volume{}
	for _, r := range recs {
		if r.State == store.VolumeReady {
			out = append(out, s.toVolume(r))
		}
	}
	return out, nil
}

// Get returns owner's volume by ID; another owner's is ErrNotFound, as if
// it did not exist.
func (s *Service) Get(ctx context.Context, owner, id string) (Volume, error) {
	r, err := s.opts.Store.GetVolume(ctx, id)
	if errors.Is(err, store.ErrNotFound) || err == nil && (r.Owner != owner || r.State != store.VolumeReady) {
		return Volume{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return Volume{}, fmt.Errorf("volume: %w", err)
	}
	return s.toVolume(r), nil
}

// Acquire finds owner's volume by name or ID for a sandbox about to mount
// it, and holds a lease on it: until release is called, a destroy without
// force is refused even though no MountChecker shows the mount yet. The
// caller releases once the sandbox is registered as mounting it (or failed).
func (s *Service) Acquire(ctx context.Context, owner, ref string) (v Volume, release func(), err error) {
	// By name first: that is what the SDKs' volumeMounts send.
	v, err = s.byName(ctx, owner, ref)
	if errors.Is(err, ErrNotFound) {
		v, err = s.Get(ctx, owner, ref)
	}
	if err != nil {
		return Volume{}, nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.destroying[v.ID] {
		return Volume{}, nil, fmt.Errorf("%w: %s is being destroyed", ErrNotFound, ref)
	}
	s.leases[v.ID]++
	var once sync.Once
	return v, func() {
		once.Do(func() {
			s.mu.Lock()
			if s.leases[v.ID]--; s.leases[v.ID] <= 0 {
				delete(s.leases, v.ID)
			}
			s.mu.Unlock()
		})
	}, nil
}

func (s *Service) byName(ctx context.Context, owner, name string) (Volume, error) {
	recs, err := s.opts.Store.ListVolumes(ctx, owner)
	if err != nil {
		return Volume{}, fmt.Errorf("volume: %w", err)
	}
	for _, r := range recs {
		if r.Name == name && r.State == store.VolumeReady {
			return s.toVolume(r), nil
		}
	}
	return Volume{}, fmt.Errorf("%w: no volume with ID or name %q", ErrNotFound, name)
}

// Open checks a content API request: accept says whether the request's
// credential opens volume id, given the volume's own token and its owner.
// An unknown volume answers ErrToken, as a wrong token does, after accept
// ran on a token no credential matches: so neither the answer nor its time
// tells which volume IDs exist.
func (s *Service) Open(ctx context.Context, id string, accept func(token, owner string) error) (Volume, error) {
	r, err := s.opts.Store.GetVolume(ctx, id)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return Volume{}, fmt.Errorf("volume: %w", err)
	}
	if err != nil || r.State != store.VolumeReady || r.Token == "" {
		_ = accept(unknownToken, "")
		return Volume{}, fmt.Errorf("%w %s", ErrToken, id)
	}
	if err := accept(r.Token, r.Owner); err != nil {
		return Volume{}, fmt.Errorf("volume %s: %w", id, err)
	}
	s.mu.Lock()
	gone := s.destroying[id]
	s.mu.Unlock()
	if gone {
		return Volume{}, fmt.Errorf("%w %s", ErrToken, id)
	}
	return s.toVolume(r), nil
}

// unknownToken is what Open's accept is given for a volume that is not
// there: a token no client can hold (tokens are hex).
const unknownToken = "\x00no volume"

// TokenIs is the accept of Open for a client that presents a volume's own
// token: ErrToken unless presented is token.
func TokenIs(presented string) func(token, owner string) error {
	return func(token, _ string) error {
		if subtle.ConstantTimeCompare([]byte(presented), []byte(token)) != 1 {
			return ErrToken
		}
		return nil
	}
}

// Destroy removes owner's volume and everything in it. While sandboxes
// mount it (or a mount is on its way, Acquire) it is refused with an
// *InUseError naming them, unless force: then it is removed anyway, and
// those sandboxes keep a mount of a deleted directory.
func (s *Service) Destroy(ctx context.Context, owner, id string, force bool) error {
	v, err := s.Get(ctx, owner, id)
	if err != nil {
		return err
	}
	if err := s.begin(); err != nil {
		return err
	}
	defer s.ops.Done()
	s.mu.Lock()
	if s.destroying[v.ID] {
		s.mu.Unlock()
		return fmt.Errorf("%w: %s is being destroyed", ErrNotFound, id)
	}
	var users []string
	if s.mounts != nil {
		users = slices.Clone(s.mounts.SandboxesMounting(v.ID))
	}
	if n := s.leases[v.ID]; n > 0 && len(users) == 0 {
		users = append(users, fmt.Sprintf("(%d being created)", n))
	}
	if len(users) > 0 && !force {
		s.mu.Unlock()
		slices.Sort(users)
		return &InUseError{VolumeID: v.ID, Sandboxes: users}
	}
	s.destroying[v.ID] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.destroying, v.ID)
		s.mu.Unlock()
	}()
	if len(users) > 0 {
		s.log.Warn("volume: destroying a volume sandboxes mount (force)", "volume", v.ID, "sandboxes", users)
	}
	// Marked first, so a crash from here on ends in removal (Recover), never
	// in a record whose directory is half deleted.
	bg := context.WithoutCancel(ctx)
	if err := s.opts.Store.SetVolumeState(bg, v.ID, store.VolumeDeleting); err != nil {
		return fmt.Errorf("volume: %w", err)
	}
	crashpoint.Hit(crashpoint.VolumeDeleting)
	if err := s.opts.Pool.RemoveVolume(v.ID); err != nil {
		return fmt.Errorf("volume: remove %s: %w", v.ID, err)
	}
	crashpoint.Hit(crashpoint.VolumeRemoved)
	if err := s.opts.Store.DeleteVolume(bg, v.ID); err != nil {
		return fmt.Errorf("volume: %w", err)
	}
	return nil
}

// Recover finishes or undoes what a crash interrupted: a volume still being
// made or being destroyed is removed with its record, and a directory in the
// volume store that no record names (nothing could ever reach it) is
// removed. A ready record whose directory is missing is logged and kept.
func (s *Service) Recover(ctx context.Context) error {
	recs, err := s.opts.Store.ListVolumes(ctx, "")
	if err != nil {
		return fmt.Errorf("volume: recover: %w", err)
	}
	known := map[string]bool{}
	var errs []error
	for _, r := range recs {
		switch r.State {
		case store.VolumeReady:
			known[r.ID] = true
			if !diskquota.IsSubvolume(s.opts.Pool.VolumeDir(r.ID)) {
				s.log.Error("volume: the directory of a volume is missing; its content API answers 404 for every path", "volume", r.ID, "name", r.Name)
			}
		default: // creating or deleting: removal finishes either
			s.log.Info("volume: removing a volume a crash left "+r.State, "volume", r.ID, "name", r.Name)
			if err := s.opts.Pool.RemoveVolume(r.ID); err != nil {
				errs = append(errs, err)
				continue
			}
			if err := s.opts.Store.DeleteVolume(ctx, r.ID); err != nil {
				errs = append(errs, err)
			}
		}
	}
	dirs, err := s.opts.Pool.Volumes()
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, id := range dirs {
		if known[id] {
			continue
		}
		s.log.Warn("volume: removing a volume directory no record names", "dir", s.opts.Pool.VolumeDir(id))
		if err := s.opts.Pool.RemoveVolume(id); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("volume: recover: %w", err)
	}
	return nil
}
