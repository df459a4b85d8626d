package kubetest

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// pausePod is a Pod of the stack's own pause image (the cluster reaches no
// registry), under runtimeClass ("" for the default, runc).
func pausePod(name, runtimeClass string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{
				Name: "pause", Image: "localhost/airlock/pause:1", ImagePullPolicy: corev1.PullNever,
			}},
		},
	}
	if runtimeClass != "" {
		p.Spec.RuntimeClassName = &runtimeClass
	}
	return p
}

// TestStack: the stack scripts/kube-stack.sh runs is a real cluster whose
// node runs Pods under runc and, through the RuntimeClass gvisor, under
// gVisor, and refuses a RuntimeClass that does not exist.
func TestStack(t *testing.T) {
	c := Start(t)
	ns := c.Namespace(t)
	ctx := context.Background()
	pods := c.Client.CoreV1().Pods(ns)
	for _, rc := range []string{"", "gvisor"} {
		name := "pause-runc"
		if rc != "" {
			name = "pause-" + rc
		}
		if _, err := pods.Create(ctx, pausePod(name, rc), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		p := c.WaitPod(t, ns, name, 2*time.Minute, corev1.PodRunning)
		if rc == "gvisor" {
			// The container is one runsc runs: its ID is in runsc's list of
			// the shim's root.
			id := strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://")
			out, err := exec.Command("runsc", "--root", c.Dir+"/run/runsc/k8s.io", "list", "-quiet").CombinedOutput()
			if err != nil || !strings.Contains(string(out), id) {
				t.Fatalf("container %s is not in runsc's list: %v\n%s", id, err, out)
			}
		}
	}
	_, err := pods.Create(ctx, pausePod("pause-nosuch", "nosuch"), metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), "nosuch") {
		t.Fatalf("a Pod of an unknown RuntimeClass: %v", err)
	}
}
