package kube

import (
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/airlock-sandbox/airlock/internal/envdapi"
)

// TemplateImage is the OCI image a template's sandboxes run from as Pods:
// the template's root filesystem as one layer, envd at envdapi.BinaryPath
// as a second, and envd reading its config from ConfigFile as the
// entrypoint. The layers are tars written into work (which must outlive
// the image's use: the image reads them from there).
func TemplateImage(rootfs, envdPath, work string) (v1.Image, error) {
	base := filepath.Join(work, "rootfs.tar")
	// GNU tar keeps what a root filesystem holds (owners by number, hard
	// links, devices, modes) exactly as the template built it.
	// Sorted, so that every replica over the same files makes the same
	// image, digest for digest: a node may take a manifest from one
	// replica's registry and its layers from another's.
	if out, err := exec.Command("tar", "--numeric-owner", "--sort=name", "-C", rootfs, "-cf", base, ".").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("tar of %s: %w: %s", rootfs, err, out)
	}
	agent := filepath.Join(work, "envd.tar")
	if err := envdLayer(envdPath, agent); err != nil {
		return nil, err
	}
	var layers []v1.Layer
	for _, f := range []string{base, agent} {
		l, err := tarball.LayerFromFile(f, tarball.WithCompressionLevel(gzip.BestSpeed))
		if err != nil {
			return nil, fmt.Errorf("layer %s: %w", f, err)
		}
		layers = append(layers, l)
	}
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.Architecture, cfg.OS = "amd64", "linux"
	cfg.Config.Entrypoint = []string{envdapi.BinaryPath, "--config-file", ConfigFile}
	cfg.Config.Env = []string{"PATH=" + envdapi.DefaultPath}
	return mutate.ConfigFile(img, cfg)
}

// envdLayer writes a tar holding envd at envdapi.BinaryPath, hard-linked
// as /usr/bin/sudo (envd as sudo is the no-setuid sudo shim) and as
// envdapi.MCPGatewayPath (the MCP gateway): what one box binds in.
func envdLayer(envdPath, out string) error {
	dir, err := os.MkdirTemp(filepath.Dir(out), "envd-layer-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	dst := filepath.Join(dir, envdapi.BinaryPath)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	src, err := os.Open(envdPath)
	if err != nil {
		return fmt.Errorf("envd: %w", err)
	}
	defer src.Close()
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, src); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	for _, link := range []string{"/usr/bin/sudo", envdapi.MCPGatewayPath} {
		l := filepath.Join(dir, link)
		if err := os.MkdirAll(filepath.Dir(l), 0o755); err != nil {
			return err
		}
		if err := os.Link(dst, l); err != nil {
			return err
		}
	}
	// Fixed times and order: the same envd makes the same layer anywhere.
	if b, err := exec.Command("tar", "--numeric-owner", "--owner=0", "--group=0", "--sort=name", "--mtime=@0", "-C", dir, "-cf", out, ".").CombinedOutput(); err != nil {
		return fmt.Errorf("tar of envd: %w: %s", err, b)
	}
	return nil
}
