package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/runtime/linux"
)

// Where things are in the control-plane image. envd sits beside airlock,
// where findEnvd looks for it.
const (
	imageBinDir  = "/usr/local/bin"
	imageDataDir = "/var/lib/airlock"
)

func imageCmd() *cobra.Command {
	var output, tag string
	cmd := &cobra.Command{
		Use:   "image",
		Short: "Write the container image of the control plane (serve --backend kubernetes) as a tarball",
		Long: `Write a container image holding this airlock binary and envd, whose entrypoint is
"airlock serve --backend kubernetes", as a tarball (the "docker save" layout, which
ctr images import, docker load, podman load and crane push read):

  airlock image --output airlock.tar --tag registry.example.com/airlock:v1
  crane push airlock.tar registry.example.com/airlock:v1    # or: ctr -n k8s.io images import airlock.tar

A dynamically linked airlock (cgo: libseccomp) brings the exact shared libraries
ldd lists, with the dynamic loader; GNU tar comes too (with its libraries), as the
replica's registry makes template images with it. Nothing else: no shell, no
distribution. deploy/kubernetes runs it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ref, err := name.ParseReference(tag)
			if err != nil {
				return fmt.Errorf("--tag: %w", err)
			}
			self, err := linux.Executable()
			if err != nil {
				return err
			}
			envd, err := findEnvd()
			if err != nil {
				return err
			}
			img, files, err := controlPlaneImage(self, envd)
			if err != nil {
				return err
			}
			if err := tarball.WriteToFile(output, ref, img); err != nil {
				return fmt.Errorf("--output: %w", err)
			}
			d, err := img.Digest()
			if err != nil {
				return err
			}
			fmt.Printf("%s: %s (%s), %d files: %s\n", output, ref, d, len(files), strings.Join(files, " "))
			return nil
		},
	}
	cmd.Flags().StringVar(&output, "output", "airlock-image.tar", "the image tarball to write")
	cmd.Flags().StringVar(&tag, "tag", "localhost/airlock/airlock:dev", "the image's reference inside the tarball (what ctr images import names it)")
	return cmd
}

// controlPlaneImage is the image of airlock (self) and envd as one layer,
// and the paths it holds files at.
func controlPlaneImage(self, envd string) (v1.Image, []string, error) {
	tarPath, err := exec.LookPath("tar")
	if err != nil {
		return nil, nil, fmt.Errorf("GNU tar, which the replica runs to make template images: %w", err)
	}
	files := map[string]string{ // path in the image: file on this machine
		imageBinDir + "/airlock": self,
		imageBinDir + "/envd":    envd,
		"/usr/bin/tar":           tarPath,
	}
	for _, bin := range []string{self, tarPath} {
		libs, err := sharedLibraries(bin)
		if err != nil {
			return nil, nil, err
		}
		for _, l := range libs {
			files[l] = l
		}
	}
	// The roots the Go TLS stack trusts (a PostgreSQL with sslmode=verify-full,
	// an ACME CA), where present on this machine.
	for _, ca := range []string{"/etc/ssl/certs/ca-certificates.crt"} {
		if _, err := os.Stat(ca); err == nil {
			files[ca] = ca
		}
	}
	var buf bytes.Buffer
	paths, err := writeLayer(&buf, files)
	if err != nil {
		return nil, nil, err
	}
	data := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		return nil, nil, err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.Architecture, cfg.OS = "amd64", "linux"
	cfg.Config.Entrypoint = []string{imageBinDir + "/airlock", "serve", "--backend", "kubernetes"}
	cfg.Config.Env = []string{"PATH=" + imageBinDir + ":/usr/bin:/bin", "TMPDIR=/tmp"}
	cfg.Config.WorkingDir = "/"
	img, err = mutate.ConfigFile(img, cfg)
	return img, paths, err
}

// lddLine is one library of ldd's output: "name => /path (0x...)" or
// "/path (0x...)" (the loader); the vDSO has no path.
var lddLine = regexp.MustCompile(`^\s*(?:\S+\s+=>\s+)?(/\S+)\s+\(0x[0-9a-f]+\)\s*$`)

// sharedLibraries are the shared libraries ldd lists for bin (all of them,
// transitively, and the dynamic loader); none for a static binary.
func sharedLibraries(bin string) ([]string, error) {
	out, err := exec.Command("ldd", bin).CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "not a dynamic executable") {
			return nil, nil
		}
		return nil, fmt.Errorf("ldd %s: %w: %s", bin, err, out)
	}
	var libs []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if strings.Contains(sc.Text(), "not found") {
			return nil, fmt.Errorf("ldd %s: %s", bin, strings.TrimSpace(sc.Text()))
		}
		if m := lddLine.FindStringSubmatch(sc.Text()); m != nil {
			libs = append(libs, m[1])
		}
	}
	return libs, nil
}

// writeLayer writes a tar of files (path in the image: file here, its
// symbolic links followed) with their parent directories, owned by root,
// every time zero: the same inputs make the same layer, and so the same
// digest.
func writeLayer(w io.Writer, files map[string]string) ([]string, error) {
	tw := tar.NewWriter(w)
	dirs := map[string]bool{"/": true}
	var addDir func(string) error
	addDir = func(d string) error {
		if dirs[d] {
			return nil
		}
		if err := addDir(filepath.Dir(d)); err != nil {
			return err
		}
		dirs[d] = true
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(d, "/") + "/", Mode: 0o755, Format: tar.FormatPAX})
	}
	// The emptyDirs of deploy/kubernetes cover these; as directories of the
	// image they also let it run without them.
	for _, d := range []struct {
		path string
		mode int64
	}{{"/tmp", 0o1777}, {imageDataDir, 0o700}} {
		if err := addDir(filepath.Dir(d.path)); err != nil {
			return nil, err
		}
		dirs[d.path] = true
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(d.path, "/") + "/", Mode: d.mode, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
	}
	var paths []string
	for p := range files {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	for _, p := range paths {
		if err := addDir(filepath.Dir(p)); err != nil {
			return nil, err
		}
		f, err := os.Open(files[p])
		if err != nil {
			return nil, err
		}
		st, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, err
		}
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(p, "/"), Mode: int64(st.Mode().Perm()), Size: st.Size(), Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			f.Close()
			return nil, err
		}
		_, err = io.Copy(tw, f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", files[p], err)
		}
	}
	return paths, tw.Close()
}
