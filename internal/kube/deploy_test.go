package kube_test

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"

	"github.com/airlock-sandbox/airlock/internal/kube/kubetest"
)

// deployDir is deploy/kubernetes of this checkout.
var deployDir = filepath.Join("..", "..", "deploy", "kubernetes")

// TestDeployManifests: deploy/kubernetes, as an operator applies it, on the
// real cluster:
//   - the install (deploy/kubernetes) and the evaluation overlay render with
//     kubectl's own kustomize and hold what the README promises;
//   - the API server accepts every object of the install (server-side dry
//     run, its namespaces renamed to the test's own, made for real), and the
//     Pod the Deployment makes is admitted under the namespace's Pod
//     Security level;
//   - the RBAC objects, applied for real, give the replicas' ServiceAccount
//     each verb internal/kube uses in the sandbox namespace and nothing
//     else: no reading Secrets, no Pods in its own namespace or others.
func TestDeployManifests(t *testing.T) {
	c := kubetest.Start(t)

	var base []*unstructured.Unstructured
	t.Run("render", func(t *testing.T) {
		base = render(t, c, deployDir)
		byKind := kinds(base)
		for _, want := range []string{"Namespace/airlock", "Namespace/airlock-sandboxes", "ServiceAccount/airlock/airlock",
			"Role/airlock-sandboxes/airlock", "RoleBinding/airlock-sandboxes/airlock", "RuntimeClass/gvisor",
			"PersistentVolumeClaim/airlock/airlock-templates", "Deployment/airlock/airlock", "Service/airlock/airlock",
			"Service/airlock/airlock-registry", "NetworkPolicy/airlock-sandboxes/sandboxes-from-airlock-only",
			"PodDisruptionBudget/airlock/airlock", "Namespace/airlock-node", "ServiceAccount/airlock-node/airlock-node-agent",
			"Role/airlock-sandboxes/airlock-node-agent", "RoleBinding/airlock-sandboxes/airlock-node-agent",
			"DaemonSet/airlock-node/airlock-node-agent"} {
			if byKind[want] == nil {
				t.Errorf("deploy/kubernetes renders no %s (it has %v)", want, keys(byKind))
			}
		}
		if d := byKind["Deployment/airlock/airlock"]; d != nil {
			ctr := container(t, d)
			for _, want := range []string{"--api-addr=0.0.0.0:3000", "--registry-host=127.0.0.1:30003", "--store=$(AIRLOCK_STORE)", "--kube-namespace=airlock-sandboxes"} {
				if !contains(ctr.Args, want) {
					t.Errorf("the Deployment's args %v lack %s", ctr.Args, want)
				}
			}
		}
		eval := kinds(render(t, c, filepath.Join(deployDir, "evaluation")))
		for _, want := range []string{"StatefulSet/airlock/airlock-postgres", "Service/airlock/airlock-postgres", "Secret/airlock/airlock-store", "Deployment/airlock/airlock"} {
			if eval[want] == nil {
				t.Errorf("deploy/kubernetes/evaluation renders no %s", want)
			}
		}
		if s := eval["Secret/airlock/airlock-store"]; s != nil {
			url, _, _ := unstructured.NestedString(s.Object, "data", "url")
			if url == "" {
				t.Errorf("the evaluation's airlock-store Secret has no url")
			}
		}
	})
	if len(base) == 0 {
		t.FailNow()
	}

	// The test's namespaces stand in for airlock and airlock-sandboxes.
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	ctl := "airlock-deploy-" + hex.EncodeToString(b)
	sbx := ctl + "-sandboxes"
	node := ctl + "-node"
	objs := renamed(t, base, map[string]string{"airlock": ctl, "airlock-sandboxes": sbx, "airlock-node": node})
	var namespaces, rbac, rest []*unstructured.Unstructured
	for _, o := range objs {
		switch o.GetKind() {
		case "Namespace":
			namespaces = append(namespaces, o)
		case "ServiceAccount", "Role", "RoleBinding":
			rbac = append(rbac, o)
			rest = append(rest, o)
		default:
			rest = append(rest, o)
		}
	}
	if len(namespaces) != 3 {
		t.Fatalf("%d Namespaces rendered, want 3", len(namespaces))
	}
	for _, ns := range namespaces {
		c.DeleteNamespaceAtCleanup(t, ns.GetName())
	}
	// Namespaces for real: a dry run of the objects in them needs them. The
	// RBAC objects too: the dry run of a Pod needs its ServiceAccount, and
	// the checks below ask the real authorizer.
	apply(t, c, namespaces)
	apply(t, c, rbac)

	t.Run("server dry run", func(t *testing.T) {
		apply(t, c, rest, "--dry-run=server")
		// A Deployment is admitted whatever its Pods would be; its Pod, in
		// the namespace whose Pod Security level it must meet, is the test.
		var d *unstructured.Unstructured
		for _, o := range rest {
			if o.GetKind() == "Deployment" {
				d = o
			}
		}
		tmpl, _, _ := unstructured.NestedMap(d.Object, "spec", "template")
		pod := &unstructured.Unstructured{Object: tmpl}
		pod.SetAPIVersion("v1")
		pod.SetKind("Pod")
		pod.SetName("airlock-dry-run")
		pod.SetNamespace(ctl)
		out := apply(t, c, []*unstructured.Unstructured{pod}, "--dry-run=server")
		t.Logf("the Deployment's Pod, dry run: %s", bytes.TrimSpace(out))
		// And the level is enforced there: the same Pod on the host's
		// network is refused.
		bad := pod.DeepCopy()
		_ = unstructured.SetNestedField(bad.Object, true, "spec", "hostNetwork")
		raw, _ := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "List", "items": []any{bad.Object}})
		if out, err := c.Kubectl(raw, "apply", "--server-side", "--field-manager=airlock-deploy-test", "--dry-run=server", "-f", "-"); err == nil || !strings.Contains(err.Error(), "violates PodSecurity") {
			t.Errorf("a Pod on the host's network in %s: %s %v, want a PodSecurity refusal", ctl, out, err)
		}
	})

	t.Run("rbac", func(t *testing.T) {
		sa := "system:serviceaccount:" + ctl + ":airlock"
		check := func(want bool, ns, verb, resource string, extra ...string) {
			t.Helper()
			canI(t, c, sa, want, ns, verb, resource, extra...)
		}
		// What internal/kube does, and warm pools will.
		for _, verb := range []string{"create", "get", "list", "watch", "delete", "patch", "update"} {
			check(true, sbx, verb, "pods")
		}
		check(true, sbx, "create", "secrets")
		check(true, sbx, "delete", "secrets")
		check(true, sbx, "create", "leases.coordination.k8s.io")
		check(true, sbx, "get", "leases.coordination.k8s.io/airlock-reconciler")
		check(true, sbx, "update", "leases.coordination.k8s.io/airlock-reconciler")
		// Nothing more there: Secrets hold the sandboxes' tokens.
		for _, verb := range []string{"get", "list", "watch", "update", "patch"} {
			check(false, sbx, verb, "secrets")
		}
		check(false, sbx, "create", "pods", "--subresource=exec")
		check(false, sbx, "get", "pods", "--subresource=log")
		check(false, sbx, "update", "pods", "--subresource=status")
		check(false, sbx, "deletecollection", "pods")
		check(false, sbx, "update", "leases.coordination.k8s.io/another-lease")
		check(false, sbx, "delete", "leases.coordination.k8s.io/airlock-reconciler")
		check(false, sbx, "create", "rolebindings.rbac.authorization.k8s.io")
		check(false, sbx, "create", "resourcequotas")
		// Nothing in its own namespace, nor anywhere else.
		for _, ns := range []string{ctl, "default", "kube-system"} {
			check(false, ns, "create", "pods")
			check(false, ns, "list", "pods")
			check(false, ns, "get", "secrets")
			check(false, ns, "list", "secrets")
		}
		check(false, "", "list", "pods")
		check(false, "", "list", "nodes")
		check(false, "", "create", "namespaces")

		// The node agent reads the sandbox Pods and annotates them: nothing
		// more, no Secret, nothing elsewhere.
		agent := "system:serviceaccount:" + node + ":airlock-node-agent"
		for _, verb := range []string{"get", "list", "watch", "patch"} {
			canI(t, c, agent, true, sbx, verb, "pods")
		}
		for _, verb := range []string{"create", "delete", "update"} {
			canI(t, c, agent, false, sbx, verb, "pods")
		}
		canI(t, c, agent, false, sbx, "get", "secrets")
		canI(t, c, agent, false, sbx, "create", "pods", "--subresource=exec")
		canI(t, c, agent, false, ctl, "list", "pods")
		canI(t, c, agent, false, "", "list", "pods")
	})
}

