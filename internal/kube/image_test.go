package kube_test

import (
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/kube"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// TestTemplateImageDeterministic: two replicas making a template's image
// from the same files make the same image, digest for digest (a node may
// take the manifest from one replica's registry and the layers from
// another's), though each writes its layers at another time and place.
func TestTemplateImageDeterministic(t *testing.T) {
	rootfs, envd := testenv.BaseRootfs(t), testenv.EnvdBinary(t)
	var digests []string
	for i := range 2 {
		if i > 0 {
			time.Sleep(1100 * time.Millisecond) // tar keeps seconds: files written later must not show
		}
		img, err := kube.TemplateImage(rootfs, envd, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		d, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		digests = append(digests, d.String())
	}
	if digests[0] != digests[1] {
		t.Fatalf("two makings of one image: %s and %s", digests[0], digests[1])
	}
}
