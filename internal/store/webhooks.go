package store

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Webhook is a registered receiver of an owner's lifecycle events.
type Webhook struct {
	ID      string
	Owner   string
	Name    string
	URL     string
	Enabled bool
	// Events are the event types it subscribes to.
	Events []string
	// Secret signs every delivery; it is never shown back to the owner.
	Secret    string
	CreatedAt time.Time
	UpdatedAt time.Time
}

// The states of a delivery.
const (
	DeliveryPending   = "pending"
	DeliveryDelivered = "delivered"
	DeliveryFailed    = "failed"
)

// Delivery is one event on its way to one webhook: the outbox row a worker
// drains, with the outcome of its last attempt.
type Delivery struct {
	ID        string
	WebhookID string
	Owner     string
	EventID   string
	EventSeq  int64
	EventType string
	SandboxID string
	// Payload is the exact body sent (and signed) on every attempt.
	Payload       []byte
	Status        string
	Attempts      int
	NextAttemptAt time.Time
	LastError     string
	LastHTTP      int
	CreatedAt     time.Time
	UpdatedAt     time.Time

	// History is every attempt, oldest first (ListDeliveries fills it).
	History []Attempt
	// URL and Secret are the webhook's at the time DueDeliveries read them
	// (a PATCH applies to the next attempt).
	URL, Secret string
}

// Attempt is one POST of a delivery.
type Attempt struct {
	At       time.Time
	HTTP     int // 0: no response
	Error    string
	Duration time.Duration
}

// DispatchEvent is what the dispatcher needs of a lifecycle event to turn it
// into deliveries.
type DispatchEvent struct {
	ID        string
	Seq       int64
	Type      string
	Owner     string
	SandboxID string
	Time      time.Time
	Payload   []byte
}

// webhookSchema holds the webhooks, the dispatcher's cursor (the last event
// sequence number it turned into deliveries) and the delivery outbox.
const webhookSchema = `
CREATE TABLE IF NOT EXISTS webhooks (
	id          TEXT PRIMARY KEY,
	owner       TEXT NOT NULL,
	name        TEXT NOT NULL,
	url         TEXT NOT NULL,
	enabled     BOOLEAN NOT NULL,
	events      TEXT NOT NULL,   -- JSON array of event types
	secret      TEXT NOT NULL,
	created_at  BIGINT NOT NULL,
	updated_at  BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS webhooks_owner ON webhooks (owner, created_at);
CREATE TABLE IF NOT EXISTS webhook_cursor (
	id  INTEGER PRIMARY KEY CHECK (id = 1),
	seq BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS webhook_deliveries (
	id              TEXT PRIMARY KEY,
	webhook_id      TEXT NOT NULL,
	owner           TEXT NOT NULL,
	event_id        TEXT NOT NULL,
	event_seq       BIGINT NOT NULL,
	event_type      TEXT NOT NULL,
	sandbox_id      TEXT NOT NULL,
	payload         BLOB NOT NULL,
	status          TEXT NOT NULL,
	attempts        BIGINT NOT NULL DEFAULT 0,
	next_attempt_at BIGINT NOT NULL,
	last_error      TEXT NOT NULL DEFAULT '',
	last_http       BIGINT NOT NULL DEFAULT 0,
	created_at      BIGINT NOT NULL,
	updated_at      BIGINT NOT NULL,
	lease_until     BIGINT NOT NULL DEFAULT 0, -- claimed by a process until (DueDeliveries)
	UNIQUE (webhook_id, event_id)
);
CREATE INDEX IF NOT EXISTS webhook_deliveries_due ON webhook_deliveries (status, next_attempt_at);
CREATE INDEX IF NOT EXISTS webhook_deliveries_order ON webhook_deliveries (webhook_id, sandbox_id, status, event_seq);
CREATE INDEX IF NOT EXISTS webhook_deliveries_list ON webhook_deliveries (webhook_id, created_at);
CREATE TABLE IF NOT EXISTS webhook_attempts (
	delivery_id TEXT NOT NULL,
	at          BIGINT NOT NULL,
	http        BIGINT NOT NULL,
	error       TEXT NOT NULL,
	duration_us BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS webhook_attempts_delivery ON webhook_attempts (delivery_id, at);`

const webhookColumns = `id, owner, name, url, enabled, events, secret, created_at, updated_at`