// canI asks the real authorizer whether sa may verb resource in ns ("" for
// every namespace) and fails the test unless the answer is want.
func canI(t *testing.T, c *kubetest.Cluster, sa string, want bool, ns, verb, resource string, extra ...string) {
	t.Helper()
	args := append([]string{"auth", "can-i", verb, resource, "--as", sa}, extra...)
	if ns == "" {
		args = append(args, "--all-namespaces")
	} else {
		args = append(args, "-n", ns)
	}
	out, err := c.Kubectl(nil, args...)
	got := strings.TrimSpace(string(out))
	// can-i exits 1 for "no": only its answer counts.
	if got != "yes" && got != "no" {
		t.Fatalf("kubectl %s: %q, %v", strings.Join(args, " "), got, err)
	}
	if (got == "yes") != want {
		t.Errorf("%s may %s %s %v in %q: %s, want %v", sa, verb, resource, extra, ns, got, want)
	}
}

// render is kubectl kustomize of dir, decoded.
func render(t *testing.T, c *kubetest.Cluster, dir string) []*unstructured.Unstructured {
	t.Helper()
	out, err := c.Kubectl(nil, "kustomize", dir)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("%s renders YAML that does not decode: %v", dir, err)
		}
		if m != nil {
			objs = append(objs, &unstructured.Unstructured{Object: m})
		}
	}
	if len(objs) == 0 {
		t.Fatalf("%s renders nothing", dir)
	}
	return objs
}

