package sandbox

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestListKeysSelectsAsList: ListKeys selects the sandboxes List returns,
// with each one's id, start and state, under every filter.
func TestListKeysSelectsAsList(t *testing.T) {
	m := &Manager{sandboxes: map[string]*entry{}}
	base := time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)
	states := []State{StateRunning, StatePaused, StateRunning, StateKilled}
	for i := 0; i < 40; i++ {
		id := fmt.Sprintf("sb%03d", i)
		e := &entry{id: id}
		e.info = Info{ID: id, TemplateID: []string{"t1", "t2"}[i%2], Alias: "a" + []string{"t1", "t2"}[i%2],
			StartedAt: base.Add(time.Duration(i%7) * time.Second), State: states[i%4],
			Metadata: map[string]string{"k": fmt.Sprint(i % 3)}}
		m.sandboxes[id] = e
	}
	ctx := context.Background()
	for _, f := range []ListFilter{
		{},
		{States: []State{StateRunning}},
		{States: []State{StatePaused, StateRunning}, Metadata: map[string]string{"k": "1"}},
		{Template: "at2"},
		{Template: "t1", StartedAfter: base.Add(3 * time.Second)},
		{Metadata: map[string]string{"k": "nothing"}},
	} {
		infos, err := m.List(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		keys, err := m.ListKeys(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		var want, got []ListKey
		for _, i := range infos {
			want = append(want, ListKey{ID: i.ID, StartedAt: i.StartedAt, State: i.State})
		}
		got = append(got, keys...)
		byID := func(a, b ListKey) int { return strings.Compare(a.ID, b.ID) }
		slices.SortFunc(want, byID)
		slices.SortFunc(got, byID)
		if !slices.Equal(got, want) {
			t.Errorf("filter %+v: ListKeys %v, List %v", f, got, want)
		}
	}
}
