// Package registry serves Airlock's templates as OCI images over the pull
// half of the OCI Distribution API, so that Kubernetes nodes pull sandbox
// images from Airlock itself: a cluster needs no registry of its own and
// reaches no public one (issue 24).
//
// An image is made the first time it is asked for (Store.Build, from the
// template: kube.TemplateImage) and written once into an OCI image layout
// on disk — manifest, config and compressed layers as blobs by digest, and
// an index entry naming its name:tag, which a restarted server reads back —
// so a pull is a file read, however many nodes pull it and however often.
//
// Routes (names may hold slashes, as "airlock/base"):
//
//	GET       /v2/                                   the API's version check
//	GET, HEAD /v2/<name>/manifests/<tag or digest>   the image's manifest
//	GET, HEAD /v2/<name>/blobs/<digest>              its config or a layer (Range too)
//
// Errors are the API's JSON ({"errors": [{"code", "message"}]}); anything
// that would change the registry answers 405.
package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// ErrNotFound is an image Build has no template for.
var ErrNotFound = errors.New("no such image")

// Store keeps the images it serves in an OCI layout under Dir.
type Store struct {
	Dir string
	// Build makes the image of name:tag, or returns ErrNotFound.
	Build func(ctx context.Context, name, tag string) (v1.Image, error)
	// Made, when set, is told once Build's image of name:tag has been
	// written into the layout, or failed to be: what Build left for it
	// (its layers' files) can go.
	Made func(name, tag string)
	// Background, when set, is the context images are made in when a pull
	// asks for one not made yet: the pull is answered 404 at once and the
	// image made meanwhile (Prepare), since a node's pull gives up long
	// before a big template's image is made. Nil makes the pull wait.
	Background context.Context
	Log        *slog.Logger

	mu sync.Mutex
	// tags maps name:tag to the manifest digest of its image, once written.
	tags map[string]v1.Hash
	// building serialises the first build of each name:tag.
	building map[string]*sync.Mutex
	// indexMu serialises writes of the layout's index.json, which each
	// image's entry rewrites whole.
	indexMu sync.Mutex
	// preparing holds the images Prepare is making, and their failures
	// once it gave up (until the next Prepare).
	preparing map[string]bool
	failed    map[string]error
}

// ErrPreparing is an image being made in the background.
var ErrPreparing = errors.New("the image is being made")

// Ready reports whether name:tag has been made: nil, ErrPreparing while
// it is being made (or has not been asked for), or the error that making
// it ended with.
func (s *Store) Ready(name, tag string) error {
	key := name + ":" + tag
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tags == nil {
		s.tags = s.load()
	}
	if _, ok := s.tags[key]; ok {
		return nil
	}
	if err := s.failed[key]; err != nil {
		return err
	}
	return ErrPreparing
}

// Prepare starts making name:tag in the background, unless it is made or
// being made; ctx bounds the making.
func (s *Store) Prepare(ctx context.Context, name, tag string) {
	key := name + ":" + tag
	s.mu.Lock()
	if s.tags == nil {
		s.tags = s.load()
	}
	_, made := s.tags[key]
	if made || s.preparing[key] {
		s.mu.Unlock()
		return
	}
	if s.preparing == nil {
		s.preparing, s.failed = map[string]bool{}, map[string]error{}
	}
	s.preparing[key] = true
	delete(s.failed, key)
	s.mu.Unlock()
	go func() {
		_, err := s.Tag(ctx, name, tag)
		s.mu.Lock()
		delete(s.preparing, key)
		if err != nil && ctx.Err() == nil {
			s.failed[key] = err
		}
		s.mu.Unlock()
		if err != nil && ctx.Err() == nil {
			s.logger().Error("template image", "image", key, "err", err)
		}
	}()
}

var (
	nameShape   = regexp.MustCompile(`^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*$`)
	tagShape    = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)
	digestShape = regexp.MustCompile(`^sha256:[a-f0-9]{64}$`)
)

// Tag returns the manifest digest of name:tag, making and writing the
// image the first time.
func (s *Store) Tag(ctx context.Context, name, tag string) (v1.Hash, error) {
	key := name + ":" + tag
	s.mu.Lock()
	if s.tags == nil {
		s.tags = s.load()
	}
	if h, ok := s.tags[key]; ok {
		s.mu.Unlock()
		return h, nil
	}
	if s.building == nil {
		s.building = map[string]*sync.Mutex{}
	}
	b := s.building[key]
	if b == nil {
		b = &sync.Mutex{}
		s.building[key] = b
	}
	s.mu.Unlock()
	b.Lock()
	defer b.Unlock()
	s.mu.Lock()
	h, ok := s.tags[key]
	s.mu.Unlock()
	if ok {
		return h, nil
	}
	img, err := s.Build(ctx, name, tag)
	if s.Made != nil {
		defer s.Made(name, tag)
	}
	if err != nil {
		return v1.Hash{}, err
	}
	p, err := s.layout()
	if err != nil {
		return v1.Hash{}, err
	}
	// The blobs first, then the index entry naming them: a crash between
	// the two leaves blobs no tag names, never a tag without its blobs.
	s.indexMu.Lock()
	err = p.AppendImage(img, layout.WithAnnotations(map[string]string{refAnnotation: key}))
	s.indexMu.Unlock()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("writing image %s: %w", key, err)
	}
	h, err = img.Digest()
	if err != nil {
		return v1.Hash{}, err
	}
	s.mu.Lock()
	if s.tags == nil {
		s.tags = map[string]v1.Hash{}
	}
	s.tags[key] = h
	s.mu.Unlock()
	s.logger().Info("template image ready", "image", key, "digest", h.String())
	return h, nil
}

