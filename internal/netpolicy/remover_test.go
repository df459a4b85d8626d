package netpolicy

import (
	"testing"
	"time"
)

// TestRemovalsYieldToInstalls: a removal waits for a lull of removalQuiet
// after the last install, but never longer than removalMaxWait after it
// arrived; with no install lately it goes at once.
func TestRemovalsYieldToInstalls(t *testing.T) {
	fw := &firewall{}
	fw.rm.fw = fw
	now := time.Date(2026, 11, 28, 3, 0, 0, 0, time.UTC)
	cases := []struct {
		name             string
		sinceAdd, queued time.Duration // before now
		want             time.Duration
	}{
		{"never installed", -1, 0, 0},
		{"install long ago", time.Minute, 0, 0},
		{"install just now", 0, 0, removalQuiet},
		{"install 20 ms ago", 20 * time.Millisecond, 0, removalQuiet - 20*time.Millisecond},
		{"waited almost its most", 0, removalMaxWait - 10*time.Millisecond, 10 * time.Millisecond},
		{"waited its most", 0, removalMaxWait, 0},
		{"waited past its most", 0, 2 * removalMaxWait, 0},
	}
	for _, c := range cases {
		fw.lastAdd.Store(0)
		if c.sinceAdd >= 0 {
			fw.lastAdd.Store(now.Add(-c.sinceAdd).UnixNano())
		}
		if got := fw.rm.yieldFor(now.Add(-c.queued), now); got != c.want {
			t.Errorf("%s: wait %v, want %v", c.name, got, c.want)
		}
	}
}
