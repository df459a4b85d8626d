package kube

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/airlock-sandbox/airlock/internal/netpolicy"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// The egress policy of a sandbox Pod is a conversation through the Pod's
// annotations between the replica that makes or changes the sandbox and the
// node agent (internal/nodeagent) of the Pod's node, which enforces it:
//
//	replica: AnnotationNetwork = the policy (netpolicy.Policy as JSON)
//	agent:   applies it on the node, then AnnotationNetworkApplied = its
//	         NetworkDigest, and AnnotationNetworkError = why not, if it
//	         could not (the Pod's traffic is then judged as denying all)
//	replica: a create or a network update returns once the digest of what
//	         it wrote is applied (Backend.NodeAgent), failing with the
//	         agent's error or, with no answer, after NetworkWait.
//
// Nothing runs in a sandbox before its create returns (a warm Pod's envd
// awaits its /init), so no code of the sandbox's ever runs unjudged.
const (
	AnnotationNetwork        = "airlock.dev/network"
	AnnotationNetworkApplied = "airlock.dev/network-applied"
	AnnotationNetworkError   = "airlock.dev/network-error"
)

// DefaultNetwork is AnnotationNetwork's value for the default policy
// (private ranges closed, the rest open): what podPolicy gives a sandbox
// that asks for nothing, and what a Pod without the annotation has.
const DefaultNetwork = "{}"

// NetworkWait bounds how long a create or a network update waits for the
// node agent (Backend.NodeAgent).
const NetworkWait = 10 * time.Second

// NetworkDigest names one value of AnnotationNetwork.
func NetworkDigest(value string) string {
	sum := sha256.Sum256([]byte(value))
	return hex.EncodeToString(sum[:8])
}

// podPolicy is the policy of a sandbox of info, as a Pod's annotation.
// Rules and an egress proxy need the box's egress proxy.
func podPolicy(info sandbox.Info) (string, error) {
	p := sandbox.PolicyOf(info)
	if len(p.Rules) > 0 || p.EgressProxy != nil {
		return "", errNotSupported("network rules and an egress proxy")
	}
	if err := p.Validate(); err != nil {
		return "", fmt.Errorf("%w: %w", sandbox.ErrInvalid, err)
	}
	raw, err := json.Marshal(p)
	return string(raw), err
}

// ParsePodPolicy reads AnnotationNetwork; a Pod without it has the default
// policy (private ranges closed, the rest open).
func ParsePodPolicy(pod *corev1.Pod) (netpolicy.Policy, error) {
	var p netpolicy.Policy
	raw, ok := pod.Annotations[AnnotationNetwork]
	if !ok {
		return p, nil
	}
	if err := json.Unmarshal([]byte(raw), &p); err != nil {
		return netpolicy.Policy{}, fmt.Errorf("annotation %s: %w", AnnotationNetwork, err)
	}
	return p, nil
}

// PodNetworkDigest is the digest of the policy a Pod asks for (its
// AnnotationNetwork, or the default's).
func PodNetworkDigest(pod *corev1.Pod) string {
	v, ok := pod.Annotations[AnnotationNetwork]
	if !ok {
		v = DefaultNetwork
	}
	return NetworkDigest(v)
}

// waitNetwork waits until the node agent of the Pod of sandbox id applied
// the policy whose digest is want.
func (p *Pods) waitNetwork(ctx context.Context, id, want string) error {
	ctx, cancel := context.WithTimeout(ctx, NetworkWait)
	defer cancel()
	for {
		pod, err := p.get(ctx, id)
		if err != nil {
			return fmt.Errorf("sandbox %s: %w", id, err)
		}
		if pod.Annotations[AnnotationNetworkApplied] == want {
			if why := pod.Annotations[AnnotationNetworkError]; why != "" {
				return fmt.Errorf("%w: sandbox %s: the node agent of %s could not apply the network policy: %s", sandbox.ErrInvalid, id, pod.Spec.NodeName, why)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("sandbox %s: no node agent applied its network policy on node %q within %v (does the airlock-node-agent DaemonSet run there?)", id, pod.Spec.NodeName, NetworkWait)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// setNetwork sets the policy of sandbox id's Pod (AnnotationNetwork).
func (p *Pods) setNetwork(ctx context.Context, id, policy string) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{AnnotationNetwork: policy}}})
	if err != nil {
		return err
	}
	if _, err := p.Client.CoreV1().Pods(p.Namespace).Patch(ctx, PodName(id), types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("sandbox %s: setting its network policy: %w", id, err)
	}
	return nil
}