// refAnnotation names, in the layout's index, the name:tag an image was
// made for.
const refAnnotation = "org.opencontainers.image.ref.name"

// load reads the tags an earlier run wrote into the layout's index, so a
// restarted server serves the images it made rather than making them
// again. A tag names one build of a template: it is made once and kept.
func (s *Store) load() map[string]v1.Hash {
	tags := map[string]v1.Hash{}
	idx, err := layout.ImageIndexFromPath(s.Dir)
	if err != nil {
		return tags // no layout yet
	}
	m, err := idx.IndexManifest()
	if err != nil {
		s.logger().Warn("registry: unreadable index; images will be made again", "dir", s.Dir, "err", err)
		return tags
	}
	for _, d := range m.Manifests {
		if key := d.Annotations[refAnnotation]; key != "" && s.blob(d.Digest.String()) != "" {
			tags[key] = d.Digest
		}
	}
	return tags
}

func (s *Store) layout() (layout.Path, error) {
	if p, err := layout.FromPath(s.Dir); err == nil {
		return p, nil
	}
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return "", err
	}
	return layout.Write(s.Dir, empty.Index)
}

func (s *Store) logger() *slog.Logger {
	if s.Log == nil {
		return slog.Default()
	}
	return s.Log
}

// blob is the path of a blob the store holds, or "".
func (s *Store) blob(d string) string {
	if !digestShape.MatchString(d) {
		return ""
	}
	p := filepath.Join(s.Dir, "blobs", "sha256", strings.TrimPrefix(d, "sha256:"))
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// ServeHTTP answers the pull routes.
func (s *Store) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		apiError(w, http.StatusMethodNotAllowed, "UNSUPPORTED", "this registry serves pulls only")
		return
	}
	rest, ok := strings.CutPrefix(r.URL.Path, "/v2/")
	if !ok {
		apiError(w, http.StatusNotFound, "NAME_UNKNOWN", "not a registry path: "+r.URL.Path)
		return
	}
	if rest == "" {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte("{}"))
		return
	}
	if i := strings.LastIndex(rest, "/manifests/"); i > 0 {
		s.manifest(w, r, rest[:i], rest[i+len("/manifests/"):])
		return
	}
	if i := strings.LastIndex(rest, "/blobs/"); i > 0 {
		name, d := rest[:i], rest[i+len("/blobs/"):]
		if !nameShape.MatchString(name) {
			apiError(w, http.StatusBadRequest, "NAME_INVALID", fmt.Sprintf("invalid repository name %q", name))
			return
		}
		p := s.blob(d)
		if p == "" {
			apiError(w, http.StatusNotFound, "BLOB_UNKNOWN", fmt.Sprintf("blob %q unknown to this registry", d))
			return
		}
		w.Header().Set("Docker-Content-Digest", d)
		w.Header().Set("Content-Type", "application/octet-stream")
		http.ServeFile(w, r, p)
		return
	}
	apiError(w, http.StatusNotFound, "NAME_UNKNOWN", "no such route: "+r.URL.Path)
}

func (s *Store) manifest(w http.ResponseWriter, r *http.Request, name, ref string) {
	if !nameShape.MatchString(name) {
		apiError(w, http.StatusBadRequest, "NAME_INVALID", fmt.Sprintf("invalid repository name %q", name))
		return
	}
	d := ref
	if !digestShape.MatchString(ref) {
		if !tagShape.MatchString(ref) {
			apiError(w, http.StatusBadRequest, "TAG_INVALID", fmt.Sprintf("invalid tag %q", ref))
			return
		}
		if s.Background != nil {
			if err := s.Ready(name, ref); err != nil {
				s.Prepare(s.Background, name, ref)
				apiError(w, http.StatusNotFound, "MANIFEST_UNKNOWN", fmt.Sprintf("%s:%s: %v; try again later", name, ref, err))
				return
			}
		}
		h, err := s.Tag(r.Context(), name, ref)
		if errors.Is(err, ErrNotFound) {
			apiError(w, http.StatusNotFound, "MANIFEST_UNKNOWN", fmt.Sprintf("%s:%s: %v", name, ref, err))
			return
		}
		if err != nil {
			s.logger().Error("template image", "image", name+":"+ref, "err", err)
			apiError(w, http.StatusInternalServerError, "UNKNOWN", fmt.Sprintf("making the image %s:%s failed", name, ref))
			return
		}
		d = h.String()
	}
	p := s.blob(d)
	if p == "" {
		apiError(w, http.StatusNotFound, "MANIFEST_UNKNOWN", fmt.Sprintf("manifest %s unknown to this registry", d))
		return
	}
	b, err := os.ReadFile(p)
	if err != nil {
		apiError(w, http.StatusInternalServerError, "UNKNOWN", "reading the manifest failed")
		return
	}
	var m struct {
		MediaType string `json:"mediaType"`
	}
	if json.Unmarshal(b, &m) != nil || m.MediaType == "" || !strings.Contains(m.MediaType, "manifest") {
		apiError(w, http.StatusNotFound, "MANIFEST_UNKNOWN", fmt.Sprintf("%s is not a manifest", d))
		return
	}
	w.Header().Set("Content-Type", m.MediaType)
	w.Header().Set("Docker-Content-Digest", d)
	w.Header().Set("Content-Length", fmt.Sprint(len(b)))
	if r.Method == http.MethodHead {
		return
	}
	_, _ = w.Write(b)
}

func apiError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"errors": []map[string]string{{"code": code, "message": msg}}})
}
