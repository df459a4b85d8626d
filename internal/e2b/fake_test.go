package e2b

// The handler tests run against this in-memory Manager. It exists to test
// request parsing, validation and error mapping in isolation; the real
// manager together with the unmodified official SDKs is exercised by the SDK
// conformance test in tests/sdk.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/timing"
)

// Sandbox ids with special behaviour in fakeManager.
const (
	idBoom     = "boom"     // every call fails with a plain (unmapped) error
	idPanic    = "panicky"  // every call panics
	idInvalid  = "invalid"  // every call fails with sandbox.ErrInvalid
	idConflict = "conflict" // every call fails with sandbox.ErrConflict
	idBuilding = "building" // every call fails as a template still being built does
)

// fakeEpoch is when the first fake sandbox started; later ones start one
// second apart so list order is predictable.
var fakeEpoch = time.Date(2025, 1, 2, 3, 4, 5, 600000000, time.UTC)

type fakeManager struct {
	mu        sync.Mutex
	sandboxes map[string]*sandbox.Info
	templates map[string]string // alias or id -> template id
	metrics   map[string][]sandbox.Metric
	logs      map[string][]sandbox.LogEntry
	seq       int
	listErr   error
	// snapshots, oldest first; ListSnapshots answers newest first.
	snapshots []sandbox.Snapshot
	// snapErr fails ListSnapshots and DeleteSnapshot (which take no
	// sandbox id, so the special ids cannot reach them).
	snapErr error
	// forkErrs fails the forks at these indexes with the given errors.
	forkErrs map[int]error
	// plain turns off the special ids, so a fuzzer that stumbles on "boom"
	// does not report the fake's deliberate 500 as a handler bug.
	plain bool

	// What the handler last asked for.
	lastCreate        sandbox.CreateRequest
	lastList          sandbox.ListFilter
	lastTimeout       *time.Duration
	lastConnect       time.Duration
	lastMetricsWindow [2]time.Time
	lastLogQuery      sandbox.LogQuery
	lastPause         *sandbox.PauseOptions
	lastFork          *sandbox.ForkRequest
	lastSnapshot      *sandbox.SnapshotRequest
	lastSnapFilter    *sandbox.SnapshotFilter
	lastDeleteSnap    string
	calls             int
}

func newFakeManager() *fakeManager {
	return &fakeManager{
		sandboxes: map[string]*sandbox.Info{},
		templates: map[string]string{
			"base":                 "rki5dems9wqfm4r03t7g",
			"rki5dems9wqfm4r03t7g": "rki5dems9wqfm4r03t7g",
			"code-interpreter-v1":  "nlhz8vlwyupq845jsdg9",
			"nlhz8vlwyupq845jsdg9": "nlhz8vlwyupq845jsdg9",
		},
		metrics: map[string][]sandbox.Metric{},
	}
}

func aliasOf(templateID string) string {
	switch templateID {
	case "rki5dems9wqfm4r03t7g":
		return "base"
	case "nlhz8vlwyupq845jsdg9":
		return "code-interpreter-v1"
	}
	return ""
}

// add inserts a sandbox directly, for tests that need a given state or time.
func (f *fakeManager) add(info sandbox.Info) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if info.TemplateID == "" {
		info.TemplateID = "rki5dems9wqfm4r03t7g"
		info.Alias = "base"
	}
	if info.State == "" {
		info.State = sandbox.StateRunning
	}
	if info.Owner == "" {
		info.Owner = OwnerOf(testKey)
	}
	if info.EndAt.IsZero() {
		info.EndAt = time.Now().Add(time.Hour)
	}
	f.sandboxes[info.ID] = &info
}

func (f *fakeManager) special(id string) error {
	if f.plain {
		return nil
	}
	switch id {
	case idBoom:
		return errors.New("disk on fire")
	case idPanic:
		panic("fake manager panicked on purpose")
	case idInvalid:
		return fmt.Errorf("sandbox %s cannot do that: %w", id, sandbox.ErrInvalid)
	case idConflict:
		return fmt.Errorf("sandbox %s is busy: %w", id, sandbox.ErrConflict)
	case idBuilding:
		return fmt.Errorf("create: %w", &buildingErr{})
	}
	return nil
}

func (f *fakeManager) lookup(id string) (*sandbox.Info, error) {
	if err := f.special(id); err != nil {
		return nil, err
	}
	s, ok := f.sandboxes[id]
	if !ok {
		return nil, fmt.Errorf("sandbox %s: %w", id, sandbox.ErrNotFound)
	}
	return s, nil
}

