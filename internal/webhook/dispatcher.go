// Package webhook delivers lifecycle events to the webhooks API keys
// register (E2B's "lifecycle events webhooks").
//
// Flow: the dispatcher reads every event after its cursor from the
// lifecycle Feed (woken by Feed.Notify) and, in one store transaction, makes
// a pending delivery for each enabled webhook of the event's owner that
// subscribes to the event's type and moves the cursor past the event. Workers
// (a bounded pool) POST each due delivery, signed, and record the attempt:
// a 2xx marks it delivered; anything else is retried with exponential
// backoff and jitter until GiveUpAfter has passed since the event, then it
// is failed. A delivery waits for the earlier deliveries of the same sandbox
// to the same webhook (in order per sandbox per webhook). Everything is in
// the store, so a restart, or a kill -9, loses nothing: an attempt cut short
// is made again (at least once). Nothing here holds a lock of the sandbox
// manager or sits on its path: the manager only records events.
package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/crashpoint"
	"github.com/airlock-sandbox/airlock/internal/lifecycle"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// Defaults for Options fields left zero.
const (
	DefaultWorkers     = 4
	DefaultTimeout     = 10 * time.Second
	DefaultRetryBase   = 2 * time.Second
	DefaultRetryMax    = 30 * time.Minute
	DefaultGiveUpAfter = 24 * time.Hour
	// DefaultRetention is how long finished deliveries stay listed.
	DefaultRetention = 7 * 24 * time.Hour
)

// feedBatch is how many events one read of the Feed takes.
const feedBatch = 256

// idlePoll bounds every wait of the loops, so that a missed wake-up (a
// webhook enabled again, a Feed without a notification) costs at most this.
const idlePoll = 30 * time.Second

// Store is what the dispatcher keeps in the store (store.SQLite).
type Store interface {
	WebhookCursor(ctx context.Context) (int64, error)
	DispatchEvents(ctx context.Context, events []store.DispatchEvent, through int64, now time.Time) (int, error)
	DueDeliveries(ctx context.Context, now time.Time, limit int, skip map[string]bool) ([]store.Delivery, error)
	NextAttemptAfter(ctx context.Context, now time.Time) (time.Time, bool, error)
	RecordAttempt(ctx context.Context, id string, a store.Attempt, status string, next time.Time) error
	PruneDeliveries(ctx context.Context, before time.Time) (int, error)
}

// Options configure a Dispatcher.
type Options struct {
	Store Store
	// Feed is where events come from; nil makes no new deliveries (those
	// already pending are still made).
	Feed lifecycle.Feed
	// AllowPrivate lets deliveries connect to loopback, private and
	// link-local addresses (serve --webhook-allow-private).
	AllowPrivate bool
	// Workers bounds the deliveries attempted at once; Timeout one attempt.
	Workers int
	Timeout time.Duration
	// RetryBase is the wait after a first failed attempt; each failure
	// doubles it, up to RetryMax, with jitter. GiveUpAfter (counted from
	// when the event was dispatched) marks a delivery failed.
	RetryBase, RetryMax, GiveUpAfter time.Duration
	// Retention is how long a finished delivery is kept.
	Retention time.Duration
	// Transport overrides Transport(AllowPrivate) (tests).
	Transport http.RoundTripper
	Logger    *slog.Logger
	// Delivered, when set, hears each delivery that succeeded: how long
	// after its event was dispatched (the server's metrics).
	Delivered func(lag time.Duration)
}

// Dispatcher turns events into deliveries and makes them.
type Dispatcher struct {
	opts   Options
	log    *slog.Logger
	client *http.Client

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	wake   chan struct{}

	mu       sync.Mutex
	inflight map[string]bool
}

