package kube

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

// Gone is a sandbox whose Pod ended without a Delete of Airlock's: deleted
// behind its back, evicted, failed, or its envd ended. The manager records
// it as a killed sandbox with Reason, never as one that silently stops
// answering.
type Gone struct {
	ID     string
	Reason string
}

// Watch calls gone once for each sandbox Pod of the namespace that ends
// other than by Delete, until ctx ends; it returns once its first list of
// the Pods is in (so a Pod that ends after Watch returns is reported).
func (p *Pods) Watch(ctx context.Context, gone func(Gone)) error {
	f := informers.NewSharedInformerFactoryWithOptions(p.Client, 10*time.Minute,
		informers.WithNamespace(p.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = LabelSandbox }))
	inf := f.Core().V1().Pods().Informer()
	var mu sync.Mutex
	told := map[string]bool{}
	report := func(pod *corev1.Pod, reason string) {
		id := pod.Labels[LabelSandbox]
		if id == "" || p.deleting(id) {
			return
		}
		mu.Lock()
		first := !told[pod.Name+string(pod.UID)]
		told[pod.Name+string(pod.UID)] = true
		mu.Unlock()
		if first {
			gone(Gone{ID: id, Reason: reason})
		}
	}
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, obj any) {
			if pod, ok := obj.(*corev1.Pod); ok {
				if why := ended(pod); why != "" {
					report(pod, why)
				}
			}
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if pod, ok := obj.(*corev1.Pod); ok {
				why := ended(pod)
				if why == "" {
					why = "its Pod " + pod.Name + " was deleted (not by Airlock)"
				}
				report(pod, why)
				// The Pod is gone for good: nothing more to tell of it.
				p.forget(pod.Labels[LabelSandbox])
				mu.Lock()
				delete(told, pod.Name+string(pod.UID))
				mu.Unlock()
			}
		},
	})
	if err != nil {
		return err
	}
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return fmt.Errorf("watching the sandbox Pods of %s: %w", p.Namespace, ctx.Err())
	}
	return nil
}

// ended says why a Pod is over ("" while it is not): evicted, its
// container ended (OOM-killed among the reasons), the node lost.
func ended(pod *corev1.Pod) string {
	if pod.Status.Phase != corev1.PodFailed && pod.Status.Phase != corev1.PodSucceeded {
		return ""
	}
	if pod.Status.Reason != "" { // Evicted, NodeLost, ...
		return fmt.Sprintf("its Pod %s was ended by Kubernetes: %s: %s", pod.Name, pod.Status.Reason, pod.Status.Message)
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if t := cs.State.Terminated; t != nil {
			return fmt.Sprintf("its Pod %s's sandbox ended: %s (exit code %d)", pod.Name, t.Reason, t.ExitCode)
		}
	}
	return fmt.Sprintf("its Pod %s ended (%s)", pod.Name, pod.Status.Phase)
}

// deleting reports whether Delete was asked for the sandbox.
func (p *Pods) deleting(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.deleted[id]
}

func (p *Pods) forget(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.deleted, id)
}
