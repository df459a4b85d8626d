package kube_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/airlock-sandbox/airlock/internal/kube"
	"github.com/airlock-sandbox/airlock/internal/kube/kubetest"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// TestCreateFaults: on the real cluster, each way a sandbox Pod cannot be
// had is a create error that says why, within the create's bounds, and
// leaves no Pod, Secret or record:
//   - a RuntimeClass the cluster lacks;
//   - an image no node can pull;
//   - the namespace's ResourceQuota refusing the Pod (429: ErrLimit);
//   - no node able to take it (here more vCPUs than any node has; a
//     NotReady node is the same to the scheduler): 503 with Retry-After.
func TestCreateFaults(t *testing.T) {
	c := kubetest.Start(t)
	ctx := context.Background()
	ref := kubetest.BaseImage(t)
	st, err := store.OpenSQLite(filepath.Join(t.TempDir(), "airlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	backend := func(ns, runtimeClass, image string, cpus int) *kube.Backend {
		return &kube.Backend{
			Pods:    &kube.Pods{Client: c.Client, Namespace: ns, RuntimeClass: runtimeClass, Ready: time.Minute, Unschedulable: 3 * time.Second, CPURequest: 1},
			Records: st,
			Templates: func(context.Context, string) (kube.Template, error) {
				return kube.Template{ID: "base", Alias: "base", Image: image, CPUs: cpus, MemoryMB: 256, DefaultUser: "user"}, nil
			},
		}
	}
	quotaNS := c.Namespace(t)
	zero := resource.MustParse("0")
	if _, err := c.Client.CoreV1().ResourceQuotas(quotaNS).Create(ctx, &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Name: "no-pods"},
		Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourcePods: zero}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, ns string
		b        *kube.Backend
		want     string
		is       error
		within   time.Duration
	}{
		{"unknown RuntimeClass", "", backend("", "no-such-class", ref, 1), "RuntimeClass", nil, 30 * time.Second},
		{"image no node can pull", "", backend("", "gvisor", "127.0.0.1:1/airlock/none:x", 1), "its Pod cannot start", nil, 90 * time.Second},
		{"namespace quota", quotaNS, backend(quotaNS, "gvisor", ref, 1), "exceeded quota", sandbox.ErrLimit, 30 * time.Second},
		{"no node can take it", "", backend("", "gvisor", ref, 4096), "Insufficient cpu", nil, 30 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ns := tc.ns
			if ns == "" {
				ns = c.Namespace(t)
				tc.b.Pods.Namespace = ns
			}
			start := time.Now()
			_, err := tc.b.Create(ctx, sandbox.CreateRequest{Template: "base", Owner: "team", Timeout: time.Minute})
			took := time.Since(start)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("create: %v, want an error naming %q", err, tc.want)
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Fatalf("create: %v, want %v", err, tc.is)
			}
			var nc *kube.NoCapacityError
			if tc.name == "no node can take it" && (!errors.As(err, &nc) || nc.RetryAfter() <= 0) {
				t.Fatalf("create: %T %v, want a NoCapacityError", err, err)
			}
			if took > tc.within {
				t.Fatalf("create failed after %s, want within %s", took, tc.within)
			}
			t.Logf("%s: %v (%s)", tc.name, err, took.Round(time.Millisecond))
			if recs, _ := st.List(ctx); len(recs) != 0 {
				t.Fatalf("records left: %+v", recs)
			}
			kubetest.NoneLeft(t, c, ns)
		})
	}
}
