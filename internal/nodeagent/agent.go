// Package nodeagent enforces the egress policy of the sandbox Pods of one
// Kubernetes node (`airlock node-agent`, a DaemonSet with the host's
// network): the same rules and DNS filter a box gives its sandboxes
// (netpolicy.NewPods), keyed by each Pod's address on the node's forward
// path, since a gVisor Pod's netstack sends its packets itself and rules
// inside the Pod's namespace would not see them.
//
// The lifecycle of one Pod, as the agent sees it through an informer over
// its node's sandbox Pods:
//
//	has an address -> Open with the policy of its annotation (kube.
//	          AnnotationNetwork; none is the default policy), then the Pod
//	          is annotated with the digest applied (and the error, if the
//	          policy could not be: the Pod is then judged as denying all)
//	annotation changes -> UpdatePod, annotated likewise
//	ends or is deleted -> ClosePod: its elements leave the table
//
// At start the agent lists its node's Pods first and installs the table
// with all of them in one transaction; at stop it leaves the table, so the
// Pods stay judged by their last policy while it restarts.
package nodeagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/airlock-sandbox/airlock/internal/kube"
	"github.com/airlock-sandbox/airlock/internal/netpolicy"
)

// Config configures an Agent.
type Config struct {
	Client kubernetes.Interface
	// Namespace holds the sandbox Pods; Node is this node's name (the
	// DaemonSet passes spec.nodeName).
	Namespace, Node string
	Net             netpolicy.PodConfig
	Logger          *slog.Logger
}

// Agent is a running node agent.
type Agent struct {
	cfg    Config
	log    *slog.Logger
	net    *netpolicy.Network
	lister corelisters.PodNamespaceLister
	queue  chan string // Pod names to reconcile

	mu sync.Mutex
	// applied is the policy digest installed per Pod name, and the Pod's
	// UID (a new Pod of the same name is another sandbox's).
	applied map[string]appliedPolicy
}

type appliedPolicy struct {
	uid     types.UID
	id      string // the sandbox's
	digest  string
	problem string
}

// Start lists the node's sandbox Pods, installs the table with them and
// starts following them; it returns once the table is in place. The agent
// stops when ctx ends.
func Start(ctx context.Context, cfg Config) (*Agent, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Node == "" {
		return nil, errors.New("node agent: no node name (the DaemonSet passes spec.nodeName as NODE_NAME)")
	}
	f := informers.NewSharedInformerFactoryWithOptions(cfg.Client, time.Minute,
		informers.WithNamespace(cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = kube.LabelSandbox
			o.FieldSelector = "spec.nodeName=" + cfg.Node
		}))
	inf := f.Core().V1().Pods().Informer()
	a := &Agent{cfg: cfg, log: cfg.Logger, queue: make(chan string, 4096), applied: map[string]appliedPolicy{},
		lister: f.Core().V1().Pods().Lister().Pods(cfg.Namespace)}
	enqueue := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if pod, ok := obj.(*corev1.Pod); ok {
			a.queue <- pod.Name
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
		DeleteFunc: enqueue,
	}); err != nil {
		return nil, err
	}
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil, fmt.Errorf("node agent: listing the sandbox Pods of node %s: %w", cfg.Node, ctx.Err())
	}
	pods, err := a.lister.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	var initial []netpolicy.Pod
	for _, pod := range pods {
		if want, ok := a.desired(pod); ok {
			if err := netpolicy.CheckPod(want.pod); err != nil {
				want.problem = err.Error()
				want.pod.Policy = netpolicy.Policy{DenyOut: []string{netpolicy.AllTraffic}}
			}
			initial = append(initial, want.pod)
			a.applied[pod.Name] = appliedPolicy{uid: pod.UID, id: want.pod.ID, digest: want.digest, problem: want.problem}
		}
	}
	if a.net, err = netpolicy.NewPods(cfg.Net, initial); err != nil {
		return nil, fmt.Errorf("node agent: %w", err)
	}
	a.log.Info("node agent: the table is in place", "node", cfg.Node, "pods", len(initial), "dns_port", a.net.DNSPort())
	go a.run(ctx)
	return a, nil
}

// Network is the agent's netpolicy.Network (tests read Pods and policies).
func (a *Agent) Network() *netpolicy.Network { return a.net }

// want is what a Pod should be judged by.
type want struct {
	pod     netpolicy.Pod
	digest  string
	problem string // why the Pod's own policy could not be had
}

