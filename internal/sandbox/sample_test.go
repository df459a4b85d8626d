package sandbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// TestSampleAfterRelease: the metrics loop lists running sandboxes, then
// samples each under its op lock; a pause that released the runtime sandbox
// in between (memory=false) must not make it dereference a nil runtime (it
// panicked the server under `airlock bench persist`). A sample every
// millisecond across many pauses and resumes gives the race its chance.
func TestSampleAfterRelease(t *testing.T) {
	r := newRig(t)
	m := r.manager(t, time.Millisecond)
	ctx := context.Background()
	info, err := m.Create(ctx, sandbox.CreateRequest{Template: "base", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Kill(ctx, info.ID)
	for i := 0; i < 10; i++ {
		if err := m.Pause(ctx, info.ID, sandbox.PauseOptions{DropMemory: true}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond) // samples run while it is paused
		if _, _, err := m.Connect(ctx, info.ID, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
}
