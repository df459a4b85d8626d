package kube

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
)

// TestWatchEnds drives Watch with client-go's fake clientset (a real
// cluster cannot evict or OOM-kill on cue; TestSandboxPod deletes a Pod
// behind Airlock's back on the real one): each way a Pod ends is reported
// once with its reason, and a Delete of Airlock's is not reported.
func TestWatchEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := fake.NewClientset()
	p := &Pods{Client: client, Namespace: "ns"}
	var mu sync.Mutex
	got := map[string][]string{}
	if err := p.Watch(ctx, func(g Gone) {
		mu.Lock()
		got[g.ID] = append(got[g.ID], g.Reason)
		mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	pods := client.CoreV1().Pods("ns")
	mk := func(id string) *corev1.Pod {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: PodName(id), UID: types.UID("uid-" + id), Labels: map[string]string{LabelSandbox: id}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning}}
		if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		return pod
	}
	evicted := mk("evicted")
	evicted.Status = corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted", Message: "The node was low on resource: memory."}
	oom := mk("oom")
	oom.Status = corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: []corev1.ContainerStatus{{
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "OOMKilled", ExitCode: 137}}}}}
	for _, pod := range []*corev1.Pod{evicted, oom} {
		for range 2 { // told once, however often it is updated
			if _, err := pods.UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	mk("deleted")
	if err := pods.Delete(ctx, PodName("deleted"), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	mk("ours")
	if err := p.Delete(ctx, "ours"); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"evicted": "Evicted: The node was low on resource: memory.",
		"oom":     "OOMKilled (exit code 137)",
		"deleted": "was deleted (not by Airlock)",
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n >= len(want) || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // room for a report that should not come
	mu.Lock()
	defer mu.Unlock()
	for id, reason := range want {
		if r := got[id]; len(r) != 1 || !strings.Contains(r[0], reason) {
			t.Errorf("%s: reported %q, want once with %q", id, r, reason)
		}
	}
	if r, ok := got["ours"]; ok {
		t.Errorf("Airlock's own delete was reported: %q", r)
	}
}
