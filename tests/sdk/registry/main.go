// Command registry is the SDK suite's stand-in for Docker Hub: an OCI
// registry on 127.0.0.1 (go-containerregistry's pkg/registry) holding images
// the suite makes itself, so that E2B's template tests, which build
// fromImage('ubuntu:22.04'), run on a machine that reaches no public
// registry. tests/sdk/run.sh starts it before `airlock serve` and passes
// `--registry-mirror docker.io=http://<addr>`.
//
// It serves two listeners on one registry:
//   - addr: anonymous, the mirror;
//   - authAddr: the same content behind HTTP basic auth (user and password
//     from -auth), for fromImage(image, {username, password}).
//
// Every image it serves (library/ubuntu:22.04, library/ubuntu:latest and
// private/tool:1) is one layer: the rootfs of the first layer of the data
// dir's built-in base template (Debian bookworm from debootstrap, ~85 MB,
// with bash, coreutils and apt), not Ubuntu; what the tests need from
// "ubuntu:22.04" is an image pulled from a registry. The image is made on
// the first pull of a manifest, not at start, because on a fresh machine the
// server builds the base template after this program has started. The
// gzipped layer is kept in -cache (named by the source layer's key), so a
// later run pushes the same bytes: the manifest digest is unchanged and the
// server's import of it is a cache hit.
//
// It prints one JSON line {"addr","authAddr"} on stdout and serves until
// killed.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	goruntime "runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/klauspost/compress/gzip"

	"github.com/airlock-sandbox/airlock/internal/ociimage/ocitest"
)

// served are the repositories:tags pushed, all the same image.
var served = []string{"library/ubuntu:22.04", "library/ubuntu:latest", "private/tool:1"}

func main() {
	dataDir := flag.String("data", "/var/lib/airlock-test", "airlock data dir whose base template's first layer is the image's rootfs")
	cacheDir := flag.String("cache", "", "directory for the gzipped layer and the registry's blobs (default <data>/sdk-registry)")
	auth := flag.String("auth", "airlock:registry-secret", "user:password the authenticated listener requires")
	flag.Parse()
	if *cacheDir == "" {
		*cacheDir = filepath.Join(*dataDir, "sdk-registry")
	}
	user, pass, ok := strings.Cut(*auth, ":")
	if !ok || user == "" || pass == "" {
		log.Fatalf("registry: -auth must be user:password")
	}
	// The blobs are pushed again on every start (from the cached layer
	// file, a local copy): starting empty keeps blobs of older layers from
	// piling up.
	if err := os.RemoveAll(filepath.Join(*cacheDir, "blobs")); err != nil {
		log.Fatalf("registry: %v", err)
	}
	if err := os.MkdirAll(filepath.Join(*cacheDir, "blobs"), 0o755); err != nil {
		log.Fatalf("registry: %v", err)
	}

	reg := registry.New(
		registry.Logger(log.New(io.Discard, "", 0)),
		registry.WithBlobHandler(registry.NewDiskBlobHandler(filepath.Join(*cacheDir, "blobs"))),
	)
	// Pushes go to a listener of their own that the lazy gate does not
	// guard (the gate waits for the push).
	pushLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatalf("registry: %v", err)
	}
	pub, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatalf("registry: %v", err)
	}
	authLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatalf("registry: %v", err)
	}
	s := &seeder{data: *dataDir, cache: *cacheDir, pushHost: pushLn.Addr().String()}
	servers := []*http.Server{
		{Handler: reg, ReadHeaderTimeout: 10 * time.Second},
		{Handler: s.gate(reg), ReadHeaderTimeout: 10 * time.Second},
		{Handler: basicAuth(user, pass, s.gate(reg)), ReadHeaderTimeout: 10 * time.Second},
	}
	for i, ln := range []net.Listener{pushLn, pub, authLn} {
		go func() {
			if err := servers[i].Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Fatalf("registry: %v", err)
			}
		}()
	}
	line, _ := json.Marshal(map[string]string{"addr": pub.Addr().String(), "authAddr": authLn.Addr().String()})
	fmt.Println(string(line))

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, srv := range servers {
		_ = srv.Shutdown(ctx)
	}
}