func (f *fakeManager) Create(ctx context.Context, req sandbox.CreateRequest) (sandbox.Info, error) {
	// A step of its own, as the real manager's are, for the Server-Timing test.
	timing.Start(ctx, "fake_step")()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	f.lastCreate = req
	if err := f.special(req.Template); err != nil {
		return sandbox.Info{}, err
	}
	tid, ok := f.templates[req.Template]
	if !ok || req.SnapshotOnly { // the fake starts nothing from snapshots
		return sandbox.Info{}, fmt.Errorf("template %q: %w", req.Template, sandbox.ErrTemplateNotFound)
	}
	info := f.newSandbox(tid, req.Timeout)
	info.Owner = req.Owner
	info.Metadata = maps.Clone(req.Metadata)
	info.EnvVars = maps.Clone(req.EnvVars)
	info.AllowInternetAccess = req.AllowInternetAccess
	info.Lifecycle = req.Lifecycle
	if req.Network != nil {
		info.Network = *req.Network
		if ap := req.Network.AllowPublicTraffic; ap != nil && !*ap {
			info.TrafficAccessToken = "traffic-" + info.ID
		}
	}
	if req.Secure {
		info.AccessToken = "token-" + info.ID
	}
	f.sandboxes[info.ID] = &info
	return info, nil
}

// newSandbox makes the next running sandbox of template tid (not yet
// stored). The caller holds f.mu.
func (f *fakeManager) newSandbox(tid string, timeout time.Duration) sandbox.Info {
	f.seq++
	return sandbox.Info{
		ID:          fmt.Sprintf("sbx%04d", f.seq),
		TemplateID:  tid,
		Alias:       aliasOf(tid),
		ClientID:    "fakeclient",
		StartedAt:   fakeEpoch.Add(time.Duration(f.seq) * time.Second),
		EndAt:       time.Now().Add(timeout),
		State:       sandbox.StateRunning,
		CPUCount:    2,
		MemoryMB:    512,
		DiskSizeMB:  1024,
		EnvdVersion: "0.6.4",
	}
}

func (f *fakeManager) UpdateNetwork(_ context.Context, id string, u sandbox.NetworkUpdate) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	s, err := f.lookup(id)
	if err != nil {
		return err
	}
	s.Network.AllowOut, s.Network.DenyOut = u.AllowOut, u.DenyOut
	if u.AllowInternetAccess != nil {
		s.AllowInternetAccess = u.AllowInternetAccess
	}
	return nil
}

func (f *fakeManager) Get(_ context.Context, id string) (sandbox.Info, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	s, err := f.lookup(id)
	if err != nil {
		return sandbox.Info{}, err
	}
	return *s, nil
}

func (f *fakeManager) List(_ context.Context, filter sandbox.ListFilter) ([]sandbox.Info, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	f.lastList = filter
	if f.listErr != nil {
		return nil, f.listErr
	}
	var tid string
	if filter.Template != "" {
		var ok bool
		if tid, ok = f.templates[filter.Template]; !ok {
			return nil, fmt.Errorf("template %q: %w", filter.Template, sandbox.ErrTemplateNotFound)
		}
	}
	var out []sandbox.Info
	for _, s := range f.sandboxes {
		if len(filter.States) > 0 && !contains(filter.States, s.State) {
			continue
		}
		if tid != "" && s.TemplateID != tid {
			continue
		}
		if !filter.StartedAfter.IsZero() && s.StartedAt.Before(filter.StartedAfter) {
			continue
		}
		match := true
		for k, v := range filter.Metadata {
			if got, ok := s.Metadata[k]; !ok || got != v {
				match = false
			}
		}
		if match {
			out = append(out, *s)
		}
	}
	return out, nil
}

func (f *fakeManager) ListKeys(ctx context.Context, filter sandbox.ListFilter) ([]sandbox.ListKey, error) {
	infos, err := f.List(ctx, filter)
	keys := make([]sandbox.ListKey, len(infos))
	for i, info := range infos {
		keys[i] = sandbox.ListKey{ID: info.ID, StartedAt: info.StartedAt, State: info.State}
	}
	return keys, err
}

func contains(states []sandbox.State, s sandbox.State) bool {
	for _, st := range states {
		if st == s {
			return true
		}
	}
	return false
}

func (f *fakeManager) Kill(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if _, err := f.lookup(id); err != nil {
		return err
	}
	delete(f.sandboxes, id)
	return nil
}

func (f *fakeManager) SetTimeout(_ context.Context, id string, d time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	s, err := f.lookup(id)
	if err != nil {
		return err
	}
	f.lastTimeout = &d
	s.EndAt = time.Now().Add(d)
	return nil
}

func (f *fakeManager) Connect(_ context.Context, id string, timeout time.Duration) (sandbox.Info, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	s, err := f.lookup(id)
	if err != nil {
		return sandbox.Info{}, false, err
	}
	f.lastConnect = timeout
	resumed := s.State == sandbox.StatePaused
	s.State = sandbox.StateRunning
	if end := time.Now().Add(timeout); end.After(s.EndAt) {
		s.EndAt = end
	}
	return *s, resumed, nil
}

func (f *fakeManager) Pause(_ context.Context, id string, opts sandbox.PauseOptions) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	s, err := f.lookup(id)
	if err != nil {
		return err
	}
	f.lastPause = &opts
	if s.State == sandbox.StatePaused {
		return fmt.Errorf("sandbox %s is already paused: %w", id, sandbox.ErrConflict)
	}
	s.State = sandbox.StatePaused
	s.PausedWithMemory = !opts.DropMemory
	return nil
}

