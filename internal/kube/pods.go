// Package kube runs sandboxes as Kubernetes Pods (issue 24): one Pod per
// sandbox, in one namespace, its isolation chosen by a RuntimeClass (gVisor
// by default), envd as the Pod's first process, reached at the Pod's IP.
//
// The lifecycle of one sandbox Pod:
//
//	Create -> the Pod "airlock-<id>" is made (labels: sandbox, team,
//	          template), then the Secret holding envd's config (its access
//	          token among it), owned by the Pod so that the Pod's deletion
//	          takes it too; Create returns once the Pod runs and envd answers
//	          /health at the Pod's IP. A failure on the way deletes what was
//	          made: no Pod, no Secret is left.
//	Transport -> requests to envd (port 49983) or the interpreter (49999)
//	          over the Pod network.
//	Delete -> the Pod, at once (no grace period: a sandbox is killed, not
//	          drained), and with it the Secret.
package kube

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"

	"github.com/airlock-sandbox/airlock/internal/envdapi"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// ConfigFile is where envd finds its config in a sandbox Pod (a Secret
// mounted read-only).
const ConfigFile = "/run/airlock-config/config.json"

// Labels of a sandbox Pod.
const (
	LabelSandbox  = "airlock.dev/sandbox"
	LabelTeam     = "airlock.dev/team"
	LabelTemplate = "airlock.dev/template"
	// LabelWarm marks a Pod of a template's warm pool (its value the
	// template) until a create claims it.
	LabelWarm = "airlock.dev/warm"
)

// secretInitKey is the config Secret's key holding envd's InitKey.
const secretInitKey = "init-key"

// Pods makes and removes sandbox Pods in one namespace.
type Pods struct {
	Client    kubernetes.Interface
	Namespace string
	// RuntimeClass names the Pods' RuntimeClass ("" for the node's
	// default runtime).
	RuntimeClass string
	// Ready bounds how long Create waits for the Pod to run and envd to
	// answer (default 2 minutes).
	Ready time.Duration
	// Unschedulable is how long Create lets the scheduler find no node
	// before it fails with the scheduler's words (default 10 s): a Pod
	// waits for a node to free up that long, not for the whole Ready.
	Unschedulable time.Duration
	// CPURequest and MemoryRequest are the fractions of a sandbox's vCPUs
	// and memory its Pod requests (0: DefaultCPURequest,
	// DefaultMemoryRequest); the limits are the whole. Sandboxes idle most
	// of their lives, as on one box, where nothing is reserved.
	CPURequest, MemoryRequest float64

	mu sync.Mutex
	// deleted holds the sandboxes Delete was asked for, until Watch sees
	// their Pods go: their end is Airlock's, not news.
	deleted map[string]bool
	// lister reads Watch's informer (nil before Watch).
	lister corelisters.PodNamespaceLister
}

// The default fractions of a sandbox's vCPUs and memory its Pod requests.
const (
	DefaultCPURequest    = 0.05
	DefaultMemoryRequest = 0.25
)

// Spec is one sandbox Pod.
type Spec struct {
	ID, Team, Template string
	// Image is the template's image (TemplateImage), by a reference the
	// node can resolve; PullNever makes the node use only what it holds.
	Image     string
	PullNever bool
	// Warm makes the Pod one of its template's warm pool: labelled
	// LabelWarm, no team yet, envd awaiting its /init (Envd.AwaitInit and
	// Envd.InitKey).
	Warm     bool
	CPUs     int
	MemoryMB int
	// Envd is envd's config; its listeners are set here (TCP on the Pod's
	// network).
	Envd envdapi.Config
	// Network is the Pod's egress policy for its node agent
	// (AnnotationNetwork; "" for none: Backend.NodeAgent off).
	Network string
}

// Sandbox is a sandbox Pod that runs.
type Sandbox struct {
	ID, Pod string
	IP      net.IP
}

// PodName is the name of sandbox id's Pod (and of its config Secret).
func PodName(id string) string { return "airlock-" + id }

func (p *Pods) readyTimeout() time.Duration {
	if p.Ready == 0 {
		return 2 * time.Minute
	}
	return p.Ready
}

// Create makes the sandbox's Pod and its config Secret and waits until
// envd answers; on failure it removes both.
func (p *Pods) Create(ctx context.Context, s Spec) (sb Sandbox, err error) {
	if err := p.make(ctx, s); err != nil {
		return Sandbox{}, err
	}
	defer func() {
		if err != nil {
			_ = p.Delete(context.WithoutCancel(ctx), s.ID)
		}
	}()
	wctx, cancel := context.WithTimeout(ctx, p.readyTimeout())
	defer cancel()
	name := PodName(s.ID)
	ip, err := p.waitRunning(wctx, name)
	if err != nil {
		return Sandbox{}, fmt.Errorf("sandbox %s: %w", s.ID, err)
	}
	if err := waitHealth(wctx, ip); err != nil {
		return Sandbox{}, fmt.Errorf("sandbox %s: envd at %s: %w", s.ID, ip, err)
	}
	return Sandbox{ID: s.ID, Pod: name, IP: ip}, nil
}

