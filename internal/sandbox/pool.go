package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"time"

	"github.com/airlock-sandbox/airlock/internal/envdapi"
	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/timing"
)

// The warm pool keeps a few sandboxes per template started ahead of demand, so
// that a create only has to hand one its identity instead of paying for
// namespaces, cgroups, the overlay and envd's start (tens of milliseconds of CPU,
// which queue up when many creates arrive at once on a small machine).
//
// A pooled sandbox runs envd with Config.AwaitInit: it answers /health and
// nothing else until the host's one POST /init (over the unix socket, which no
// client can reach) gives it the access token and env vars. It is not in the
// live map, not in the store and not routable; after a restart it is an orphan
// that Recover destroys. Its StartedAt is the claim time.
//
// A pooled sandbox also goes through the start phase when it is made (the
// template's start command runs and its ready command succeeded), so a claim
// hands out a sandbox that is already ready. Its start command therefore sees
// the template's env but not the claimer's envVars, as on E2B, where the
// start command runs at build time and the sandbox is snapshotted. envd lets
// the host use its process API over the unix socket before /init for this.

// SetWarmPool asks for n sandboxes of tpl to be kept ready (0 turns it off).
func (m *Manager) SetWarmPool(tpl Template, n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if n <= 0 {
		delete(m.poolTarget, tpl.ID)
	} else {
		m.poolTarget[tpl.ID] = poolWant{tpl: tpl, n: n}
	}
	if list := m.pool[tpl.ID]; len(list) > max(n, 0) {
		excess := list[max(n, 0):]
		m.pool[tpl.ID] = list[:max(n, 0)]
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			for _, e := range excess {
				_ = m.destroy(context.Background(), e)
			}
		}()
	}
	m.kickPoolLocked()
}

// WarmCount is the number of ready pooled sandboxes of a template.
func (m *Manager) WarmCount(templateID string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.pool[templateID])
}

// PoolDepth is a warm pool's size: sandboxes ready now, and how many it
// is to keep.
type PoolDepth struct{ Ready, Target int }

// WarmPools are the warm pools asked for (SetWarmPool), by template ID.
func (m *Manager) WarmPools() map[string]PoolDepth {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]PoolDepth, len(m.poolTarget))
	for id, w := range m.poolTarget {
		out[id] = PoolDepth{Ready: len(m.pool[id]), Target: w.n}
	}
	return out
}

type poolWant struct {
	tpl Template
	n   int
}

func (m *Manager) kickPoolLocked() {
	select {
	case m.poolKick <- struct{}{}:
	default:
	}
}

// poolLoop refills the pool one sandbox at a time, so that refilling never
// takes more than one core away from requests.
func (m *Manager) poolLoop() {
	defer m.wg.Done()
	for {
		select {
		case <-m.stop:
			return
		case <-m.poolKick:
		}
		for {
			// Let a burst of creates finish before competing with it for CPU:
			// a refill costs tens of milliseconds of CPU, a claim almost none.
			if !m.sleep(m.quietFor(refillQuiet)) {
				return
			}
			want, ok := m.poolDeficit()
			if !ok {
				break
			}
			e := m.newEntry(Info{ID: newID(), TemplateID: want.tpl.ID})
			err := m.start(context.Background(), e, want.tpl, true)
			if err == nil {
				err = m.startPhase(m.life, e, want.tpl)
			}
			if rv, ok := e.rt.(runtime.RootViewer); ok && err == nil {
				prewarmLoginShell(rv.RootPath(), homeOf(rv.RootPath(), want.tpl.DefaultUser))
			}
			if err != nil {
				_ = m.destroy(context.Background(), e)
				if m.life.Err() != nil {
					return // closing
				}
				m.log.Warn("warm pool: start failed", "template", want.tpl.ID, "err", err)
				if !m.sleep(5 * time.Second) {
					return
				}
				continue
			}
			m.mu.Lock()
			closed := m.closed
			if !closed {
				m.pool[want.tpl.ID] = append(m.pool[want.tpl.ID], e)
			}
			m.mu.Unlock()
			if closed {
				_ = m.destroy(context.Background(), e)
				return
			}
		}
	}
}

