package daemon

// Webhook deliveries across a kill -9 of the server and a receiver that is
// down for a while, with a real `airlock serve` child process (host).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/crashpoint"
	"github.com/airlock-sandbox/airlock/internal/e2bwire"
	"github.com/airlock-sandbox/airlock/internal/lifecycle"
	"github.com/airlock-sandbox/airlock/internal/webhook"
)

// hookReceiver records the lifecycle events POSTed to it and answers with
// status (200 unless set).
type hookReceiver struct {
	status atomic.Int32
	mu     sync.Mutex
	// attempts counts every request by event id; delivered lists the
	// events answered 2xx, in arrival order.
	attempts  map[string]int
	delivered []lifecycle.Event
	badSig    int
	secret    string
}

func (rc *hookReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var e lifecycle.Event
	_ = json.Unmarshal(body, &e)
	status := int(rc.status.Load())
	if status == 0 {
		status = http.StatusOK
	}
	rc.mu.Lock()
	if r.Header.Get(webhook.HeaderSignature) != webhook.E2BSignature(rc.secret, body) {
		rc.badSig++
	}
	rc.attempts[e.ID]++
	if status/100 == 2 {
		rc.delivered = append(rc.delivered, e)
	}
	rc.mu.Unlock()
	w.WriteHeader(status)
}

func (rc *hookReceiver) snapshot() (map[string]int, []lifecycle.Event, int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	a := make(map[string]int, len(rc.attempts))
	for k, v := range rc.attempts {
		a[k] = v
	}
	return a, append([]lifecycle.Event(nil), rc.delivered...), rc.badSig
}

// apiJSON sends an authenticated JSON request to the running server.
func (h *host) apiJSON(method, path string, body, out any) int {
	h.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, h.srv.api+path, rd)
	req.Header.Set("X-API-KEY", serveKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode/100 == 2 {
		if err := json.Unmarshal(b, out); err != nil {
			h.t.Fatalf("%s %s: %v in %s", method, path, err, b)
		}
	}
	return resp.StatusCode
}

// needEvents skips the test when the server records no lifecycle events.
func (h *host) needEvents() {
	h.t.Helper()
	if code := h.apiJSON("GET", "/events/sandboxes?limit=1", nil, nil); code == http.StatusNotFound {
		h.t.Skip("this server records no lifecycle events yet (GET /events/sandboxes is 404): webhooks get no events to deliver")
	}
}

func (h *host) registerWebhook(url, secret string) string {
	h.t.Helper()
	var w struct{ ID string }
	if code := h.apiJSON("POST", "/events/webhooks", map[string]any{
		"name": "test", "url": url, "events": lifecycle.Types, "signatureSecret": secret,
	}, &w); code != http.StatusCreated {
		h.t.Fatalf("register webhook: status %d", code)
	}
	return w.ID
}

// hookDelivery is one row of GET /events/webhooks/{id}/deliveries.
type hookDelivery struct {
	EventType string `json:"eventType"`
	SandboxID string `json:"sandboxId"`
	Status    string `json:"status"`
	Attempts  []struct {
		HTTPStatus int `json:"httpStatus"`
	} `json:"attempts"`
}

// delivery finds the webhook's delivery of one sandbox's event.
func (h *host) delivery(hookID, sandboxID, eventType string) (hookDelivery, bool) {
	h.t.Helper()
	var ds []hookDelivery
	h.apiJSON("GET", "/events/webhooks/"+hookID+"/deliveries", nil, &ds)
	for _, d := range ds {
		if d.SandboxID == sandboxID && d.EventType == eventType {
			return d, true
		}
	}
	return hookDelivery{}, false
}

func waitUntil(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", within, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestWebhookSurvivesKill9: an event whose delivery has been attempted but
// not accepted when the server is killed -9 is delivered after the restart.
func TestWebhookSurvivesKill9(t *testing.T) {
	h := newHost(t, "linux", "--webhook-allow-private", "--webhook-retry-max", "1s")
	rc := &hookReceiver{attempts: map[string]int{}, secret: "kill9-secret"}
	rc.status.Store(http.StatusServiceUnavailable)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: rc}
	go srv.Serve(ln)
	defer srv.Close()

	h.start()
	h.needEvents()
	hookID := h.registerWebhook("http://"+ln.Addr().String()+"/hook", rc.secret)
	ctx := context.Background()
	timeout := int64(300)
	created, err := h.client().Create(ctx, e2bwire.NewSandbox{TemplateID: "base", Timeout: &timeout})
	if err != nil {
		t.Fatal(err)
	}
	h.ids[created.SandboxID] = true
	// Killed once the refused attempt is on record, not merely received: an
	// attempt the server had no time to record is retried as well, but the
	// delivery's history then cannot show it (the CI run that failed so).
	waitUntil(t, 15*time.Second, "a first (refused) attempt of the created event, recorded", func() bool {
		d, ok := h.delivery(hookID, created.SandboxID, lifecycle.Created)
		return ok && len(d.Attempts) > 0
	})
	h.kill9()
	rc.status.Store(http.StatusOK)
	h.start()
	waitUntil(t, 20*time.Second, "the created event delivered after the restart", func() bool {
		_, d, _ := rc.snapshot()
		for _, e := range d {
			if e.SandboxID == created.SandboxID && e.Type == lifecycle.Created {
				return true
			}
		}
		return false
	})
	if _, _, bad := rc.snapshot(); bad > 0 {
		t.Errorf("%d requests with a wrong e2b-signature", bad)
	}
	d, ok := h.delivery(hookID, created.SandboxID, lifecycle.Created)
	if !ok {
		t.Errorf("no delivery of the created event listed")
	} else if d.Status != "delivered" || len(d.Attempts) < 2 || d.Attempts[0].HTTPStatus != 503 {
		t.Errorf("created event's delivery: %+v", d)
	}
	if err := h.client().Kill(ctx, created.SandboxID); err != nil {
		t.Fatal(err)
	}
	h.stop()
}

