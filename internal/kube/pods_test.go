package kube_test

import (
	"context"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/airlock-sandbox/airlock/internal/envdapi"
	"github.com/airlock-sandbox/airlock/internal/kube"
	"github.com/airlock-sandbox/airlock/internal/kube/kubetest"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// TestSandboxPod: a sandbox as a Pod under gVisor, its image pulled by the
// node from Airlock's registry, runs commands through
// envd at the Pod's IP with its access token, and a delete leaves neither
// its Pod nor its Secret; a Pod that cannot start fails Create with the
// reason and leaves nothing either; a Pod deleted behind Airlock's back is
// reported by Watch, Airlock's own deletes are not.
func TestSandboxPod(t *testing.T) {
	c := kubetest.Start(t)
	ns := c.Namespace(t)
	ctx := context.Background()
	ref := kubetest.BaseImage(t)
	pods := &kube.Pods{Client: c.Client, Namespace: ns, RuntimeClass: "gvisor", Ready: time.Minute}
	goneCh := make(chan kube.Gone, 10)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	if err := pods.Watch(wctx, func(g kube.Gone) { goneCh <- g }); err != nil {
		t.Fatal(err)
	}
	spec := kube.Spec{ID: "sbkube1", Team: "blue", Template: "base", Image: ref, CPUs: 1, MemoryMB: 512,
		Envd: envdapi.Config{SandboxID: "sbkube1", TemplateID: "base", AccessToken: "the-token", DefaultUser: "user"}}
	start := time.Now()
	sb, err := pods.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Create: Pod running and envd answering in %s", time.Since(start).Round(time.Millisecond))
	tr := kube.Transport(sb.IP, envdapi.Port)
	out, code := testenv.RunCommand(t, tr, "the-token", "echo hello from $(whoami); echo $E2B_SANDBOX_ID; dmesg 2>/dev/null | head -1")
	if code != 0 || !strings.Contains(out, "hello from user\nsbkube1\n") || !strings.Contains(out, "gVisor") {
		t.Fatalf("command in the Pod: exit %d, %q", code, out)
	}
	p, err := c.Client.CoreV1().Pods(ns).Get(ctx, sb.Pod, metav1.GetOptions{})
	if err != nil || p.Labels[kube.LabelTeam] != "blue" || p.Spec.Containers[0].Resources.Limits.Memory().Value() != 512<<20 {
		t.Fatalf("the Pod: %v %+v", err, p)
	}

	if err := pods.Delete(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	gone(t, c, ns, "airlock-sbkube1")

	// An image the node does not hold and may not pull: a clear error
	// naming why, within the wait, and nothing left.
	bad := spec
	bad.ID, bad.Image, bad.PullNever = "sbkube2", "localhost/airlock/no-such-image:1", true
	_, err = pods.Create(ctx, bad)
	if err == nil || !strings.Contains(err.Error(), "ErrImageNeverPull") {
		t.Fatalf("a Pod of an image the node lacks: %v", err)
	}
	gone(t, c, ns, "airlock-sbkube2")

	// A Pod deleted behind Airlock's back is reported, with the reason;
	// Airlock's own deletes above were not.
	third := spec
	third.ID = "sbkube3"
	if _, err := pods.Create(ctx, third); err != nil {
		t.Fatal(err)
	}
	if err := c.Client.CoreV1().Pods(ns).Delete(ctx, "airlock-sbkube3", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case g := <-goneCh:
		if g.ID != "sbkube3" || !strings.Contains(g.Reason, "deleted (not by Airlock)") {
			t.Fatalf("reported %+v, want sbkube3's Pod deleted", g)
		}
	case <-time.After(time.Minute):
		t.Fatal("a Pod deleted behind Airlock's back was not reported")
	}
	gone(t, c, ns, "airlock-sbkube3")
	select {
	case g := <-goneCh:
		t.Fatalf("reported more: %+v", g)
	case <-time.After(500 * time.Millisecond):
	}
}

// gone waits until a sandbox's Pod and Secret are both deleted.
func gone(t *testing.T, c *kubetest.Cluster, ns, name string) {
	t.Helper()
	testenv.Eventually(t, time.Minute, name+" deleted", func() bool {
		_, perr := c.Client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		_, serr := c.Client.CoreV1().Secrets(ns).Get(context.Background(), name, metav1.GetOptions{})
		return apierrors.IsNotFound(perr) && apierrors.IsNotFound(serr)
	})
}
