package kube

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/airlock-sandbox/airlock/internal/envdapi"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// A warm pool of Pods, per template: Pods started ahead of demand, each
// with a sandbox ID of its own and envd awaiting its /init. The lifecycle
// of one:
//
//	fill   the reconciling replica makes the Pods a pool lacks (labelled
//	       LabelWarm, no team), and deletes those of another image (a new
//	       build of the template, or of envd) or that ended;
//	claim  a create takes the oldest ready one: it writes the sandbox's
//	       record (within the team's quota), then takes the Pod by a patch
//	       conditional on the Pod's resourceVersion, which removes LabelWarm
//	       and names the team (of two replicas claiming one Pod, one wins;
//	       the other tries the next), then gives envd its access token and
//	       env through /init (the init key is in the Pod's Secret, not in
//	       the sandbox's files). From then on it is a sandbox like any.
//
// A claim that fails after the patch deletes the Pod; the create then
// makes one as if the pool were empty.

// warmReady returns the template's warm Pods that run image and answer,
// oldest first; with judged (Backend.NodeAgent), only those whose node
// agent has put their policy in force: a claim of one then neither waits
// for the agent nor races its annotation (the claim's patch is conditional
// on the Pod's resourceVersion, which the annotation changes).
func (p *Pods) warmReady(template, image string, judged bool) []*corev1.Pod {
	var out []*corev1.Pod
	for _, pod := range p.listed() {
		if pod.Labels[LabelWarm] != template || pod.DeletionTimestamp != nil || podImage(pod) != image || !podReady(pod) {
			continue
		}
		if judged && (pod.Annotations[AnnotationNetworkApplied] != PodNetworkDigest(pod) || pod.Annotations[AnnotationNetworkError] != "") {
			continue
		}
		out = append(out, pod)
	}
	slices.SortFunc(out, func(a, b *corev1.Pod) int { return a.CreationTimestamp.Compare(b.CreationTimestamp.Time) })
	return out
}

func podImage(pod *corev1.Pod) string {
	if len(pod.Spec.Containers) == 0 {
		return ""
	}
	return pod.Spec.Containers[0].Image
}

