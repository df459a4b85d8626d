package linux_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/runtime/linux"
	"github.com/airlock-sandbox/airlock/internal/runtime/runtimetest"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

func init() { linux.MaybeInit() }

func TestMain(m *testing.M) { os.Exit(m.Run()) }

func TestConformance(t *testing.T) {
	testenv.NeedRoot(t)
	lower := testenv.BaseRootfs(t)
	state := filepath.Join(t.TempDir(), "state")
	runtimetest.Run(t, runtimetest.Harness{
		Lower:  lower,
		Caps:   linux.Capabilities,
		UIDMap: "0 100000 65536",
		New: func(t *testing.T) runtime.Runtime {
			r, err := linux.New(state, nil)
			if err != nil {
				t.Fatal(err)
			}
			return r
		},
	})
}
