// Package testenv gives tests the real things they need: root, and a built base
// template. Tests that need them skip (locally) or fail (in CI, where
// AIRLOCK_TEST_REQUIRE=1) with a message saying what is missing.
package testenv

import (
	"os"
	"testing"
)

// NeedRoot stops a test that needs root (namespaces, mounts, cgroups).
func NeedRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		missing(t, "test needs root")
	}
}

func missing(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("AIRLOCK_TEST_REQUIRE") == "1" {
		t.Fatal(why)
	}
	t.Skip(why)
}

// BaseRootfs returns the root filesystem of the built base template.
func BaseRootfs(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("AIRLOCK_TEST_ROOTFS"); p != "" {
		return p
	}
	missing(t, "no base template: set AIRLOCK_TEST_ROOTFS")
	return ""
}
