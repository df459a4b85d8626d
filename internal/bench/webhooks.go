package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"time"

	"github.com/airlock-sandbox/airlock/internal/lifecycle"
)

// WebhookConfig configures the webhook bench.
type WebhookConfig struct {
	APIURL, SandboxURL, APIKey string
	Template                   string
	// Creates is how many creates each series measures; Round how many
	// in a row before the other series takes over (alternating rounds
	// keep a drift of the machine out of the difference).
	Creates, Round int
	Progress       io.Writer
}

// Webhooks measures the create time (the API call, to the sandbox running)
// with no webhook and with one webhook subscribed to every event type,
// whose receiver (on loopback, in this process) accepts everything: the
// delivery must stay off the create path. The server must allow private
// webhook URLs.
func Webhooks(ctx context.Context, cfg WebhookConfig) ([]Row, error) {
	if cfg.Round <= 0 {
		cfg.Round = 10
	}
	var received atomic.Int64
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		received.Add(1)
	}))
	defer rcv.Close()
	c := newClient(Config{APIURL: cfg.APIURL, SandboxURL: cfg.SandboxURL, APIKey: cfg.APIKey, Template: cfg.Template})
	none := Row{Name: "create, no webhook"}
	one := Row{Name: "create, 1 webhook (every event)"}
	// One warm-up create, not counted: first-use costs belong to neither.
	if sb, err := c.create(ctx); err == nil {
		c.kill(ctx, sb)
	}
	for len(none.Samples) < cfg.Creates || len(one.Samples) < cfg.Creates {
		for _, withHook := range []bool{false, true} {
			row := &none
			var hookID string
			if withHook {
				row = &one
				id, err := registerWebhook(ctx, cfg, rcv.URL)
				if err != nil {
					return nil, err
				}
				hookID = id
			}
			for i := 0; i < cfg.Round && len(row.Samples) < cfg.Creates; i++ {
				t0 := time.Now()
				sb, err := c.create(ctx)
				if err != nil {
					return nil, err
				}
				row.Samples = append(row.Samples, time.Since(t0))
				c.kill(ctx, sb)
			}
			if hookID != "" {
				if err := webhookCall(ctx, cfg, http.MethodDelete, "/events/webhooks/"+hookID, nil, nil); err != nil {
					return nil, err
				}
			}
		}
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, "webhooks: %d + %d creates\n", len(none.Samples), len(one.Samples))
		}
	}
	diff := p50(one.Samples) - p50(none.Samples)
	one.Note = fmt.Sprintf("p50 %+.2f ms vs none (target ≤ 1 ms); %d deliveries received", float64(diff)/float64(time.Millisecond), received.Load())
	if received.Load() == 0 {
		one.Note += " (this server records no lifecycle events: the webhook had nothing to deliver)"
	}
	return []Row{none, one}, nil
}

func registerWebhook(ctx context.Context, cfg WebhookConfig, url string) (string, error) {
	var w struct {
		ID string `json:"id"`
	}
	err := webhookCall(ctx, cfg, http.MethodPost, "/events/webhooks", map[string]any{
		"name": "bench", "url": url, "events": lifecycle.Types, "signatureSecret": "bench-secret",
	}, &w)
	return w.ID, err
}

func webhookCall(ctx context.Context, cfg WebhookConfig, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, cfg.APIURL+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("X-API-KEY", cfg.APIKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("%s %s: %w", method, path, err)
		}
	}
	return nil
}