// make makes the sandbox's Pod and then its config Secret (owned by the
// Pod); on failure it removes what it made.
func (p *Pods) make(ctx context.Context, s Spec) (err error) {
	name := PodName(s.ID)
	cfg := s.Envd
	cfg.Listen = []string{"tcp:0.0.0.0:" + strconv.Itoa(envdapi.Port)}
	cfg.InterpListen = []string{"tcp:0.0.0.0:" + strconv.Itoa(envdapi.InterpPort)}
	raw, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	limits := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewQuantity(int64(s.CPUs), resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(int64(s.MemoryMB)<<20, resource.BinarySI),
	}
	cpuReq, memReq := cmp.Or(p.CPURequest, DefaultCPURequest), cmp.Or(p.MemoryRequest, DefaultMemoryRequest)
	requests := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewMilliQuantity(max(int64(float64(s.CPUs)*1000*cpuReq), 1), resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(max(int64(float64(int64(s.MemoryMB)<<20)*memReq), 1<<20), resource.BinarySI),
	}
	pull := corev1.PullIfNotPresent
	if s.PullNever {
		pull = corev1.PullNever
	}
	no := false
	grace := int64(0)
	mode := int32(0o400)
	labels := map[string]string{LabelSandbox: s.ID, LabelTemplate: s.Template}
	if s.Team != "" {
		labels[LabelTeam] = s.Team
	}
	if s.Warm {
		labels[LabelWarm] = s.Template
	}
	var annotations map[string]string
	if s.Network != "" {
		annotations = map[string]string{AnnotationNetwork: s.Network}
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: annotations},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  &no,
			EnableServiceLinks:            &no,
			TerminationGracePeriodSeconds: &grace,
			DNSPolicy:                     corev1.DNSDefault,
			Containers: []corev1.Container{{
				Name: "sandbox", Image: s.Image, ImagePullPolicy: pull,
				Resources:    corev1.ResourceRequirements{Requests: requests, Limits: limits},
				VolumeMounts: []corev1.VolumeMount{{Name: "config", MountPath: "/run/airlock-config", ReadOnly: true}},
				// Ready once envd answers: a warm Pod is claimed only then.
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/health", Port: intstr.FromInt32(envdapi.Port)}},
					PeriodSeconds: 1, FailureThreshold: 1,
				},
			}},
			Volumes: []corev1.Volume{{Name: "config", VolumeSource: corev1.VolumeSource{
				Secret: &corev1.SecretVolumeSource{SecretName: name, DefaultMode: &mode, Items: []corev1.KeyToPath{{Key: "config.json", Path: "config.json"}}},
			}}},
		},
	}
	if p.RuntimeClass != "" {
		pod.Spec.RuntimeClassName = &p.RuntimeClass
	}
	made, err := p.Client.CoreV1().Pods(p.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if apierrors.IsForbidden(err) && strings.Contains(err.Error(), "exceeded quota") {
		// The namespace's ResourceQuota: the cluster's operator's limit,
		// answered as a used-up quota is.
		return fmt.Errorf("%w: sandbox %s: the namespace's quota refuses its Pod: %w", sandbox.ErrLimit, s.ID, err)
	}
	if err != nil {
		return fmt.Errorf("sandbox %s: creating its Pod: %w", s.ID, err)
	}
	defer func() {
		if err != nil {
			_ = p.Delete(context.WithoutCancel(ctx), s.ID)
		}
	}()
	// Owned by the Pod: deleting the Pod deletes the token with it. The
	// init key is beside the config, for the replica that claims a warm
	// Pod (envd reads only config.json).
	data := map[string][]byte{"config.json": raw}
	if cfg.InitKey != "" {
		data[secretInitKey] = []byte(cfg.InitKey)
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{LabelSandbox: s.ID},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: name, UID: made.UID}}},
		Data: data,
	}
	if _, err := p.Client.CoreV1().Secrets(p.Namespace).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("sandbox %s: creating its config Secret: %w", s.ID, err)
	}
	return nil
}