// New returns a dispatcher; Start starts it.
func New(opts Options) *Dispatcher {
	if opts.Workers <= 0 {
		opts.Workers = DefaultWorkers
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.RetryBase <= 0 {
		opts.RetryBase = DefaultRetryBase
	}
	if opts.RetryMax <= 0 {
		opts.RetryMax = DefaultRetryMax
	}
	if opts.RetryMax < opts.RetryBase {
		opts.RetryMax = opts.RetryBase
	}
	if opts.GiveUpAfter <= 0 {
		opts.GiveUpAfter = DefaultGiveUpAfter
	}
	if opts.Retention <= 0 {
		opts.Retention = DefaultRetention
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	rt := opts.Transport
	if rt == nil {
		rt = Transport(opts.AllowPrivate)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Dispatcher{
		opts: opts, log: opts.Logger,
		client: &http.Client{
			Transport: rt, Timeout: opts.Timeout,
			// A redirect is an answer other than 2xx: following it would
			// send the signed event where the owner did not register.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		ctx: ctx, cancel: cancel,
		wake:     make(chan struct{}, 1),
		inflight: map[string]bool{},
	}
}

// Start starts the feed loop (when there is a Feed) and the delivery loop.
func (d *Dispatcher) Start() {
	if d.opts.Feed != nil {
		d.wg.Add(1)
		go d.feedLoop()
	}
	d.wg.Add(1)
	go d.deliveryLoop()
}

// Close stops the loops and the attempts under way (which are made again
// at the next start) and waits for them.
func (d *Dispatcher) Close() error {
	d.cancel()
	d.wg.Wait()
	return nil
}

// poke wakes the delivery loop without blocking.
func (d *Dispatcher) poke() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// sleep waits for t or for Close; it reports false on Close.
func (d *Dispatcher) sleep(t time.Duration) bool {
	timer := time.NewTimer(t)
	defer timer.Stop()
	select {
	case <-d.ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}

func (d *Dispatcher) feedLoop() {
	defer d.wg.Done()
	var cursor int64
	for {
		var err error
		if cursor, err = d.opts.Store.WebhookCursor(d.ctx); err == nil {
			break
		}
		d.log.Error("webhooks: read the dispatch cursor; retrying", "err", err)
		if !d.sleep(time.Second) {
			return
		}
	}
	for {
		next, more, err := d.dispatch(cursor)
		if err != nil {
			if d.ctx.Err() != nil {
				return
			}
			d.log.Error("webhooks: dispatch events; retrying", "after", cursor, "err", err)
			if !d.sleep(time.Second) {
				return
			}
			continue
		}
		cursor = next
		if more {
			continue
		}
		timer := time.NewTimer(idlePoll)
		select {
		case <-d.ctx.Done():
			timer.Stop()
			return
		case <-d.opts.Feed.Notify():
		case <-timer.C:
		}
		timer.Stop()
	}
}

// dispatch turns one batch of events after cursor into deliveries and
// returns the new cursor, and whether there may be more (a full batch: a
// short one means the feed was caught up, and asking again would only cost
// the store a read that contends with sandbox operations).
func (d *Dispatcher) dispatch(cursor int64) (int64, bool, error) {
	events, err := d.opts.Feed.After(d.ctx, cursor, feedBatch)
	if err != nil || len(events) == 0 {
		return cursor, false, err
	}
	crashpoint.Hit(crashpoint.WebhookEventsRead)
	batch := make([]store.DispatchEvent, 0, len(events))
	for _, e := range events {
		payload, err := json.Marshal(e)
		if err != nil {
			return cursor, false, fmt.Errorf("encode event %s: %w", e.ID, err)
		}
		batch = append(batch, store.DispatchEvent{
			ID: e.ID, Seq: e.Seq, Type: e.Type, Owner: e.SandboxTeamID, SandboxID: e.SandboxID,
			Time: e.Timestamp, Payload: payload,
		})
	}
	through := events[len(events)-1].Seq
	n, err := d.opts.Store.DispatchEvents(d.ctx, batch, through, time.Now())
	if err != nil {
		return cursor, false, err
	}
	crashpoint.Hit(crashpoint.WebhookDispatched)
	if n > 0 {
		d.poke()
	}
	return through, len(events) == feedBatch, nil
}

func (d *Dispatcher) deliveryLoop() {
	defer d.wg.Done()
	d.prune()
	prune := time.NewTicker(time.Hour)
	defer prune.Stop()
	for {
		wait := d.startDue()
		timer := time.NewTimer(wait)
		select {
		case <-d.ctx.Done():
			timer.Stop()
			return
		case <-d.wake:
		case <-timer.C:
		case <-prune.C:
			d.prune()
		}
		timer.Stop()
	}
}

// startDue starts an attempt of every due delivery that a free worker can
// take, and returns how long to wait before looking again (a worker that
// finishes, or a new delivery, wakes the loop sooner).
func (d *Dispatcher) startDue() time.Duration {
	now := time.Now()
	d.mu.Lock()
	free := d.opts.Workers - len(d.inflight)
	skip := make(map[string]bool, len(d.inflight))
	for id := range d.inflight {
		skip[id] = true
	}
	d.mu.Unlock()
	if free > 0 {
		due, err := d.opts.Store.DueDeliveries(d.ctx, now, free, skip)
		if err != nil {
			if d.ctx.Err() == nil {
				d.log.Error("webhooks: read due deliveries", "err", err)
			}
			return time.Second
		}
		for _, dl := range due {
			d.mu.Lock()
			d.inflight[dl.ID] = true
			d.mu.Unlock()
			d.wg.Add(1)
			go d.attempt(dl)
		}
	}
	next, ok, err := d.opts.Store.NextAttemptAfter(d.ctx, now)
	switch {
	case err != nil:
		if d.ctx.Err() == nil {
			d.log.Error("webhooks: read the next delivery time", "err", err)
		}
		return time.Second
	case !ok:
		return idlePoll
	default:
		return min(max(time.Until(next), 0), idlePoll)
	}
}

func (d *Dispatcher) prune() {
	n, err := d.opts.Store.PruneDeliveries(d.ctx, time.Now().Add(-d.opts.Retention))
	switch {
	case err != nil && d.ctx.Err() == nil:
		d.log.Warn("webhooks: prune finished deliveries", "err", err)
	case n > 0:
		d.log.Debug("webhooks: pruned finished deliveries", "count", n)
	}
}

// maxErrorBody bounds what of a receiver's error answer is kept.
const maxErrorBody = 512

// attempt POSTs one delivery and records the outcome.
func (d *Dispatcher) attempt(dl store.Delivery) {
	defer func() {
		d.mu.Lock()
		delete(d.inflight, dl.ID)
		d.mu.Unlock()
		d.poke()
		d.wg.Done()
	}()
	start := time.Now()
	code, err := d.post(dl, start)
	if err != nil && d.ctx.Err() != nil {
		// Cut short by Close: not the receiver's doing, and not recorded;
		// the next start makes it again.
		return
	}
	a := store.Attempt{At: start, HTTP: code, Duration: time.Since(start)}
	status, next := store.DeliveryDelivered, time.Time{}
	if err != nil {
		a.Error = err.Error()
		status, next = d.retry(dl, start)
	}
	// Recorded even while closing: the POST was made, and a delivered one
	// must not be sent again.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := d.opts.Store.RecordAttempt(ctx, dl.ID, a, status, next); err != nil {
		d.log.Error("webhooks: record a delivery attempt", "delivery", dl.ID, "err", err)
		return
	}
	switch status {
	case store.DeliveryDelivered:
		if f := d.opts.Delivered; f != nil {
			f(time.Since(dl.CreatedAt))
		}
	case store.DeliveryFailed:
		d.log.Warn("webhooks: delivery failed for good", "webhook", dl.WebhookID, "delivery", dl.ID, "event", dl.EventID, "attempts", dl.Attempts+1, "err", a.Error)
	case store.DeliveryPending:
		d.log.Debug("webhooks: delivery attempt failed; will retry", "webhook", dl.WebhookID, "delivery", dl.ID, "next", next, "err", a.Error)
	}
}

// errStatus is a receiver's answer other than 2xx.
var errStatus = errors.New("receiver answered")

// post sends dl once and returns the HTTP status (0 without an answer) and
// an error unless it was a 2xx.
func (d *Dispatcher) post(dl store.Delivery, now time.Time) (int, error) {
	req, err := http.NewRequestWithContext(d.ctx, http.MethodPost, dl.URL, bytes.NewReader(dl.Payload))
	if err != nil {
		return 0, fmt.Errorf("build the request: %w", err)
	}
	h := req.Header
	h.Set("Content-Type", "application/json")
	h.Set("User-Agent", "Airlock-Webhooks/1")
	h.Set(HeaderWebhookID, dl.WebhookID)
	h.Set(HeaderDeliveryID, dl.ID)
	h.Set(HeaderSignatureVersion, SignatureVersion)
	h.Set(HeaderSignature, E2BSignature(dl.Secret, dl.Payload))
	// The delivery's id is the message id: the same on every attempt, so a
	// receiver can tell a retry from a new event.
	h.Set(HeaderSWID, dl.ID)
	h.Set(HeaderSWTimestamp, strconv.FormatInt(now.Unix(), 10))
	h.Set(HeaderSWSignature, SWSignature(SWKey(dl.Secret), dl.ID, now, dl.Payload))
	resp, err := d.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // lets the connection be reused
		return resp.StatusCode, nil
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	if len(body) > 0 {
		return resp.StatusCode, fmt.Errorf("%w %s: %q", errStatus, resp.Status, body)
	}
	return resp.StatusCode, fmt.Errorf("%w %s", errStatus, resp.Status)
}

// retry decides what follows a failed attempt at now: another after a
// backoff, or failed when that would pass GiveUpAfter.
func (d *Dispatcher) retry(dl store.Delivery, now time.Time) (string, time.Time) {
	next := now.Add(Backoff(dl.Attempts+1, d.opts.RetryBase, d.opts.RetryMax, rand.Float64))
	if next.Sub(dl.CreatedAt) > d.opts.GiveUpAfter {
		return store.DeliveryFailed, time.Time{}
	}
	return store.DeliveryPending, next
}

// Backoff is the wait after the n-th failed attempt (n ≥ 1): base doubled
// n-1 times, at most maxDelay, of which a random half (r in [0,1)) is jitter, so
// that the deliveries of one dead receiver do not all come back at once.
func Backoff(n int, base, maxDelay time.Duration, r func() float64) time.Duration {
	d := base
	for i := 1; i < n && d < maxDelay; i++ {
		d *= 2
	}
	d = min(d, maxDelay)
	return d/2 + time.Duration(r()*float64(d/2))
}