// refillQuiet is how long after the last claim the pool waits to refill.
const refillQuiet = 50 * time.Millisecond

// quietFor returns how long until d has passed since the last claim.
func (m *Manager) quietFor(d time.Duration) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	return time.Until(m.lastClaim.Add(d))
}

// sleep waits d (if positive) unless the manager closes; false means closed.
func (m *Manager) sleep(d time.Duration) bool {
	if d <= 0 {
		return true
	}
	select {
	case <-m.stop:
		return false
	case <-time.After(d):
		return true
	}
}

// poolDeficit returns a template whose pool is below target.
func (m *Manager) poolDeficit() (poolWant, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return poolWant{}, false
	}
	for id, want := range m.poolTarget {
		if len(m.pool[id]) < want.n {
			return want, true
		}
	}
	return poolWant{}, false
}

// claim takes a warm sandbox of tpl, if one is ready, and gives it info's
// identity. It returns nil when there is none or it could not be claimed (the
// caller then starts one cold).
func (m *Manager) claim(ctx context.Context, info Info, tpl Template) *entry {
	m.mu.Lock()
	var e *entry
	if list := m.pool[tpl.ID]; len(list) > 0 {
		// The oldest: the one that has settled longest. A sandbox just
		// refilled is still finishing its own start (envd readies its
		// first user cgroup, the Go runtime grows), which the claimer's
		// first command would wait behind.
		e = list[0]
		m.pool[tpl.ID] = slices.Delete(list, 0, 1)
		m.lastClaim = time.Now()
		m.kickPoolLocked()
	}
	m.mu.Unlock()
	if e == nil {
		return nil
	}
	// From here e is this claim's alone; drop hands it to a teardown off the
	// request path, and the caller starts one cold.
	drop := func() *entry {
		go func() { _ = m.destroy(context.Background(), e) }()
		return nil
	}
	if !e.started.equal(startedFromOf(tpl)) {
		// The template was rebuilt (or its settings, env or commands
		// changed) since this sandbox started.
		return drop()
	}
	if m.opts.Disk != nil {
		// Warm sandboxes start with the template's disk size; the claimer's
		// request decides.
		stop := timing.Start(ctx, "claim.disk")
		err := m.opts.Disk.SetLimit(e.dir, int64(info.DiskSizeMB)<<20)
		stop()
		if err != nil {
			m.log.Warn("warm pool: set disk limit failed; starting cold", "id", e.id, "err", err)
			return drop()
		}
	}
	// envd replaces its env with /init's, so the template's goes along.
	env, err := templateEnv(tpl, info.EnvVars)
	if err != nil {
		return drop()
	}
	init := envdapi.InitRequest{AccessToken: info.AccessToken, EnvVars: env}
	stop := timing.Start(ctx, "claim.init")
	err = postInit(ctx, e.transport, init)
	stop()
	if err != nil {
		m.log.Warn("warm pool: claim failed; starting cold", "id", e.id, "err", err)
		return drop()
	}
	if m.opts.Network != nil {
		// The pooled sandbox started with all egress denied; now it gets the
		// client's policy, before any client code runs in it.
		stop := timing.Start(ctx, "claim.network")
		err := m.opts.Network.Update(e.id, PolicyOf(info))
		stop()
		if err != nil {
			m.log.Warn("warm pool: applying network policy failed; starting cold", "id", e.id, "err", err)
			return drop()
		}
	}
	addr := e.info.Addr
	e.info = info
	e.info.ID = e.id
	e.info.Addr = addr
	return e
}

func postInit(ctx context.Context, tr http.RoundTripper, body envdapi.InitRequest) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://envd/init", bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return fmt.Errorf("envd /init: %w", err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("envd /init: %s: %s", resp.Status, msg)
	}
	return nil
}

// drainPool destroys every pooled sandbox (at Close).
func (m *Manager) drainPool() {
	m.mu.Lock()
	var all []*entry
	for id, list := range m.pool {
		all = append(all, list...)
		delete(m.pool, id)
	}
	m.mu.Unlock()
	for _, e := range all {
		_ = m.destroy(context.Background(), e)
	}
}
