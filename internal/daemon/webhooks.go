package daemon

import (
	"time"

	"github.com/airlock-sandbox/airlock/internal/lifecycle"
	"github.com/airlock-sandbox/airlock/internal/webhook"
)

// WebhookConfig configures the delivery of lifecycle webhooks.
type WebhookConfig struct {
	// AllowPrivate lets webhook URLs point at loopback, private and
	// link-local addresses (serve --webhook-allow-private); otherwise they
	// are refused when registered and again at every connection.
	AllowPrivate bool
	// Workers bounds the deliveries made at once (0: the default).
	Workers int
	// RetryBase, RetryMax and GiveUpAfter shape the retries of a failed
	// delivery (zero: webhook's defaults).
	RetryBase, RetryMax, GiveUpAfter time.Duration
}

// startWebhooks starts the webhook dispatcher over the store: it reads the
// lifecycle Feed (when the server has one) into the store's delivery outbox
// and drains it. It runs beside the manager and shares nothing with it but
// the store, so a slow receiver cannot hold a sandbox operation up.
func (d *Daemon) startWebhooks() {
	// A nil *LifecycleEvents must stay a nil Feed, not a non-nil interface
	// holding one.
	var feed lifecycle.Feed
	if d.Events != nil {
		feed = d.Events
	} else {
		d.log.Warn("webhooks: this server records no lifecycle events; webhooks can be registered but get no new events")
	}
	c := d.cfg.Webhooks
	d.Webhooks = webhook.New(webhook.Options{
		Store:        d.Store,
		Feed:         feed,
		AllowPrivate: c.AllowPrivate,
		Workers:      c.Workers,
		RetryBase:    c.RetryBase,
		RetryMax:     c.RetryMax,
		GiveUpAfter:  c.GiveUpAfter,
		Logger:       d.log,
		Delivered:    d.Metrics.WebhookDelivered,
	})
	d.Webhooks.Start()
	d.push("webhooks", d.Webhooks.Close)
}
