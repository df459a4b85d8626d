package kube_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/airlock-sandbox/airlock/internal/e2b"
	"github.com/airlock-sandbox/airlock/internal/e2bclient"
	"github.com/airlock-sandbox/airlock/internal/e2bwire"
	"github.com/airlock-sandbox/airlock/internal/kube"
	"github.com/airlock-sandbox/airlock/internal/kube/kubetest"
	"github.com/airlock-sandbox/airlock/internal/proxy"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// TestBackendE2B: the E2B handler and the sandbox proxy, unchanged, over
// the kubernetes backend on the real cluster, driven by Airlock's own E2B
// client: create (a Pod under gVisor), files through the proxy, list by
// metadata, a 501 naming the backend for pause, a timeout that ends the
// sandbox and its Pod, kill, and a Pod deleted behind the backend's back
// answering 404 with the reason.
func TestBackendE2B(t *testing.T) {
	c := kubetest.Start(t)
	ns := c.Namespace(t)
	ctx := context.Background()
	ref := kubetest.BaseImage(t)
	st, err := store.OpenSQLite(filepath.Join(t.TempDir(), "airlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	b := &kube.Backend{
		Records: st, Events: store.NewLifecycleEvents(st), Samples: st,
		Pods: &kube.Pods{Client: c.Client, Namespace: ns, RuntimeClass: "gvisor", Ready: time.Minute},
		Templates: func(_ context.Context, name string) (kube.Template, error) {
			if name != "base" {
				return kube.Template{}, sandbox.ErrTemplateNotFound
			}
			return kube.Template{ID: "base", Alias: "base", Image: ref, CPUs: 1, MemoryMB: 512, DiskSizeMB: 1024, DefaultUser: "user"}, nil
		},
	}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	if err := b.Start(wctx); err != nil {
		t.Fatal(err)
	}
	go b.RunReconciler(wctx, "test")
	const key = "e2b_kubebackendtest0000000000000000000000"
	api := httptest.NewServer(e2b.NewHandler(b, e2b.Options{Authenticate: func(k string) bool { return k == key }}))
	defer api.Close()
	px := httptest.NewServer(proxy.New(b, nil))
	defer px.Close()
	cl := e2bclient.New(e2bclient.Config{APIURL: api.URL, SandboxURL: px.URL, APIKey: key})

	create := func() e2bwire.Sandbox {
		t.Helper()
		sb, err := cl.Create(ctx, e2bwire.NewSandbox{TemplateID: "base", Metadata: map[string]any{"suite": "kube"}})
		if err != nil {
			t.Fatal(err)
		}
		return sb
	}
	status := func(err error) int {
		var e *e2bclient.Error
		if errors.As(err, &e) {
			return e.Status
		}
		return 0
	}

	sb := create()
	s := cl.Sandbox(sb.SandboxID, sb.EnvdAccessToken)
	if err := s.WriteFile(ctx, "/home/user/hello.txt", strings.NewReader("from a Pod")); err != nil {
		t.Fatal(err)
	}
	rc, err := s.ReadFile(ctx, "/home/user/hello.txt")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(rc)
	rc.Close()
	if string(got) != "from a Pod" {
		t.Fatalf("read back %q", got)
	}
	if _, err := cl.Sandbox(sb.SandboxID, "wrong").ReadFile(ctx, "/home/user/hello.txt"); status(err) != http.StatusUnauthorized {
		t.Fatalf("a wrong token: %v", err)
	}
	listed, err := cl.List(ctx, e2bclient.ListQuery{Metadata: map[string]string{"suite": "kube"}})
	if err != nil || len(listed) != 1 || listed[0].SandboxID != sb.SandboxID || listed[0].CPUCount != 1 {
		t.Fatalf("list: %+v %v", listed, err)
	}
	if err := cl.Pause(ctx, sb.SandboxID, true); status(err) != http.StatusNotImplemented || !strings.Contains(err.Error(), "kubernetes backend") {
		t.Fatalf("pause: %v", err)
	}
	if _, err := cl.Create(ctx, e2bwire.NewSandbox{TemplateID: "nosuch"}); status(err) != http.StatusNotFound {
		t.Fatalf("an unknown template: %v", err)
	}

	// A timeout ends the sandbox and its Pod.
	if err := cl.SetTimeout(ctx, sb.SandboxID, time.Second); err != nil {
		t.Fatal(err)
	}
	podGone(t, c, ns, sb.SandboxID)
	if _, err := cl.Get(ctx, sb.SandboxID); status(err) != http.StatusNotFound {
		t.Fatalf("after its timeout: %v", err)
	}

	// Kill.
	killed := create()
	if err := cl.Kill(ctx, killed.SandboxID); err != nil {
		t.Fatal(err)
	}
	podGone(t, c, ns, killed.SandboxID)

	// A Pod deleted behind the backend's back: the sandbox is gone, and
	// the API says why.
	lost := create()
	if err := c.Client.CoreV1().Pods(ns).Delete(ctx, "airlock-"+lost.SandboxID, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, "the deleted Pod's sandbox gone", func() bool {
		_, err := cl.Get(ctx, lost.SandboxID)
		return status(err) == http.StatusNotFound
	})
	if _, err := b.Get(ctx, lost.SandboxID); err == nil || !strings.Contains(err.Error(), "deleted (not by Airlock)") {
		t.Fatalf("the reason: %v", err)
	}
	if _, err := cl.Sandbox(lost.SandboxID, lost.EnvdAccessToken).ReadFile(ctx, "/etc/hostname"); status(err) != http.StatusBadGateway {
		t.Fatalf("the proxy, to a sandbox whose Pod is gone: %v", err)
	}
}

// podGone waits until a sandbox's Pod is deleted.
func podGone(t *testing.T, c *kubetest.Cluster, ns, id string) {
	t.Helper()
	testenv.Eventually(t, time.Minute, "Pod of "+id+" deleted", func() bool {
		_, err := c.Client.CoreV1().Pods(ns).Get(context.Background(), "airlock-"+id, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
}