// kinds indexes objects as Kind/namespace/name (Kind/name when cluster
// scoped).
func kinds(objs []*unstructured.Unstructured) map[string]*unstructured.Unstructured {
	m := map[string]*unstructured.Unstructured{}
	for _, o := range objs {
		k := o.GetKind() + "/" + o.GetName()
		if o.GetNamespace() != "" {
			k = o.GetKind() + "/" + o.GetNamespace() + "/" + o.GetName()
		}
		m[k] = o
	}
	return m
}

func keys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

type containerSpec struct {
	Args []string `json:"args"`
}

// container is the Deployment's first container.
func container(t *testing.T, d *unstructured.Unstructured) containerSpec {
	t.Helper()
	list, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	if len(list) == 0 {
		t.Fatal("the Deployment has no container")
	}
	raw, _ := json.Marshal(list[0])
	var c containerSpec
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	return c
}

// renamed is a copy of objs with the namespaces renamed (old: new)
// wherever deploy/kubernetes names one: Namespace objects, metadata, the
// RoleBinding's subjects, NetworkPolicy namespace selectors, and the
// Deployment's --kube-namespace. The sandbox namespace named anywhere else
// is a failure, so the test keeps up with the manifests.
func renamed(t *testing.T, objs []*unstructured.Unstructured, names map[string]string) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	for _, o := range objs {
		o = o.DeepCopy()
		if ns := o.GetNamespace(); ns != "" {
			if names[ns] == "" {
				t.Fatalf("%s/%s is in namespace %s", o.GetKind(), o.GetName(), ns)
			}
			o.SetNamespace(names[ns])
		}
		switch o.GetKind() {
		case "Namespace":
			o.SetName(names[o.GetName()])
		case "RoleBinding":
			subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects")
			for _, s := range subjects {
				s := s.(map[string]any)
				if ns, ok := s["namespace"].(string); ok {
					s["namespace"] = names[ns]
				}
			}
			_ = unstructured.SetNestedSlice(o.Object, subjects, "subjects")
		case "NetworkPolicy":
			ingress, _, _ := unstructured.NestedSlice(o.Object, "spec", "ingress")
			for _, rule := range ingress {
				from, _ := rule.(map[string]any)["from"].([]any)
				for _, peer := range from {
					labels, ok, _ := unstructured.NestedStringMap(peer.(map[string]any), "namespaceSelector", "matchLabels")
					if ok {
						if ns := labels["kubernetes.io/metadata.name"]; ns != "" {
							labels["kubernetes.io/metadata.name"] = names[ns]
						}
						_ = unstructured.SetNestedStringMap(peer.(map[string]any), labels, "namespaceSelector", "matchLabels")
					}
				}
			}
			_ = unstructured.SetNestedSlice(o.Object, ingress, "spec", "ingress")
		case "Deployment", "DaemonSet":
			list, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
			for _, ctr := range list {
				args, _, _ := unstructured.NestedStringSlice(ctr.(map[string]any), "args")
				for i, a := range args {
					if ns, ok := strings.CutPrefix(a, "--kube-namespace="); ok {
						args[i] = "--kube-namespace=" + names[ns]
					}
				}
				_ = unstructured.SetNestedStringSlice(ctr.(map[string]any), args, "args")
			}
			_ = unstructured.SetNestedSlice(o.Object, list, "spec", "template", "spec", "containers")
		}
		// airlock-sandboxes is a name of nothing else: left anywhere, it is a
		// reference this function does not know of.
		if raw, _ := json.Marshal(o.Object); bytes.Contains(raw, []byte("airlock-sandboxes")) {
			t.Fatalf("%s/%s still names airlock-sandboxes after renaming: %s", o.GetKind(), o.GetName(), raw)
		}
		out = append(out, o)
	}
	return out
}

// apply applies objs server-side (kubectl apply --server-side, with extra
// flags such as --dry-run=server) and returns kubectl's output.
func apply(t *testing.T, c *kubetest.Cluster, objs []*unstructured.Unstructured, flags ...string) []byte {
	t.Helper()
	items := make([]any, len(objs))
	for i, o := range objs {
		items[i] = o.Object
	}
	list, err := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "List", "items": items})
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"apply", "--server-side", "--field-manager=airlock-deploy-test", "-f", "-"}, flags...)
	out, err := c.Kubectl(list, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
