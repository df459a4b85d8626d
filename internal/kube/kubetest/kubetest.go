// Package kubetest gives tests the single-node Kubernetes that
// scripts/kube-stack.sh runs (scripts/test.sh brings it up and exports
// AIRLOCK_KUBECONFIG and AIRLOCK_KUBE_DIR): a client, and a namespace of
// the test's own that is deleted, with everything in it, when the test
// ends.
package kubetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/airlock-sandbox/airlock/internal/kube"
	"github.com/airlock-sandbox/airlock/internal/registry"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// PodCIDR is the range the stack's Pods get their addresses from
// (scripts/kube-stack.sh's POD_CIDR), and Gateway the node's address on
// their bridge.
const (
	PodCIDR = "172.29.0.0/24"
	Gateway = "172.29.0.1"
)

// Cluster is the test's view of the stack.
type Cluster struct {
	Client *kubernetes.Clientset
	Config *rest.Config
	// Dir is the stack's directory (AIRLOCK_KUBE_DIR): its runtime state
	// is under Dir/run.
	Dir string
}

// Start returns the running stack, or fails (skips outside CI) when there
// is none.
func Start(t testing.TB) *Cluster {
	t.Helper()
	path := os.Getenv("AIRLOCK_KUBECONFIG")
	if path == "" {
		testenv.Missing(t, "no Kubernetes stack: run scripts/kube-stack.sh up and set AIRLOCK_KUBECONFIG (scripts/test.sh does)")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatalf("kubeconfig %s: %v", path, err)
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dir := os.Getenv("AIRLOCK_KUBE_DIR")
	if dir == "" {
		dir = "/var/lib/airlock-kube"
	}
	return &Cluster{Client: c, Config: cfg, Dir: dir}
}

// Namespace makes a namespace for the test and deletes it (and so every
// Pod in it) when the test ends, waiting until it is gone.
func (c *Cluster) Namespace(t testing.TB) string {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := "airlock-test-" + hex.EncodeToString(b)
	ctx := context.Background()
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The controller-manager makes the namespace's default ServiceAccount a
	// moment later; Pods are refused until it is there.
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := c.Client.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("namespace %s has no default ServiceAccount after a minute: %v", name, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Cleanup(func() {
		zero := int64(0)
		_ = c.Client.CoreV1().Pods(name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
		if err := c.Client.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("deleting namespace %s: %v", name, err)
			return
		}
		deadline := time.Now().Add(2 * time.Minute)
		for time.Now().Before(deadline) {
			if _, err := c.Client.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{}); err != nil {
				return
			}
			time.Sleep(250 * time.Millisecond)
		}
		t.Errorf("namespace %s still there 2 minutes after its delete", name)
	})
	return name
}

// WaitPod waits until the Pod's phase is one of phases and returns it.
func (c *Cluster) WaitPod(t testing.TB, ns, name string, limit time.Duration, phases ...corev1.PodPhase) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(limit)
	var last *corev1.Pod
	for time.Now().Before(deadline) {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			last = p
			for _, ph := range phases {
				if p.Status.Phase == ph {
					return p
				}
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	if last != nil {
		t.Fatalf("pod %s/%s: phase %s after %s, want %v; conditions %+v; containers %+v", ns, name, last.Status.Phase, limit, phases, last.Status.Conditions, last.Status.ContainerStatuses)
	}
	t.Fatalf("pod %s/%s not found in %s", ns, name, limit)
	return nil
}

// NoneLeft fails unless the namespace holds no Pod and no Secret of a
// sandbox's (labelled kube.LabelSandbox), waiting a while for deletions
// under way.
func NoneLeft(t testing.TB, c *Cluster, ns string) {
	t.Helper()
	const label = "airlock.dev/sandbox"
	deadline := time.Now().Add(30 * time.Second)
	for {
		pods, err := c.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: label})
		if err != nil {
			t.Fatal(err)
		}
		secrets, err := c.Client.CoreV1().Secrets(ns).List(context.Background(), metav1.ListOptions{LabelSelector: label})
		if err != nil {
			t.Fatal(err)
		}
		if len(pods.Items) == 0 && len(secrets.Items) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("left in %s: %d Pods, %d Secrets of sandboxes", ns, len(pods.Items), len(secrets.Items))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Kubectl runs the stack's kubectl (Dir/bin/kubectl, else kubectl on PATH)
// against the stack, with stdin (nil: none), and returns its output; a
// failure's error holds what it wrote to stderr.
func (c *Cluster) Kubectl(stdin []byte, args ...string) ([]byte, error) {
	bin := filepath.Join(c.Dir, "bin", "kubectl")
	if _, err := os.Stat(bin); err != nil {
		bin = "kubectl"
	}
	cmd := exec.Command(bin, append([]string{"--kubeconfig", os.Getenv("AIRLOCK_KUBECONFIG")}, args...)...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// DeleteNamespaceAtCleanup deletes the namespace name (made by the test
// some other way than Namespace) when the test ends, and waits until it is
// gone; one that was never made is no error.
func (c *Cluster) DeleteNamespaceAtCleanup(t testing.TB, name string) {
	t.Helper()
	t.Cleanup(func() {
		ctx := context.Background()
		zero := int64(0)
		_ = c.Client.CoreV1().Pods(name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
		err := c.Client.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{})
		if apierrors.IsNotFound(err) {
			return
		}
		if err != nil {
			t.Errorf("deleting namespace %s: %v", name, err)
			return
		}
		deadline := time.Now().Add(2 * time.Minute)
		for time.Now().Before(deadline) {
			if _, err := c.Client.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
				return
			}
			time.Sleep(250 * time.Millisecond)
		}
		t.Errorf("namespace %s still there 2 minutes after its delete", name)
	})
}

// BaseImage serves the base template's image (kube.TemplateImage) from a
// registry.Store on loopback, as Airlock serves templates to nodes, and
// returns its reference: the node pulls it from there.
func BaseImage(t *testing.T) string {
	t.Helper()
	work := t.TempDir()
	store := &registry.Store{Dir: work + "/oci", Build: func(_ context.Context, name, tag string) (v1.Image, error) {
		if name != "airlock/base" || tag != "test" {
			return nil, registry.ErrNotFound
		}
		return kube.TemplateImage(testenv.BaseRootfs(t), testenv.EnvdBinary(t), work)
	}}
	srv := httptest.NewServer(store)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://") + "/airlock/base:test"
}
