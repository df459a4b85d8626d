package kube

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/airlock-sandbox/airlock/internal/lifecycle"
)

// Gone is a sandbox whose Pod ended without a Delete of Airlock's: deleted
// behind its back, evicted, failed, or its envd ended. The manager records
// it as a killed sandbox with Reason, never as one that silently stops
// answering.
type Gone struct {
	ID     string
	Reason string
	// Kill is the lifecycle kill reason: lifecycle.KillOOM,
	// lifecycle.KillExited or lifecycle.KillPodLost.
	Kill string
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
	report := func(pod *corev1.Pod, kill, reason string) {
		id := pod.Labels[LabelSandbox]
		if id == "" || p.deleting(id) {
			return
		}
		mu.Lock()
		first := !told[pod.Name+string(pod.UID)]
		told[pod.Name+string(pod.UID)] = true
		mu.Unlock()
		if first {
			gone(Gone{ID: id, Reason: reason, Kill: kill})
		}
	}
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, obj any) {
			if pod, ok := obj.(*corev1.Pod); ok {
				if kill, why := ended(pod); why != "" {
					report(pod, kill, why)
				}
			}
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if pod, ok := obj.(*corev1.Pod); ok {
				kill, why := ended(pod)
				if why == "" {
					kill, why = deletedBehindBack(pod.Name)
				}
				report(pod, kill, why)
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
	p.mu.Lock()
	p.lister = f.Core().V1().Pods().Lister().Pods(p.Namespace)
	p.mu.Unlock()
	return nil
}

// deletedBehindBack is the kill reason and words for a Pod deleted by
// someone other than Airlock.
func deletedBehindBack(name string) (kill, why string) {
	return lifecycle.KillPodLost, "its Pod " + name + " was deleted (not by Airlock)"
}

// IP is the IP of a sandbox's running Pod: from Watch's informer, else
// (before the informer has it, or without Watch) from the API server.
func (p *Pods) IP(ctx context.Context, id string) (net.IP, error) {
	pod, err := p.get(ctx, id)
	if err != nil {
		return nil, err
	}
	if _, why := ended(pod); why != "" {
		return nil, errors.New(why)
	}
	ip := net.ParseIP(pod.Status.PodIP)
	if pod.Status.Phase != corev1.PodRunning || ip == nil {
		return nil, fmt.Errorf("its Pod %s is not running (%s)", pod.Name, pod.Status.Phase)
	}
	return ip, nil
}

// get is a sandbox's Pod, from the informer or the API server.
func (p *Pods) get(ctx context.Context, id string) (*corev1.Pod, error) {
	p.mu.Lock()
	l := p.lister
	p.mu.Unlock()
	if l != nil {
		if pod, err := l.Get(PodName(id)); err == nil {
			return pod, nil
		}
	}
	pod, err := p.Client.CoreV1().Pods(p.Namespace).Get(ctx, PodName(id), metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("its Pod: %w", err)
	}
	return pod, nil
}

// listed returns the namespace's sandbox Pods by sandbox ID, as Watch's
// informer has them (nil before Watch).
func (p *Pods) listed() map[string]*corev1.Pod {
	p.mu.Lock()
	l := p.lister
	p.mu.Unlock()
	if l == nil {
		return nil
	}
	pods, err := l.List(labels.Everything())
	if err != nil {
		return nil
	}
	out := make(map[string]*corev1.Pod, len(pods))
	for _, pod := range pods {
		if id := pod.Labels[LabelSandbox]; id != "" {
			out[id] = pod
		}
	}
	return out
}

// ended says why a Pod is over (why "" while it is not): evicted, its
// container ended (OOM-killed among the reasons), the node lost; kill is
// the lifecycle kill reason it makes.
func ended(pod *corev1.Pod) (kill, why string) {
	if pod.Status.Phase != corev1.PodFailed && pod.Status.Phase != corev1.PodSucceeded {
		return "", ""
	}
	if pod.Status.Reason != "" { // Evicted, NodeLost, ...
		return lifecycle.KillPodLost, fmt.Sprintf("its Pod %s was ended by Kubernetes: %s: %s", pod.Name, pod.Status.Reason, pod.Status.Message)
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if t := cs.State.Terminated; t != nil {
			kill := lifecycle.KillExited
			if t.Reason == "OOMKilled" {
				kill = lifecycle.KillOOM
			}
			return kill, fmt.Sprintf("its Pod %s's sandbox ended: %s (exit code %d)", pod.Name, t.Reason, t.ExitCode)
		}
	}
	return lifecycle.KillPodLost, fmt.Sprintf("its Pod %s ended (%s)", pod.Name, pod.Status.Phase)
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