// waitRunning waits until the Pod runs with an IP, or fails with what
// the Pod says is wrong (an image it cannot have, a container that ended,
// no node for it for Unschedulable).
func (p *Pods) waitRunning(ctx context.Context, name string) (net.IP, error) {
	var unschedulableSince time.Time
	for {
		pod, err := p.Client.CoreV1().Pods(p.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("its Pod: %w", err)
		}
		switch pod.Status.Phase {
		case corev1.PodRunning:
			if ip := net.ParseIP(pod.Status.PodIP); ip != nil {
				return ip, nil
			}
		case corev1.PodFailed, corev1.PodSucceeded:
			return nil, fmt.Errorf("its Pod ended (%s): %s", pod.Status.Phase, podProblem(pod))
		}
		if why := podProblem(pod); why != "" && isFatalWait(pod) {
			return nil, fmt.Errorf("its Pod cannot start: %s", why)
		}
		if why := unschedulable(pod); why == "" {
			unschedulableSince = time.Time{}
		} else if unschedulableSince.IsZero() {
			unschedulableSince = time.Now()
		} else if time.Since(unschedulableSince) >= cmp.Or(p.Unschedulable, 10*time.Second) {
			return nil, &NoCapacityError{Reason: why}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("its Pod did not run in time (phase %s; %s): %w", pod.Status.Phase, podProblem(pod), ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// podProblem is what a Pod's container says keeps it from running.
func podProblem(pod *corev1.Pod) string {
	for _, cs := range pod.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil && w.Reason != "" {
			return w.Reason + ": " + w.Message
		}
		if t := cs.State.Terminated; t != nil {
			return fmt.Sprintf("%s (exit %d): %s", t.Reason, t.ExitCode, t.Message)
		}
	}
	for _, c := range pod.Status.Conditions {
		if c.Status == corev1.ConditionFalse && c.Message != "" {
			return c.Reason + ": " + c.Message
		}
	}
	return ""
}

// NoCapacityError is a sandbox Pod no node could take: the API answers 503
// with Retry-After, since capacity comes back as sandboxes end (or nodes
// are added).
type NoCapacityError struct{ Reason string }

func (e *NoCapacityError) Error() string {
	return "no node can run the sandbox's Pod now: " + e.Reason
}

// RetryAfter is when trying again makes sense.
func (e *NoCapacityError) RetryAfter() time.Duration { return 5 * time.Second }

// unschedulable is the scheduler's words when it found no node for the
// Pod ("" otherwise).
func unschedulable(pod *corev1.Pod) string {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return c.Message
		}
	}
	return ""
}

// isFatalWait: the container waits for something that will not come by
// itself.
func isFatalWait(pod *corev1.Pod) bool {
	for _, cs := range pod.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil {
			switch w.Reason {
			case "ErrImageNeverPull", "InvalidImageName", "ErrImagePull", "ImagePullBackOff", "CreateContainerConfigError", "CreateContainerError", "RunContainerError":
				return true
			}
		}
	}
	return false
}

// waitHealth polls envd's /health at ip until it answers 2xx.
func waitHealth(ctx context.Context, ip net.IP) error {
	url := "http://" + net.JoinHostPort(ip.String(), strconv.Itoa(envdapi.Port)) + "/health"
	c := &http.Client{Timeout: 2 * time.Second}
	var last error
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		res, err := c.Do(req)
		if err == nil {
			res.Body.Close()
			if res.StatusCode/100 == 2 {
				return nil
			}
			err = fmt.Errorf("status %d", res.StatusCode)
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("no answer in time (last: %v): %w", last, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Transport reaches a sandbox Pod's envd (or, for port, another port of it)
// over the Pod network: requests' URLs name any host; it dials ip:port.
func Transport(ip net.IP, port int) http.RoundTripper {
	addr := net.JoinHostPort(ip.String(), strconv.Itoa(port))
	d := &net.Dialer{Timeout: 5 * time.Second}
	return &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "tcp", addr)
		},
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
}

// Delete removes a sandbox's Pod (and so its Secret) at once; a Pod that
// is gone already is no error.
func (p *Pods) Delete(ctx context.Context, id string) error {
	p.mu.Lock()
	if p.deleted == nil {
		p.deleted = map[string]bool{}
	}
	p.deleted[id] = true
	p.mu.Unlock()
	zero := int64(0)
	bg := metav1.DeletePropagationBackground
	err := p.Client.CoreV1().Pods(p.Namespace).Delete(ctx, PodName(id), metav1.DeleteOptions{GracePeriodSeconds: &zero, PropagationPolicy: &bg})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("sandbox %s: deleting its Pod: %w", id, err)
	}
	// The Secret goes with its owner; deleted here too, so that nothing
	// waits on the garbage collector.
	err = p.Client.CoreV1().Secrets(p.Namespace).Delete(ctx, PodName(id), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("sandbox %s: deleting its config Secret: %w", id, err)
	}
	return nil
}
