package usercgroup

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// fakeUser is a v2 "user" cgroup made of plain files: pids.events of the
// users and of each leaf, and a cgroup.kill per leaf that records the write.
type fakeUser struct {
	t    *testing.T
	dir  string
	hits map[string]int64
}

func newFakeUser(t *testing.T) *fakeUser {
	f := &fakeUser{t: t, dir: t.TempDir(), hits: map[string]int64{}}
	f.write()
	return f
}

// refuse adds n refused task creations to leaf (and so to the users').
func (f *fakeUser) refuse(leaf string, n int64) {
	if err := os.MkdirAll(filepath.Join(f.dir, leaf), 0o755); err != nil {
		f.t.Fatal(err)
	}
	f.hits[leaf] += n
	f.write()
}

func (f *fakeUser) write() {
	var total int64
	for leaf, n := range f.hits {
		total += n
		f.file(filepath.Join(leaf, "pids.events"), fmt.Sprintf("max %d\n", n))
	}
	f.file("pids.events", fmt.Sprintf("max %d\n", total))
}

func (f *fakeUser) file(name, content string) {
	if err := os.WriteFile(filepath.Join(f.dir, name), []byte(content), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fakeUser) killed(leaf string) bool {
	b, err := os.ReadFile(filepath.Join(f.dir, leaf, "cgroup.kill"))
	return err == nil && string(b) == "1"
}

func kills(ks []StormKill) []string {
	var out []string
	for _, k := range ks {
		if k.Err != nil {
			out = append(out, k.Leaf+": "+k.Err.Error())
			continue
		}
		out = append(out, fmt.Sprintf("%s:%d", k.Leaf, k.Refused))
	}
	return out
}

// A storm is stormHits refusals within stormWindow; fewer, or as many spread
// over a longer time, is a program at its limit that backs off.
func TestStormGuard(t *testing.T) {
	f := newFakeUser(t)
	now := time.Unix(1000, 0)
	g := &stormGuard{user: f.dir, hist: map[string][]count{}, prev: now}
	tick := func(every time.Duration) []StormKill {
		now = now.Add(every)
		return g.tick(now)
	}
	perWindow := int(stormWindow / stormPoll)
	if got := tick(stormPoll); got != nil {
		t.Fatalf("idle: %v", kills(got))
	}
	// A retrying shell: one refusal a poll, never stormHits in a window.
	f.refuse("t1", 0)
	for range 4 * perWindow {
		f.refuse("t1", 1)
		if got := tick(stormPoll); got != nil {
			t.Fatalf("one refusal a poll killed %v", kills(got))
		}
	}
	// A fork loop: a generation refused at once in another leaf.
	f.refuse("t2", stormHits-1)
	if got := tick(stormPoll); got != nil {
		t.Fatalf("%d refusals killed %v", stormHits-1, kills(got))
	}
	f.refuse("t2", 1)
	got := kills(tick(stormPoll))
	if len(got) != 1 || got[0] != fmt.Sprintf("t2:%d", stormHits) || !f.killed("t2") || f.killed("t1") {
		t.Fatalf("storm in t2: killed %v (t1 %v, t2 %v)", got, f.killed("t1"), f.killed("t2"))
	}
	// The refusals dealt with do not count again.
	if got := tick(stormPoll); got != nil {
		t.Fatalf("killed again: %v", kills(got))
	}
	// Refusals that reach stormHits only over more than the window do not
	// storm.
	f.refuse("t3", 0)
	tick(stormPoll)
	for range 2 * perWindow {
		f.refuse("t3", int64(stormHits/perWindow))
		if got := tick(stormPoll); got != nil {
			t.Fatalf("spread refusals killed %v", kills(got))
		}
	}
	// Nor when the polls come late (a loaded sandbox): the window is time,
	// not a number of polls.
	f.refuse("t5", 0)
	tick(stormPoll)
	late := stormWindow * 2 / 5
	for range 10 {
		f.refuse("t5", int64(stormHits*late/stormWindow)-1)
		if got := tick(late); got != nil {
			t.Fatalf("late polls killed %v", kills(got))
		}
	}
	// A leaf that appears with stormHits refusals since the last poll storms
	// at once.
	f.refuse("t4", stormHits)
	if got := kills(tick(stormPoll)); len(got) != 1 || got[0] != fmt.Sprintf("t4:%d", stormHits) {
		t.Fatalf("new leaf: killed %v", got)
	}
}

func TestReadMaxEvents(t *testing.T) {
	p := filepath.Join(t.TempDir(), "pids.events")
	for content, want := range map[string]int64{"max 0\n": 0, "max 1234\n": 1234} {
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if n, err := readMaxEvents(p); err != nil || n != want {
			t.Fatalf("%q: %d, %v", content, n, err)
		}
	}
	for _, bad := range []string{"", "max x\n", "other 1\n"} {
		if err := os.WriteFile(p, []byte(bad), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := readMaxEvents(p); err == nil {
			t.Fatalf("%q: no error", bad)
		}
	}
}