// TestWebhookReceiverDown: while a receiver is down for 30 s a sandbox is
// created, changed and killed; once it is back it gets every event, in
// order.
func TestWebhookReceiverDown(t *testing.T) {
	h := newHost(t, "linux", "--webhook-allow-private", "--webhook-retry-max", "2s")
	rc := &hookReceiver{attempts: map[string]int{}, secret: "down-secret"}
	// A port that nothing listens on for now, and that is free again later.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()

	h.start()
	h.needEvents()
	h.registerWebhook("http://"+addr+"/hook", rc.secret)
	down := time.Now()
	ctx := context.Background()
	timeout := int64(300)
	created, err := h.client().Create(ctx, e2bwire.NewSandbox{TemplateID: "base", Timeout: &timeout})
	if err != nil {
		t.Fatal(err)
	}
	id := created.SandboxID
	h.ids[id] = true
	if err := h.client().SetTimeout(ctx, id, 200*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := h.client().Kill(ctx, id); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(down.Add(30 * time.Second)))
	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen again on %s: %v", addr, err)
	}
	srv := &http.Server{Handler: rc}
	go func() {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("receiver: %v", err)
		}
	}()
	defer srv.Close()
	back := time.Now()
	waitUntil(t, 15*time.Second, "the killed event after the receiver came back", func() bool {
		_, d, _ := rc.snapshot()
		return len(d) > 0 && d[len(d)-1].Type == lifecycle.Killed
	})
	t.Logf("all delivered %s after the receiver came back", time.Since(back).Round(time.Millisecond))
	_, got, bad := rc.snapshot()
	if bad > 0 {
		t.Errorf("%d requests with a wrong e2b-signature", bad)
	}
	var types []string
	for _, e := range got {
		if e.SandboxID == id {
			types = append(types, e.Type)
		}
	}
	want := []string{lifecycle.Created, lifecycle.Updated, lifecycle.Killed}
	i := 0
	for _, typ := range types {
		if i < len(want) && typ == want[i] {
			i++
		}
	}
	if i != len(want) || types[0] != lifecycle.Created || types[len(types)-1] != lifecycle.Killed {
		t.Errorf("delivered %v; want %v in this order", types, want)
	}
	// The deliveries waited out the 30 s the receiver was down.
	if n, sum := h.metric("airlock_webhook_delivery_lag_seconds_count"), h.metric("airlock_webhook_delivery_lag_seconds_sum"); n < 3 || sum < 3*25 {
		t.Errorf("webhook delivery lag in the metrics: %v deliveries, %v s in all; want at least 3, each after about 30 s", n, sum)
	}
	h.stop()
}

// TestWebhookCrashBeforeDelivery: the server is killed (its crash point)
// right after the dispatcher read an event from the feed, and right after
// it stored the event's deliveries; either way the restarted server
// delivers the event, once.
func TestWebhookCrashBeforeDelivery(t *testing.T) {
	for _, point := range []string{crashpoint.WebhookEventsRead, crashpoint.WebhookDispatched} {
		t.Run(point, func(t *testing.T) {
			h := newHost(t, "linux", "--webhook-allow-private", "--webhook-retry-max", "1s")
			rc := &hookReceiver{attempts: map[string]int{}, secret: "crash-secret"}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv := &http.Server{Handler: rc}
			go srv.Serve(ln)
			defer srv.Close()

			h.start()
			h.needEvents()
			h.registerWebhook("http://"+ln.Addr().String()+"/hook", rc.secret)
			h.stop()
			h.start(crashpoint.Env + "=" + point)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			timeout := int64(300)
			// The crash may come before the create's answer does.
			if created, err := h.client().Create(ctx, e2bwire.NewSandbox{TemplateID: "base", Timeout: &timeout}); err == nil {
				h.ids[created.SandboxID] = true
			}
			h.died(30 * time.Second)
			if a, _, _ := rc.snapshot(); len(a) != 0 {
				t.Fatalf("a delivery was attempted before the crash: %v", a)
			}
			h.start()
			var created lifecycle.Event
			waitUntil(t, 20*time.Second, "the created event delivered after the restart", func() bool {
				_, d, _ := rc.snapshot()
				for _, e := range d {
					if e.Type == lifecycle.Created {
						created = e
						return true
					}
				}
				return false
			})
			h.ids[created.SandboxID] = true
			time.Sleep(2 * time.Second) // room for a second delivery to show
			if a, _, bad := rc.snapshot(); a[created.ID] != 1 || bad != 0 {
				t.Errorf("the created event was attempted %d times (want 1), %d bad signatures", a[created.ID], bad)
			}
			h.stop()
		})
	}
}