// desired is the policy a live Pod with an address asks for; false for a
// Pod the agent should not (or not yet) judge.
func (a *Agent) desired(pod *corev1.Pod) (*want, bool) {
	if pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return nil, false
	}
	addr, err := netip.ParseAddr(pod.Status.PodIP)
	if err != nil || pod.Labels[kube.LabelSandbox] == "" {
		return nil, false
	}
	w := &want{pod: netpolicy.Pod{ID: pod.Labels[kube.LabelSandbox], Addr: addr}, digest: kube.PodNetworkDigest(pod)}
	p, err := kube.ParsePodPolicy(pod)
	if err == nil {
		err = p.Validate()
	}
	for _, ip := range pod.Status.PodIPs {
		if a, perr := netip.ParseAddr(ip.IP); perr == nil && a.Is6() && err == nil {
			err = fmt.Errorf("the Pod has the IPv6 address %s: the node agent judges IPv4 only, so a dual-stack Pod's IPv6 egress would go unjudged", a)
		}
	}
	if err != nil {
		// Judged as denying everything: never open what was not asked.
		w.problem = err.Error()
		p = netpolicy.Policy{DenyOut: []string{netpolicy.AllTraffic}}
	}
	w.pod.Policy = p
	return w, true
}

// run reconciles the Pods the informer reports, one at a time.
func (a *Agent) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			if err := a.net.Close(); err != nil {
				a.log.Warn("node agent: stopping the DNS forwarder", "err", err)
			}
			return
		case name := <-a.queue:
			if err := a.reconcile(ctx, name); err != nil && ctx.Err() == nil {
				a.log.Warn("node agent: a Pod's policy; trying again", "pod", name, "err", err)
				time.AfterFunc(time.Second, func() { a.queue <- name })
			}
		}
	}
}

// reconcile brings the table in line with one Pod and tells the Pod what
// it is judged by.
func (a *Agent) reconcile(ctx context.Context, name string) error {
	pod, err := a.lister.Get(name)
	if apierrors.IsNotFound(err) {
		return a.close(name)
	}
	if err != nil {
		return err
	}
	w, ok := a.desired(pod)
	a.mu.Lock()
	cur, had := a.applied[name]
	a.mu.Unlock()
	if had && (!ok || cur.uid != pod.UID || cur.id != w.pod.ID) {
		if err := a.close(name); err != nil {
			return err
		}
		had = false
	}
	if !ok {
		return nil
	}
	if !had || cur.digest != w.digest {
		if err := a.apply(w, had); err != nil {
			return err
		}
		a.mu.Lock()
		a.applied[name] = appliedPolicy{uid: pod.UID, id: w.pod.ID, digest: w.digest, problem: w.problem}
		a.mu.Unlock()
	} else {
		w.problem = cur.problem
	}
	return a.acknowledge(ctx, pod, w)
}

// apply opens (or, if open, updates) the Pod with its policy; one the
// node cannot enforce is applied as denying all, and w.problem says why.
func (a *Agent) apply(w *want, open bool) error {
	do := func(p netpolicy.Policy) error {
		if open {
			return a.net.UpdatePod(w.pod.ID, p)
		}
		pod := w.pod
		pod.Policy = p
		return a.net.Open(pod)
	}
	if !open {
		a.freeAddr(w.pod)
	}
	err := do(w.pod.Policy)
	if errors.Is(err, netpolicy.ErrPodPolicy) || errors.Is(err, netpolicy.ErrInvalidPolicy) {
		w.problem = err.Error()
		err = do(netpolicy.Policy{DenyOut: []string{netpolicy.AllTraffic}})
	}
	return err
}

// freeAddr closes a Pod gone from the node whose address a new Pod has
// now, should its delete not have been seen yet.
func (a *Agent) freeAddr(p netpolicy.Pod) {
	for id, addr := range a.net.Pods() {
		if addr != p.Addr || id == p.ID {
			continue
		}
		if old, err := a.lister.Get(kube.PodName(id)); err == nil && old.Status.PodIP == p.Addr.String() && old.DeletionTimestamp == nil {
			continue // still there: Open will say so
		}
		_ = a.close(kube.PodName(id))
		_ = a.net.ClosePod(id)
	}
}

// close stops judging the Pod of that name.
func (a *Agent) close(name string) error {
	a.mu.Lock()
	cur, had := a.applied[name]
	delete(a.applied, name)
	a.mu.Unlock()
	if !had {
		return nil
	}
	return a.net.ClosePod(cur.id)
}

// acknowledge annotates the Pod with the digest applied and the problem, if
// they differ from what it says.
func (a *Agent) acknowledge(ctx context.Context, pod *corev1.Pod, w *want) error {
	if pod.Annotations[kube.AnnotationNetworkApplied] == w.digest && pod.Annotations[kube.AnnotationNetworkError] == w.problem {
		return nil
	}
	var problem any
	if w.problem != "" {
		problem = w.problem
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{
		kube.AnnotationNetworkApplied: w.digest, kube.AnnotationNetworkError: problem,
	}}})
	if err != nil {
		return err
	}
	_, err = a.cfg.Client.CoreV1().Pods(a.cfg.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
