package gvisor_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/runtime/gvisor"
	"github.com/airlock-sandbox/airlock/internal/runtime/runtimetest"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

func TestConformance(t *testing.T) {
	testenv.NeedRoot(t)
	testenv.NeedRunsc(t)
	lower := testenv.BaseRootfs(t)
	state := filepath.Join(t.TempDir(), "state")
	runtimetest.Run(t, runtimetest.Harness{
		Lower: lower,
		New: func(t *testing.T) runtime.Runtime {
			r, err := gvisor.New(state, nil)
			if err != nil {
				t.Fatal(err)
			}
			return r
		},
	})
	// Every sandbox is gone, so runsc's shared null-netns pin must be too.
	if _, err := os.Lstat(filepath.Join(state, "null-netns")); !os.IsNotExist(err) {
		t.Errorf("runsc's null-netns pin survived the last sandbox (err=%v)", err)
	}
}
