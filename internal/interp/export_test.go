package interp

import (
	"context"
	"testing"
)

// What conformance_test.go (package interp_test) needs from inside: an
// internal test cannot import kerneltest, which imports interp.

// TemplateTypeScript returns the typescript Starter with the compiler of the
// built code-interpreter-v1 template (hosts have none of their own).
func TemplateTypeScript(t testing.TB) Starter {
	dir := templateTypeScript(t)
	return func(ctx context.Context, opts Options) (Kernel, error) {
		return startNode(ctx, opts, nodeConfig{typeScript: true, typeScriptDir: dir})
	}
}

// HavePyModules reports whether /usr/bin/python3 can import every module.
func HavePyModules(t *testing.T, mods ...string) bool { return havePyModules(t, mods...) }