// basicAuth answers 401 with a Basic challenge unless the request carries
// user and pass, as a registry with htpasswd auth does.
func basicAuth(user, pass string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, ok := r.BasicAuth()
		if !ok || u != user || p != pass {
			w.Header().Set("WWW-Authenticate", `Basic realm="airlock-sdk-registry"`)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = io.WriteString(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// seeder pushes the served images once, on the first manifest read.
type seeder struct {
	data, cache, pushHost string

	mu   sync.Mutex
	done bool
}

var manifestPath = regexp.MustCompile(`^/v2/.+/manifests/[^/]+$`)

// gate makes sure the images are pushed before a manifest is read. A failed
// push answers 503 with the reason and is tried again on the next read.
func (s *seeder) gate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if (r.Method == http.MethodGet || r.Method == http.MethodHead) && manifestPath.MatchString(r.URL.Path) {
			if err := s.ensure(); err != nil {
				log.Printf("registry: %v", err)
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

func (s *seeder) ensure() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		return nil
	}
	t0 := time.Now()
	img, err := s.image()
	if err != nil {
		return err
	}
	for _, repo := range served {
		ref, err := name.ParseReference(s.pushHost+"/"+repo, name.Insecure)
		if err != nil {
			return fmt.Errorf("push %s: %w", repo, err)
		}
		if err := remote.Write(ref, img); err != nil {
			return fmt.Errorf("push %s: %w", repo, err)
		}
	}
	d, _ := img.Digest()
	log.Printf("registry: pushed %v (%s) in %s", served, d, time.Since(t0).Round(time.Millisecond))
	s.done = true
	return nil
}

// image is the base template's first layer as a one-layer image, with a
// config like Docker Hub's ubuntu (root, PATH, bash).
func (s *seeder) image() (v1.Image, error) {
	var tj struct {
		Layers []struct {
			Key string `json:"key"`
		} `json:"layers"`
	}
	b, err := os.ReadFile(filepath.Join(s.data, "templates", "base", "template.json"))
	if err != nil {
		return nil, fmt.Errorf("the base template is not built yet: %w", err)
	}
	if err := json.Unmarshal(b, &tj); err != nil || len(tj.Layers) == 0 || tj.Layers[0].Key == "" {
		return nil, fmt.Errorf("base template.json has no layers (%v)", err)
	}
	key := tj.Layers[0].Key
	blob := filepath.Join(s.cache, "layer-"+key+".tar.gz")
	if _, err := os.Stat(blob); err != nil {
		if err := writeLayer(filepath.Join(s.data, "layers", key, "rootfs"), blob); err != nil {
			return nil, err
		}
		// A new base layer: the file of the old one is not used again.
		old, _ := filepath.Glob(filepath.Join(s.cache, "layer-*.tar.gz"))
		for _, f := range old {
			if f != blob {
				_ = os.Remove(f)
			}
		}
	}
	layer, err := tarball.LayerFromFile(blob)
	if err != nil {
		return nil, fmt.Errorf("layer %s: %w", blob, err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", goruntime.GOARCH
	cf.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cf.Config.Cmd = []string{"/bin/bash"}
	return mutate.ConfigFile(img, cf)
}

// writeLayer writes the gzipped tar of rootfs to dst (through a temp file
// and a rename, so a killed run leaves no half file to reuse).
func writeLayer(rootfs, dst string) error {
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".tmp-layer-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	zw, err := gzip.NewWriterLevel(tmp, gzip.BestSpeed)
	if err != nil {
		return err
	}
	if err := ocitest.WriteTree(zw, rootfs); err != nil {
		tmp.Close()
		return fmt.Errorf("tar of %s: %w", rootfs, err)
	}
	if err := zw.Close(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dst)
}