// running looks id up and refuses a paused sandbox, as the manager does for
// fork and snapshot.
func (f *fakeManager) running(id, op string) (*sandbox.Info, error) {
	s, err := f.lookup(id)
	if err != nil {
		return nil, err
	}
	if s.State == sandbox.StatePaused {
		return nil, fmt.Errorf("sandbox %s is paused; resume it before %s: %w", id, op, sandbox.ErrConflict)
	}
	return s, nil
}

func (f *fakeManager) Fork(_ context.Context, id string, req sandbox.ForkRequest) ([]sandbox.ForkResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	f.lastFork = &req
	src, err := f.running(id, "forking it")
	if err != nil {
		return nil, err
	}
	out := make([]sandbox.ForkResult, req.Count)
	for i := range out {
		if err := f.forkErrs[i]; err != nil {
			out[i].Err = err
			continue
		}
		info := f.newSandbox(src.TemplateID, req.Timeout)
		info.Metadata = maps.Clone(src.Metadata)
		info.AccessToken = "token-" + info.ID
		f.sandboxes[info.ID] = &info
		out[i].Info = info
	}
	return out, nil
}

func (f *fakeManager) CreateSnapshot(_ context.Context, id string, req sandbox.SnapshotRequest) (sandbox.Snapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	f.lastSnapshot = &req
	src, err := f.running(id, "snapshotting it")
	if err != nil {
		return sandbox.Snapshot{}, err
	}
	f.seq++
	snap := sandbox.Snapshot{
		ID: fmt.Sprintf("snap%04d:default", f.seq), SandboxID: id, TemplateID: src.TemplateID,
		Owner: req.Owner, CreatedAt: fakeEpoch.Add(time.Duration(f.seq) * time.Second),
	}
	if req.Name != "" {
		// A name moves to the newest snapshot, as E2B assigns it to the
		// newest build.
		snap.ID = req.Name + ":default"
		snap.Names = []string{snap.ID}
		f.snapshots = slices.DeleteFunc(f.snapshots, func(s sandbox.Snapshot) bool { return s.Owner == snap.Owner && s.ID == snap.ID })
	}
	f.snapshots = append(f.snapshots, snap)
	return snap, nil
}

// snapshotMatches is SnapshotFilter.Name's rule: the ID or a name, with or
// without its ":tag".
func snapshotMatches(s sandbox.Snapshot, ref string) bool {
	for _, n := range append([]string{s.ID}, s.Names...) {
		if n == ref || strings.TrimSuffix(n, ":default") == ref {
			return true
		}
	}
	return false
}

func (f *fakeManager) ListSnapshots(_ context.Context, filter sandbox.SnapshotFilter) ([]sandbox.Snapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	f.lastSnapFilter = &filter
	if f.snapErr != nil {
		return nil, f.snapErr
	}
	var out []sandbox.Snapshot
	for i := len(f.snapshots) - 1; i >= 0; i-- {
		s := f.snapshots[i]
		if (filter.SandboxID == "" || s.SandboxID == filter.SandboxID) &&
			(filter.Name == "" || snapshotMatches(s, filter.Name)) &&
			(filter.Owner == "" || s.Owner == filter.Owner) {
			out = append(out, s)
		}
	}
	return out, nil
}

func (f *fakeManager) DeleteSnapshot(_ context.Context, idOrName, owner string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	f.lastDeleteSnap = idOrName
	if f.snapErr != nil {
		return f.snapErr
	}
	i := slices.IndexFunc(f.snapshots, func(s sandbox.Snapshot) bool { return s.Owner == owner && snapshotMatches(s, idOrName) })
	if i < 0 {
		return fmt.Errorf("snapshot %q: %w", idOrName, sandbox.ErrNotFound)
	}
	f.snapshots = slices.Delete(f.snapshots, i, i+1)
	return nil
}

func (f *fakeManager) Metrics(_ context.Context, id string, start, end time.Time) ([]sandbox.Metric, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if _, err := f.lookup(id); err != nil {
		return nil, err
	}
	f.lastMetricsWindow = [2]time.Time{start, end}
	var out []sandbox.Metric
	for _, m := range f.metrics[id] {
		if !m.Time.Before(start) && !m.Time.After(end) {
			out = append(out, m)
		}
	}
	return out, nil
}

func (f *fakeManager) Logs(_ context.Context, id string, q sandbox.LogQuery) ([]sandbox.LogEntry, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	f.lastLogQuery = q
	if _, err := f.lookup(id); err != nil {
		return nil, err
	}
	return sandbox.PageLogs(f.logs[id], q), nil
}

var _ Manager = (*fakeManager)(nil)

// buildingErr stands for template.BuildingError (the e2b package knows only the
// RetryAfter method; the real one is tested end to end by tests/firstrun).
type buildingErr struct{}

func (*buildingErr) Error() string {
	return "template python3 is still being built: step 1/1: RUN apt-get install (for 0:42)"
}
func (*buildingErr) RetryAfter() time.Duration { return 4500 * time.Millisecond }
