package sandbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// TestMaxPerOwner starts more creations than the cap at once, from one owner:
// exactly the cap succeed and the others get ErrLimit with a clear message;
// another owner is not affected, and a kill frees a slot.
func TestMaxPerOwner(t *testing.T) {
	r := newRig(t)
	m := r.manager(t, time.Hour)
	m.SetMaxPerOwner(2)
	ctx := context.Background()
	req := sandbox.CreateRequest{Template: "base", Timeout: time.Minute, Owner: "alice"}

	var (
		mu      sync.Mutex
		created []string
		limited []error
		wg      sync.WaitGroup
	)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			info, err := m.Create(ctx, req)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				created = append(created, info.ID)
			case errors.Is(err, sandbox.ErrLimit):
				limited = append(limited, err)
			default:
				t.Errorf("create: %v", err)
			}
		}()
	}
	wg.Wait()
	if len(created) != 2 || len(limited) != 2 {
		t.Fatalf("created %d, limited %d; want 2 and 2", len(created), len(limited))
	}
	want := "limit reached: quota of concurrent sandboxes reached: this team has 2 running, paused or starting, its limit is 2; kill one first"
	if limited[0].Error() != want {
		t.Fatalf("error = %q, want %q", limited[0], want)
	}

	bob, err := m.Create(ctx, sandbox.CreateRequest{Template: "base", Timeout: time.Minute, Owner: "bob"})
	if err != nil {
		t.Fatalf("another owner was limited: %v", err)
	}
	if bob.Owner != "bob" {
		t.Fatalf("owner = %q", bob.Owner)
	}
	if err := m.Kill(ctx, created[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Create(ctx, req); err != nil {
		t.Fatalf("create after a kill freed a slot: %v", err)
	}
}
