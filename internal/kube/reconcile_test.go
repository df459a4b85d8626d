package kube

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/airlock-sandbox/airlock/internal/lifecycle"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// TestReconcile drives one reconcile pass over records and Pods in every
// state it acts on, with client-go's fake clientset (a real cluster cannot
// OOM-kill or age a Pod on cue; the SDK suite's kube tests do the rest on
// the real one) and a real SQLite store: the killed events, the records
// and Pods left.
func TestReconcile(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := store.OpenSQLite(filepath.Join(t.TempDir(), "airlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	events := store.NewLifecycleEvents(st)
	client := fake.NewClientset()
	now := time.Now()
	b := &Backend{Pods: &Pods{Client: client, Namespace: "ns", Ready: time.Minute}, Records: st, Events: events, Now: func() time.Time { return now }}
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	pods := client.CoreV1().Pods("ns")
	pod := func(id string, created time.Time, status corev1.PodStatus) {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: PodName(id), Labels: map[string]string{LabelSandbox: id},
			CreationTimestamp: metav1.NewTime(created)}, Status: status}
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	running := corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.1"}
	record := func(id string, state sandbox.State, started, end time.Time) {
		info := sandbox.Info{ID: id, Owner: "team", TemplateID: "base", State: state, StartedAt: started, EndAt: end,
			Metadata: map[string]string{"k": id}, EnvVars: map[string]string{}, CPUCount: 1, MemoryMB: 256}
		if err := st.Put(ctx, sandbox.ToRecord(info)); err != nil {
			t.Fatal(err)
		}
	}
	hour := time.Hour
	// Timed out; running on; its Pod gone; its Pod OOM-killed; a create cut
	// short long ago; one under way; Pods no record names, old and new.
	record("timedout", sandbox.StateRunning, now.Add(-hour), now.Add(-time.Second))
	pod("timedout", now.Add(-hour), running)
	record("alive", sandbox.StateRunning, now.Add(-hour), now.Add(hour))
	pod("alive", now.Add(-hour), running)
	record("lost", sandbox.StateRunning, now.Add(-hour), now.Add(hour))
	record("oom", sandbox.StateRunning, now.Add(-hour), now.Add(hour))
	pod("oom", now.Add(-hour), corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: []corev1.ContainerStatus{{
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "OOMKilled", ExitCode: 137}}}}})
	record("stuck", sandbox.StateCreating, now.Add(-hour), now.Add(hour))
	pod("stuck", now.Add(-hour), corev1.PodStatus{Phase: corev1.PodPending})
	record("starting", sandbox.StateCreating, now.Add(-time.Second), now.Add(hour))
	pod("starting", now.Add(-time.Second), corev1.PodStatus{Phase: corev1.PodPending})
	pod("orphan", now.Add(-hour), running)
	pod("young", now.Add(-time.Second), running)
	testenv.Eventually(t, 10*time.Second, "the informer has every Pod", func() bool { return len(b.Pods.listed()) == 7 })

	if err := b.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]bool{"alive": true, "starting": true, "timedout": false, "lost": false, "oom": false, "stuck": false} {
		_, err := st.Get(ctx, id)
		if have := err == nil; have != want {
			t.Errorf("record %s kept: %v, want %v (%v)", id, have, want, err)
		}
	}
	for id, want := range map[string]bool{"alive": true, "starting": true, "young": true, "timedout": false, "oom": false, "stuck": false, "orphan": false} {
		_, err := pods.Get(ctx, PodName(id), metav1.GetOptions{})
		if have := !apierrors.IsNotFound(err); have != want {
			t.Errorf("Pod of %s kept: %v, want %v (%v)", id, have, want, err)
		}
	}
	killed := map[string]lifecycle.EventData{}
	for _, id := range []string{"timedout", "lost", "oom", "stuck", "alive", "orphan"} {
		evs, err := events.SandboxEvents(ctx, "team", id, lifecycle.Page{Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			var d lifecycle.EventData
			if err := json.Unmarshal(e.EventData, &d); err != nil {
				t.Fatal(err)
			}
			if e.Type != lifecycle.Killed || d.SandboxMetadata["k"] != id {
				t.Errorf("event of %s: %s %+v", id, e.Type, d)
			}
			killed[id] = d
		}
	}
	if len(killed) != 3 || killed["timedout"].KillReason != lifecycle.KillTimeout || killed["oom"].KillReason != lifecycle.KillOOM ||
		killed["lost"].KillReason != lifecycle.KillPodLost || killed["lost"].KillDetail == "" || killed["oom"].KillDetail == "" {
		t.Fatalf("killed events: %+v", killed)
	}
	if _, err := b.Get(ctx, "oom"); err == nil {
		t.Fatal("an OOM-killed sandbox is still served")
	}

	// A second pass finds nothing more to do.
	if err := b.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if evs, _ := events.OwnerEvents(ctx, "team", lifecycle.Page{Limit: 100}); len(evs) != 3 {
		t.Fatalf("events after a second pass: %d", len(evs))
	}
}