// PutWebhook inserts or replaces (by ID) a webhook.
func (s *DB) PutWebhook(ctx context.Context, w Webhook) error {
	if w.ID == "" || w.Owner == "" {
		return fmt.Errorf("store: put webhook: id and owner are required")
	}
	ev, err := json.Marshal(nonNilSlice(w.Events))
	if err != nil {
		return fmt.Errorf("store: webhook %s events: %w", w.ID, err)
	}
	_, err = s.db.ExecContext(ctx, `INSERT INTO webhooks (`+webhookColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET `+updateAll(webhookColumns),
		w.ID, w.Owner, w.Name, w.URL, w.Enabled, string(ev), w.Secret, unixNano(w.CreatedAt), unixNano(w.UpdatedAt))
	if err != nil {
		return fmt.Errorf("store: put webhook %s: %w", w.ID, err)
	}
	return nil
}

// GetWebhook returns owner's webhook id; ErrNotFound when there is none or
// it is another owner's (one key cannot learn of another's webhooks).
func (s *DB) GetWebhook(ctx context.Context, owner, id string) (Webhook, error) {
	row := s.db.QueryRowContext(ctx, `SELECT `+webhookColumns+` FROM webhooks WHERE id = ? AND owner = ?`, id, owner)
	w, err := scanWebhook(row)
	if errors.Is(err, sql.ErrNoRows) {
		return Webhook{}, fmt.Errorf("%w: webhook %s", ErrNotFound, id)
	}
	return w, err
}

// ListWebhooks returns owner's webhooks, oldest first.
func (s *DB) ListWebhooks(ctx context.Context, owner string) ([]Webhook, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+webhookColumns+` FROM webhooks WHERE owner = ? ORDER BY created_at, id`, owner)
	if err != nil {
		return nil, fmt.Errorf("store: list webhooks: %w", err)
	}
	defer rows.Close()
	var out []Webhook
	for rows.Next() {
		w, err := scanWebhook(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, w)
	}
	return out, rows.Err()
}

// DeleteWebhook removes owner's webhook id with its deliveries (pending ones
// are not sent any more) and reports whether it existed.
func (s *DB) DeleteWebhook(ctx context.Context, owner, id string) (bool, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("store: delete webhook %s: %w", id, err)
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, `DELETE FROM webhooks WHERE id = ? AND owner = ?`, id, owner)
	if err != nil {
		return false, fmt.Errorf("store: delete webhook %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return false, nil
	}
	// On PostgreSQL, lock the deliveries first: this waits for an attempt
	// another process is recording on one of them (RecordAttempt holds its
	// row to its commit), so the statement below sees that attempt too, and
	// a later RecordAttempt finds its delivery gone. (DispatchEvents holds
	// the webhook's row while it makes deliveries, so no new one appears.)
	if err := lockedRows(ctx, tx, `SELECT id FROM webhook_deliveries WHERE webhook_id = ?`+tx.d.lockRows("FOR UPDATE"), id); err != nil {
		return false, fmt.Errorf("store: delete deliveries of webhook %s: %w", id, err)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM webhook_attempts WHERE delivery_id IN (SELECT id FROM webhook_deliveries WHERE webhook_id = ?)`, id); err != nil {
		return false, fmt.Errorf("store: delete attempts of webhook %s: %w", id, err)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM webhook_deliveries WHERE webhook_id = ?`, id); err != nil {
		return false, fmt.Errorf("store: delete deliveries of webhook %s: %w", id, err)
	}
	if err := tx.Commit(); err != nil {
		return false, fmt.Errorf("store: delete webhook %s: %w", id, err)
	}
	return true, nil
}

// lockedRows runs a locking query (lockRows) and reads its rows through,
// which is what takes the locks.
func lockedRows(ctx context.Context, tx *txn, query string, args ...any) error {
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return err
	}
	for rows.Next() {
	}
	if err := rows.Err(); err != nil {
		rows.Close()
		return err
	}
	return rows.Close()
}

func scanWebhook(row interface{ Scan(...any) error }) (Webhook, error) {
	var (
		w                Webhook
		events           string
		created, updated int64
	)
	if err := row.Scan(&w.ID, &w.Owner, &w.Name, &w.URL, &w.Enabled, &events, &w.Secret, &created, &updated); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return Webhook{}, err
		}
		return Webhook{}, fmt.Errorf("store: scan webhook: %w", err)
	}
	if err := json.Unmarshal([]byte(events), &w.Events); err != nil {
		return Webhook{}, fmt.Errorf("store: events of webhook %s: %w", w.ID, err)
	}
	w.CreatedAt = fromUnixNano(created)
	w.UpdatedAt = fromUnixNano(updated)
	return w, nil
}

// WebhookCursor is the sequence number of the last event turned into
// deliveries (0 before the first).
func (s *DB) WebhookCursor(ctx context.Context) (int64, error) {
	var seq int64
	err := s.db.QueryRowContext(ctx, `SELECT seq FROM webhook_cursor WHERE id = 1`).Scan(&seq)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("store: webhook cursor: %w", err)
	}
	return seq, nil
}

// DispatchEvents turns events into pending deliveries, one for each enabled
// webhook of the event's owner that subscribes to its type and was
// registered by the time it happened, and moves the cursor to through, all
// in one transaction: a crash leaves either none of it or all of it, so no
// event is lost or dispatched twice. It returns how many deliveries it made.
func (s *DB) DispatchEvents(ctx context.Context, events []DispatchEvent, through int64, now time.Time) (int, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("store: dispatch events: %w", err)
	}
	defer tx.Rollback()
	// Replicas on PostgreSQL each dispatch every event: the unique
	// (webhook, event) pair below keeps the second from making a second
	// delivery, and this lock has them take turns rather than wait on each
	// other's rows.
	if err := tx.lock(ctx, "webhook dispatch"); err != nil {
		return 0, fmt.Errorf("store: dispatch events: %w", err)
	}
	hooks := map[string][]Webhook{} // by owner, read once per batch
	made := 0
	for _, e := range events {
		ws, ok := hooks[e.Owner]
		if !ok {
			if ws, err = enabledWebhooks(ctx, tx, e.Owner); err != nil {
				return 0, err
			}
			hooks[e.Owner] = ws
		}
		for _, w := range ws {
			if !slices.Contains(w.Events, e.Type) || e.Time.Before(w.CreatedAt) {
				continue
			}
			// DO NOTHING: the same event offered twice (a cursor that did
			// not move, or another replica's) makes no second delivery.
			res, err := tx.ExecContext(ctx, `INSERT INTO webhook_deliveries
				(id, webhook_id, owner, event_id, event_seq, event_type, sandbox_id, payload, status, next_attempt_at, created_at, updated_at)
				VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`,
				newID(), w.ID, e.Owner, e.ID, e.Seq, e.Type, e.SandboxID, e.Payload, DeliveryPending,
				now.UnixNano(), now.UnixNano(), now.UnixNano())
			if err != nil {
				return 0, fmt.Errorf("store: delivery of event %s to webhook %s: %w", e.ID, w.ID, err)
			}
			n, _ := res.RowsAffected()
			made += int(n)
		}
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO webhook_cursor (id, seq) VALUES (1, ?)
		ON CONFLICT (id) DO UPDATE SET seq = `+tx.d.greatest("webhook_cursor.seq", "excluded.seq"), through); err != nil {
		return 0, fmt.Errorf("store: move webhook cursor: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("store: dispatch events: %w", err)
	}
	return made, nil
}

// enabledWebhooks reads owner's enabled webhooks in tx. On PostgreSQL it
// holds them (FOR SHARE) until tx ends: a webhook deleted meanwhile
// (DeleteWebhook) is deleted after the deliveries made for it here, with
// them, instead of before, leaving them behind.
func enabledWebhooks(ctx context.Context, tx *txn, owner string) ([]Webhook, error) {
	rows, err := tx.QueryContext(ctx, `SELECT `+webhookColumns+` FROM webhooks WHERE owner = ? AND enabled = TRUE ORDER BY id`+
		tx.d.lockRows("FOR SHARE"), owner)
	if err != nil {
		return nil, fmt.Errorf("store: webhooks of %s: %w", owner, err)
	}
	defer rows.Close()
	var out []Webhook
	for rows.Next() {
		w, err := scanWebhook(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, w)
	}
	return out, rows.Err()
}

// head selects the pending deliveries that are first in line: no pending
// delivery of the same webhook and sandbox comes from an earlier event, so
// a sandbox's events reach a webhook in the order they happened.
const head = `d.status = 'pending' AND NOT EXISTS (SELECT 1 FROM webhook_deliveries e
	WHERE e.webhook_id = d.webhook_id AND e.sandbox_id = d.sandbox_id AND e.status = 'pending' AND e.event_seq < d.event_seq)`

const deliveryColumns = `d.id, d.webhook_id, d.owner, d.event_id, d.event_seq, d.event_type, d.sandbox_id, d.payload, d.status,
	d.attempts, d.next_attempt_at, d.last_error, d.last_http, d.created_at, d.updated_at`

// DefaultDeliveryLease is how long, on PostgreSQL, a delivery that
// DueDeliveries handed out is held from every other process sharing the
// database (see SetDeliveryLease). It is well above an attempt's time (the
// dispatcher's default timeout is 10 s).
const DefaultDeliveryLease = time.Minute

// SetDeliveryLease sets how long a delivery DueDeliveries hands out is
// claimed: no call of DueDeliveries, in this process or another, returns
// it again until its attempt is recorded or the lease runs out (the
// process attempting it died, say; then it is attempted again, as deliveries
// are at least once). It must exceed the time one attempt may take. The
// default is DefaultDeliveryLease on PostgreSQL, and 0 on SQLite: one server
// process uses a SQLite file, and its dispatcher knows its own attempts in
// flight (DueDeliveries' skip), so that a delivery cut short by a restart is
// made again at once. Set it before the store is in use.
func (s *DB) SetDeliveryLease(d time.Duration) { s.lease = max(d, 0) }

// DueDeliveries returns up to limit deliveries first in line whose next
// attempt is due by now, with their webhook's current URL and secret, the
// longest waiting first; skip are deliveries already being attempted. The
// deliveries of a disabled webhook wait until it is enabled again. It
// claims what it returns for the delivery lease (SetDeliveryLease): on
// PostgreSQL, where the dispatchers of several replicas ask at once, it
// passes over the rows another is claiming (SKIP LOCKED), so no delivery is
// handed to two of them.
func (s *DB) DueDeliveries(ctx context.Context, now time.Time, limit int, skip map[string]bool) ([]Delivery, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("store: due deliveries: %w", err)
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx, `SELECT `+deliveryColumns+`, w.url, w.secret FROM webhook_deliveries d
		JOIN webhooks w ON w.id = d.webhook_id
		WHERE `+head+` AND w.enabled = TRUE AND d.next_attempt_at <= ? AND d.lease_until <= ?
		ORDER BY d.next_attempt_at, d.event_seq LIMIT ?`+tx.d.lockRows("FOR UPDATE OF d SKIP LOCKED"),
		now.UnixNano(), now.UnixNano(), limit+len(skip))
	if err != nil {
		return nil, fmt.Errorf("store: due deliveries: %w", err)
	}
	var out []Delivery
	for rows.Next() {
		var d Delivery
		if err := scanDelivery(rows, &d, &d.URL, &d.Secret); err != nil {
			rows.Close()
			return nil, err
		}
		if skip[d.ID] || len(out) == limit {
			continue
		}
		out = append(out, d)
	}
	if err := rows.Close(); err != nil {
		return nil, fmt.Errorf("store: due deliveries: %w", err)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: due deliveries: %w", err)
	}
	if s.lease > 0 {
		until := now.Add(s.lease).UnixNano()
		for _, d := range out {
			if _, err := tx.ExecContext(ctx, `UPDATE webhook_deliveries SET lease_until = ? WHERE id = ?`, until, d.ID); err != nil {
				return nil, fmt.Errorf("store: claim delivery %s: %w", d.ID, err)
			}
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("store: due deliveries: %w", err)
	}
	return out, nil
}

// NextAttemptAfter is the earliest next attempt after now of a delivery first
// in line (a claimed one's lease end, if later); ok is false when none
// waits.
func (s *DB) NextAttemptAfter(ctx context.Context, now time.Time) (t time.Time, ok bool, err error) {
	var next sql.NullInt64
	due := s.db.d.greatest("d.next_attempt_at", "d.lease_until")
	err = s.db.QueryRowContext(ctx, `SELECT min(`+due+`) FROM webhook_deliveries d
		JOIN webhooks w ON w.id = d.webhook_id WHERE `+head+` AND w.enabled = TRUE AND `+due+` > ?`,
		now.UnixNano()).Scan(&next)
	if err != nil {
		return time.Time{}, false, fmt.Errorf("store: next delivery attempt: %w", err)
	}
	if !next.Valid {
		return time.Time{}, false, nil
	}
	return time.Unix(0, next.Int64), true, nil
}

// RecordAttempt keeps the outcome of one attempt of delivery id and its new
// state: status (pending to try again at next, delivered or failed).
func (s *DB) RecordAttempt(ctx context.Context, id string, a Attempt, status string, next time.Time) error {
	switch status {
	case DeliveryPending, DeliveryDelivered, DeliveryFailed:
	default:
		return fmt.Errorf("store: delivery %s: unknown status %q", id, status)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: record attempt of %s: %w", id, err)
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, `UPDATE webhook_deliveries SET status = ?, attempts = attempts + 1, next_attempt_at = ?,
		last_error = ?, last_http = ?, updated_at = ?, lease_until = 0 WHERE id = ?`,
		status, unixNano(next), a.Error, a.HTTP, a.At.UnixNano(), id)
	if err != nil {
		return fmt.Errorf("store: record attempt of %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return nil // its webhook was deleted meanwhile, and the delivery with it
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO webhook_attempts (delivery_id, at, http, error, duration_us) VALUES (?, ?, ?, ?, ?)`,
		id, a.At.UnixNano(), a.HTTP, a.Error, a.Duration.Microseconds()); err != nil {
		return fmt.Errorf("store: record attempt of %s: %w", id, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: record attempt of %s: %w", id, err)
	}
	return nil
}

// ListDeliveries returns owner's webhook's deliveries, newest first, from
// offset, at most limit, each with its attempts.
func (s *DB) ListDeliveries(ctx context.Context, owner, webhookID string, offset, limit int) ([]Delivery, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+deliveryColumns+` FROM webhook_deliveries d
		WHERE d.webhook_id = ? AND d.owner = ? ORDER BY d.event_seq DESC, d.id LIMIT ? OFFSET ?`, webhookID, owner, limit, offset)
	if err != nil {
		return nil, fmt.Errorf("store: deliveries of %s: %w", webhookID, err)
	}
	var out []Delivery
	for rows.Next() {
		var d Delivery
		if err := scanDelivery(rows, &d); err != nil {
			rows.Close()
			return nil, err
		}
		out = append(out, d)
	}
	if err := rows.Close(); err != nil {
		return nil, fmt.Errorf("store: deliveries of %s: %w", webhookID, err)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: deliveries of %s: %w", webhookID, err)
	}
	for i := range out {
		if out[i].History, err = s.attempts(ctx, out[i].ID); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (s *DB) attempts(ctx context.Context, deliveryID string) ([]Attempt, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT at, http, error, duration_us FROM webhook_attempts WHERE delivery_id = ? ORDER BY at, rowid`, deliveryID)
	if err != nil {
		return nil, fmt.Errorf("store: attempts of %s: %w", deliveryID, err)
	}
	defer rows.Close()
	var out []Attempt
	for rows.Next() {
		var (
			a      Attempt
			at, us int64
		)
		if err := rows.Scan(&at, &a.HTTP, &a.Error, &us); err != nil {
			return nil, fmt.Errorf("store: scan attempt: %w", err)
		}
		a.At = time.Unix(0, at)
		a.Duration = time.Duration(us) * time.Microsecond
		out = append(out, a)
	}
	return out, rows.Err()
}

// PruneDeliveries removes the deliveries that finished (delivered or failed)
// before t, with their attempts, and returns how many.
func (s *DB) PruneDeliveries(ctx context.Context, t time.Time) (int, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("store: prune deliveries: %w", err)
	}
	defer tx.Rollback()
	const done = `status != 'pending' AND updated_at < ?`
	if _, err := tx.ExecContext(ctx, `DELETE FROM webhook_attempts WHERE delivery_id IN (SELECT id FROM webhook_deliveries WHERE `+done+`)`, t.UnixNano()); err != nil {
		return 0, fmt.Errorf("store: prune attempts: %w", err)
	}
	res, err := tx.ExecContext(ctx, `DELETE FROM webhook_deliveries WHERE `+done, t.UnixNano())
	if err != nil {
		return 0, fmt.Errorf("store: prune deliveries: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("store: prune deliveries: %w", err)
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}

func scanDelivery(row interface{ Scan(...any) error }, d *Delivery, extra ...any) error {
	var next, created, updated int64
	dest := append([]any{&d.ID, &d.WebhookID, &d.Owner, &d.EventID, &d.EventSeq, &d.EventType, &d.SandboxID, &d.Payload, &d.Status,
		&d.Attempts, &next, &d.LastError, &d.LastHTTP, &created, &updated}, extra...)
	if err := row.Scan(dest...); err != nil {
		return fmt.Errorf("store: scan delivery: %w", err)
	}
	d.NextAttemptAt = fromUnixNano(next)
	d.CreatedAt = fromUnixNano(created)
	d.UpdatedAt = fromUnixNano(updated)
	return nil
}

func nonNilSlice(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// newID is a random (version 4) UUID.
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := fmt.Sprintf("%x", b[:])
	return strings.Join([]string{h[0:8], h[8:12], h[12:16], h[16:20], h[20:32]}, "-")
}
