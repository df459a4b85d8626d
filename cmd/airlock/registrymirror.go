package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/ociimage"
)

// registryMirrorEnv holds registry mirrors when no --registry-mirror flag is
// given (REGISTRY=URL, separated by commas or spaces), as AIRLOCK_API_KEY and
// AIRLOCK_DEBIAN_MIRROR do for their settings.
const registryMirrorEnv = "AIRLOCK_REGISTRY_MIRRORS"

// addRegistryMirrorFlag adds the repeatable --registry-mirror flag to c.
func addRegistryMirrorFlag(c *cobra.Command, into *[]string) {
	c.Flags().StringArrayVar(into, "registry-mirror", nil,
		"pull images of REGISTRY from a mirror, REGISTRY=URL (repeatable), e.g. docker.io=http://10.0.0.5:5000: "+
			"http:// allows plain HTTP, https:// is TLS only; no fallback to REGISTRY (default $"+registryMirrorEnv+")")
}

// registryMirrors parses the --registry-mirror values, or $AIRLOCK_REGISTRY_MIRRORS
// when there are none.
func registryMirrors(flags []string) ([]ociimage.Mirror, error) {
	if len(flags) > 0 {
		ms, err := ociimage.ParseMirrors(flags)
		if err != nil {
			return nil, fmt.Errorf("--registry-mirror: %w", err)
		}
		return ms, nil
	}
	env := strings.Fields(strings.ReplaceAll(os.Getenv(registryMirrorEnv), ",", " "))
	ms, err := ociimage.ParseMirrors(env)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", registryMirrorEnv, err)
	}
	return ms, nil
}