func podReady(pod *corev1.Pod) bool {
	if pod.Status.Phase != corev1.PodRunning || net.ParseIP(pod.Status.PodIP) == nil {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// errTaken is a warm Pod another claim took first.
var errTaken = errors.New("claimed by another create")

// claim takes a warm Pod for team, unless another claim changed it since
// the informer saw it (errTaken); it returns the Pod's IP and envd's init
// key.
func (p *Pods) claim(ctx context.Context, pod *corev1.Pod, team, policy string) (net.IP, string, error) {
	meta := map[string]any{
		"resourceVersion": pod.ResourceVersion,
		"labels":          map[string]any{LabelWarm: nil, LabelTeam: team},
	}
	if policy != "" && pod.Annotations[AnnotationNetwork] != policy {
		meta["annotations"] = map[string]any{AnnotationNetwork: policy}
	}
	patch, err := json.Marshal(map[string]any{"metadata": meta})
	if err != nil {
		return nil, "", err
	}
	_, err = p.Client.CoreV1().Pods(p.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return nil, "", errTaken
	}
	if err != nil {
		return nil, "", fmt.Errorf("claiming the warm Pod %s: %w", pod.Name, err)
	}
	sec, err := p.Client.CoreV1().Secrets(p.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		return nil, "", fmt.Errorf("the warm Pod %s's Secret: %w", pod.Name, err)
	}
	key := string(sec.Data[secretInitKey])
	if key == "" {
		return nil, "", fmt.Errorf("the warm Pod %s's Secret holds no init key", pod.Name)
	}
	return net.ParseIP(pod.Status.PodIP), key, nil
}

// initEnvd gives a claimed Pod's envd its identity.
func initEnvd(ctx context.Context, ip net.IP, key string, body envdapi.InitRequest) error {
	raw, err := json.Marshal(body)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	url := "http://" + net.JoinHostPort(ip.String(), strconv.Itoa(envdapi.Port)) + "/init"
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(raw))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("envd /init: %w", err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusNoContent {
		return fmt.Errorf("envd /init: %s", res.Status)
	}
	return nil
}

// claimWarm makes info a sandbox of a warm Pod of t if one is ready: its
// ID becomes the Pod's. It returns the Pod's IP, or nil when no warm Pod
// could be had (the create then makes one); an error only for what a cold
// create would fail with too (the team's quota).
func (b *Backend) claimWarm(ctx context.Context, t Template, info *sandbox.Info, env map[string]string, policy string) (net.IP, error) {
	for _, pod := range b.Pods.warmReady(t.ID, t.Image, b.NodeAgent) {
		id := pod.Labels[LabelSandbox]
		info.ID = id
		if err := b.insert(ctx, *info); err != nil {
			if errors.Is(err, sandbox.ErrLimit) {
				return nil, err
			}
			continue // the ID is taken: a claim of another replica's
		}
		ip, key, err := b.Pods.claim(ctx, pod, info.Owner, policy)
		if err == nil {
			err = initEnvd(ctx, ip, key, envdapi.InitRequest{AccessToken: info.AccessToken, EnvVars: env})
			if err != nil {
				_ = b.Pods.Delete(context.WithoutCancel(ctx), id)
			}
		}
		if err != nil {
			if derr := b.Records.Delete(context.WithoutCancel(ctx), id); derr != nil {
				b.log().Error("deleting the record of a failed claim", "sandbox", id, "err", derr)
			}
			if !errors.Is(err, errTaken) {
				b.log().Warn("claiming a warm Pod", "pod", pod.Name, "err", err)
			}
			continue
		}
		return ip, nil
	}
	return nil, nil
}

// SetPool sets the size of a template's warm pool (0: none); the
// reconciling replica makes or deletes Pods to match.
func (b *Backend) SetPool(template string, size int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.Pools == nil {
		b.Pools = map[string]int{}
	}
	if size <= 0 {
		delete(b.Pools, template)
		return
	}
	b.Pools[template] = size
}

func (b *Backend) poolSize(template string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.Pools[template]
}

// WarmReady counts the template's warm Pods ready to be claimed.
func (b *Backend) WarmReady(ctx context.Context, name string) int {
	t, err := b.Templates(ctx, name)
	if err != nil {
		return 0
	}
	return len(b.Pods.warmReady(t.ID, t.Image, b.NodeAgent))
}

// FillPools makes the warm Pods each pool lacks and deletes the ones it
// should not keep (another image, ended, or beyond its size); the
// reconciling replica calls it.
func (b *Backend) FillPools(ctx context.Context) error {
	b.mu.Lock()
	pools := maps.Clone(b.Pools)
	b.mu.Unlock()
	if len(pools) == 0 {
		return nil
	}
	byTemplate := map[string][]*corev1.Pod{}
	for _, pod := range b.Pods.listed() {
		if t := pod.Labels[LabelWarm]; t != "" && pod.DeletionTimestamp == nil {
			byTemplate[t] = append(byTemplate[t], pod)
		}
	}
	// Warm Pods have the default policy: their node agent applies it while
	// they wait, so a claim that keeps it does not wait for the agent.
	var policy string
	if b.NodeAgent {
		policy = DefaultNetwork
	}
	var errs []error
	for name, size := range pools {
		t, err := b.Templates(ctx, name)
		if err != nil {
			continue // not servable now (its image is being made): later
		}
		keep := 0
		for _, pod := range byTemplate[t.ID] {
			_, why := ended(pod)
			// A Pod its node agent cannot judge (AnnotationNetworkError)
			// would never be claimed.
			if podImage(pod) != t.Image || why != "" || isFatalWait(pod) || pod.Annotations[AnnotationNetworkError] != "" || keep >= size {
				errs = append(errs, b.Pods.Delete(ctx, pod.Labels[LabelSandbox]))
				continue
			}
			keep++
		}
		for ; keep < size; keep++ {
			id := newID()
			err := b.Pods.make(ctx, Spec{ID: id, Template: t.ID, Image: t.Image, CPUs: t.CPUs, MemoryMB: t.MemoryMB, Warm: true, Network: policy,
				Envd: envdapi.Config{SandboxID: id, TemplateID: t.ID, EnvVars: t.EnvVars, DefaultUser: t.DefaultUser,
					DefaultWorkdir: t.DefaultWorkdir, Kernels: t.Kernels, AwaitInit: true, InitKey: newToken()}})
			if err != nil {
				errs = append(errs, fmt.Errorf("warm pool of %s: %w", t.ID, err))
				break // no room now, most likely: the next pass tries again
			}
		}
	}
	return errors.Join(errs...)
}
