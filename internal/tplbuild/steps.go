// Package tplbuild runs template builds asked for through the E2B API
// (Template.build in the SDKs): it keeps the files the SDK uploads, turns the
// SDK's steps into a Dockerfile for Airlock's one builder (template.Store.Build),
// and runs each build as a job with a status and a log clients poll.
package tplbuild

import (
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"regexp"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"

	"github.com/airlock-sandbox/airlock/internal/ociimage"
)

// ErrInvalid marks a request the client must fix (a 400 on the wire).
var ErrInvalid = errors.New("invalid template build")

// ErrNotFound marks an unknown template or build id (a 404 on the wire).
var ErrNotFound = errors.New("template build not found")

// Step is one instruction of the SDK's template (the upstream TemplateStep).
type Step struct {
	Type      string   `json:"type"`
	Args      []string `json:"args"`
	FilesHash string   `json:"filesHash,omitempty"`
	Force     bool     `json:"force,omitempty"`
}

// Spec is what the SDK sends to start a build (upstream TemplateBuildStartV2).
type Spec struct {
	FromTemplate string `json:"fromTemplate,omitempty"`
	FromImage    string `json:"fromImage,omitempty"`
	// FromImageRegistry is upstream's credentials for fromImage: only
	// type "registry" (username, password) is taken (see Credentials).
	FromImageRegistry json.RawMessage `json:"fromImageRegistry,omitempty"`
	Force             bool            `json:"force,omitempty"`
	Steps             []Step          `json:"steps"`
	StartCmd          string          `json:"startCmd,omitempty"`
	ReadyCmd          string          `json:"readyCmd,omitempty"`
}

// Converted is a Spec as Airlock's builder takes it.
type Converted struct {
	Dockerfile string
	// StepOfLine maps a Dockerfile line to the SDK step (1-based) it came
	// from, so a failing line is reported as the step the SDK points at.
	StepOfLine map[int]int
	// Copies are the COPY steps' file hashes, in order: the uploads the build
	// context is assembled from (each under a directory named by its hash).
	Copies []Copy
	// NoCacheFromLine is the first Dockerfile line built without the layer
	// cache (template.BuildRequest.NoCacheFromLine): the first step with
	// force (the SDK's skipCache() sets it on that step and every later
	// one), or 1 for a whole-template force; 0 when the cache is used.
	NoCacheFromLine int
	// Keychain has fromImage's registry credentials (nil without any):
	// template.BuildRequest.Keychain. It never goes into a record or log.
	Keychain authn.Keychain
}

// Copy is one COPY step's upload: its hash and the src/dest the SDK hashed.
type Copy struct {
	Step      int
	Hash      string
	Src, Dest string
}

var (
	validEnvKey = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	validHash   = regexp.MustCompile(`^[0-9a-f]{64}$`)
	// validUser is what useradd and --chown accept without quoting.
	validUser = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}$`)
	validMode = regexp.MustCompile(`^0?[0-7]{3,4}$`)
)

// ValidHash reports whether h looks like the SDK's files hash (hex sha256).
func ValidHash(h string) bool { return validHash.MatchString(h) }

// Convert turns the SDK's steps into a Dockerfile. sourceUser is the user the
// steps start as (the source template's default user): a RUN with its own
// user and a COPY without one need the user in effect, which E2B tracks the
// same way.
//
// The mapping follows what E2B's builder does with each step:
//   - RUN [cmd, user?]: bash -c cmd, as user for this step only.
//   - ENV [k1, v1, k2, v2...]: ENV; $VAR in values expands, as upstream.
//   - WORKDIR [path]: WORKDIR (created if missing).
//   - USER [name]: the user is created (useradd, home, bash) when missing,
//     then USER.
//   - COPY [src, dest, user?, mode?]: COPY from the upload's directory in
//     the build context, owned by user (default: the user in effect), mode
//     applied when given.
//
// Every line is written in a form that needs no quoting of the SDK's text
// (JSON arrays, quoted ENV values), and text that cannot be written safely
// (newlines in a path, odd user names) is refused with ErrInvalid.
func Convert(spec Spec, sourceUser string) (Converted, error) {
	from, _, err := Source(spec)
	if err != nil {
		return Converted{}, err
	}
	kc, err := Credentials(spec, from)
	if err != nil {
		return Converted{}, err
	}
	out := Converted{StepOfLine: map[int]int{}, Keychain: kc}
	var lines []string
	emit := func(step int, l string) {
		lines = append(lines, l)
		out.StepOfLine[len(lines)] = step
	}
	emit(0, "FROM "+from)
	if sourceUser != "" {
		emit(0, "USER "+sourceUser)
	}
	user := sourceUser
	if spec.Force {
		out.NoCacheFromLine = 1
	}
	for i, st := range spec.Steps {
		n := i + 1
		if st.Force && out.NoCacheFromLine == 0 {
			out.NoCacheFromLine = len(lines) + 1
		}
		bad := func(format string, a ...any) error {
			return fmt.Errorf("%w: step %d (%s): %s", ErrInvalid, n, st.Type, fmt.Sprintf(format, a...))
		}
		switch strings.ToUpper(st.Type) {
		case "RUN":
			if len(st.Args) < 1 || len(st.Args) > 2 || strings.TrimSpace(st.Args[0]) == "" {
				return Converted{}, bad("args must be [command] or [command, user]")
			}
			run := "RUN " + jsonArray("/bin/bash", "-c", st.Args[0])
			if len(st.Args) == 2 && st.Args[1] != "" && st.Args[1] != user {
				if !validUser.MatchString(st.Args[1]) {
					return Converted{}, bad("invalid user %q", st.Args[1])
				}
				emit(n, "USER "+st.Args[1])
				emit(n, run)
				emit(n, "USER "+orRoot(user))
				continue
			}
			emit(n, run)
		case "ENV":
			if len(st.Args) == 0 || len(st.Args)%2 != 0 {
				return Converted{}, bad("args must be key, value pairs")
			}
			var kv []string
			for j := 0; j < len(st.Args); j += 2 {
				k, v := st.Args[j], st.Args[j+1]
				if !validEnvKey.MatchString(k) {
					return Converted{}, bad("invalid variable name %q", k)
				}
				if strings.ContainsAny(v, "\n\r") {
					return Converted{}, bad("the value of %s has a line break", k)
				}
				kv = append(kv, k+"="+envQuote(v))
			}
			emit(n, "ENV "+strings.Join(kv, " "))
		case "WORKDIR":
			if len(st.Args) != 1 || st.Args[0] == "" {
				return Converted{}, bad("args must be [path]")
			}
			if strings.ContainsAny(st.Args[0], "\n\r\\$") {
				return Converted{}, bad("path %q has characters a WORKDIR cannot carry", st.Args[0])
			}
			emit(n, "WORKDIR "+st.Args[0])
		case "USER":
			// Upstream's second arg (add to sudoers) is not supported: Airlock's
			// sandboxes give every user sudo already.
			if len(st.Args) < 1 || len(st.Args) > 2 || !validUser.MatchString(st.Args[0]) {
				return Converted{}, bad("args must be [user] with a valid user name")
			}
			u := st.Args[0]
			if u != "root" {
				emit(n, "USER root")
				emit(n, "RUN "+jsonArray("/bin/sh", "-c", "id -u "+u+" >/dev/null 2>&1 || useradd --create-home --shell /bin/bash "+u))
			}
			emit(n, "USER "+u)
			user = u
		case "COPY":
			if len(st.Args) < 2 || len(st.Args) > 4 {
				return Converted{}, bad("args must be [src, dest, user?, mode?]")
			}
			src, dest := st.Args[0], st.Args[1]
			if !ValidHash(st.FilesHash) {
				return Converted{}, bad("filesHash must be a hex sha256, got %q", st.FilesHash)
			}
			clean := path.Clean(src)
			if src == "" || path.IsAbs(src) || clean == ".." || strings.HasPrefix(clean, "../") || strings.ContainsAny(src, "\n\r") {
				return Converted{}, bad("src %q must be a path inside the template's context", src)
			}
			if dest == "" || strings.ContainsAny(dest, "\n\r") {
				return Converted{}, bad("invalid dest %q", dest)
			}
			flags := ""
			owner := user
			if len(st.Args) > 2 && st.Args[2] != "" {
				owner = st.Args[2]
			}
			if owner != "" {
				// E2B's form is user or user:group; both are --chown's.
				for _, part := range strings.SplitN(owner, ":", 2) {
					if !validUser.MatchString(part) {
						return Converted{}, bad("invalid owner %q", owner)
					}
				}
				flags += " --chown=" + owner
			}
			if len(st.Args) > 3 && st.Args[3] != "" {
				if !validMode.MatchString(st.Args[3]) {
					return Converted{}, bad("mode %q is not octal", st.Args[3])
				}
				flags += " --chmod=" + strings.TrimPrefix(st.Args[3], "0")
			}
			// A relative dest is relative to WORKDIR in both E2B and Docker.
			from, to := st.FilesHash+"/"+clean, dest
			if base, ok := globBase(clean); ok {
				// A pattern (folder/*, src/**/*.py): the upload holds
				// only the matches, under the pattern's fixed prefix, so
				// that directory is copied and its content merged into
				// dest, as E2B does. Copying the matches one by one, as
				// Docker's COPY of a pattern does, would follow a
				// matched symlink (and refuse an absolute one) where
				// E2B keeps the link as uploaded.
				from = st.FilesHash + "/"
				if base != "." {
					from += base + "/"
				}
				if !strings.HasSuffix(to, "/") {
					to += "/"
				}
			}
			emit(n, "COPY"+flags+" "+jsonArray(from, to))
			out.Copies = append(out.Copies, Copy{Step: n, Hash: st.FilesHash, Src: src, Dest: dest})
		default:
			return Converted{}, bad("unknown step type (Airlock supports COPY, ENV, RUN, WORKDIR, USER)")
		}
	}
	out.Dockerfile = strings.Join(lines, "\n") + "\n"
	return out, nil
}

// globBase splits a COPY source with glob characters at its fixed prefix:
// the directories before the first component with a wildcard ("." when
// that is the first one). ok is false for a source without wildcards. The
// SDK matches sources with glob semantics (*, ?, [...], **); a backslash
// escapes, as in path.Match, so it counts as a wildcard here too: such a
// source is never a plain path.
func globBase(src string) (base string, ok bool) {
	parts := strings.Split(src, "/")
	for i, p := range parts {
		if strings.ContainsAny(p, `*?[\`) {
			if i == 0 {
				return ".", true
			}
			return strings.Join(parts[:i], "/"), true
		}
	}
	return "", false
}

func orRoot(u string) string {
	if u == "" {
		return "root"
	}
	return u
}

// jsonArray writes a Dockerfile exec-form array; JSON escaping is the quoting
// the Dockerfile parser reads back.
func jsonArray(words ...string) string {
	b, _ := json.Marshal(words) // strings always marshal
	return string(b)
}

// envQuote double-quotes an ENV value. Backslash and quote are escaped; $
// stays, so $PATH in a value expands as it does upstream.
func envQuote(v string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`)
	return `"` + r.Replace(v) + `"`
}

// registryConfig is upstream's FromImageRegistry: a oneOf on type.
type registryConfig struct {
	Type     string `json:"type"`
	Username string `json:"username"`
	Password string `json:"password"`
}

// Credentials returns a keychain with fromImage's registry credentials
// (upstream's fromImageRegistry) for the registry of from, the image
// Source resolved; nil when the spec has none. Only type "registry" (HTTP
// basic auth: username and password, which the SDK's fromImage(image,
// {username, password}) sends) is supported. "aws" and "gcp" need those
// clouds' token exchanges, which Airlock does not do: a 400 that says so.
// The credentials go to that registry only, not to a registry mirror the
// server redirects it to (the mirror is the operator's, with its own
// credentials in the docker config file).
func Credentials(spec Spec, from string) (authn.Keychain, error) {
	if len(spec.FromImageRegistry) == 0 || string(spec.FromImageRegistry) == "null" {
		return nil, nil
	}
	var rc registryConfig
	if err := json.Unmarshal(spec.FromImageRegistry, &rc); err != nil {
		return nil, fmt.Errorf("%w: fromImageRegistry: %w", ErrInvalid, err)
	}
	switch rc.Type {
	case "registry":
	case "aws", "gcp":
		return nil, fmt.Errorf("%w: fromImageRegistry type %q (fromAWSRegistry/fromGCPRegistry) is not supported by Airlock; give the registry's username and password (fromImage(image, {username, password})) or pull through a registry mirror the server is configured with (airlock serve --registry-mirror)", ErrInvalid, rc.Type)
	default:
		return nil, fmt.Errorf("%w: fromImageRegistry type %q is unknown (want registry)", ErrInvalid, rc.Type)
	}
	if rc.Username == "" || rc.Password == "" {
		return nil, fmt.Errorf("%w: fromImageRegistry needs a username and a password", ErrInvalid)
	}
	if !ociimage.IsImageRef(from) && !ociimage.IsDockerHubRef(from) {
		return nil, fmt.Errorf("%w: registry credentials are for a registry image; %s is not one", ErrInvalid, spec.FromImage)
	}
	kc, err := ociimage.BasicAuthFor(from, rc.Username, rc.Password)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return kc, nil
}

// validRef is a template reference Airlock can resolve in FROM: a name, with
// an optional ":tag" (the builder takes name:tag as that build of a user
// template).
func validRef(s string) bool {
	return regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}(:[a-z0-9_.-]{1,128})?$`).MatchString(s)
}

// E2BBaseImage is the image the SDK's fromBaseImage() (and a Template() with
// no from at all) asks for.
const E2BBaseImage = "e2bdev/base"

// BaseTemplate is the built-in template E2BBaseImage stands for.
const BaseTemplate = "base"

// Source returns what the build's FROM line names and whether it is a
// template (rather than an image pulled through ociimage, with the store's
// registry mirrors).
//
// e2bdev/base (any tag) is Airlock's built-in base template, not a pull:
// both are the same kind of image (Debian with python, node, git, sudo and a
// "user" with passwordless sudo, which is what E2B's steps and sandboxes
// expect), the base template is built locally with debootstrap and is there
// on every Airlock host, and pulling E2B's image would need Docker Hub or a
// mirror that carries it, which a host without a registry does not have.
// Whoever wants E2B's own image can name it with a registry host
// (docker.io/e2bdev/base:latest) and it is pulled like any image.
func Source(spec Spec) (ref string, isTemplate bool, err error) {
	if len(spec.FromImageRegistry) > 0 && spec.FromImage == "" {
		return "", false, fmt.Errorf("%w: fromImageRegistry (registry credentials) needs fromImage", ErrInvalid)
	}
	switch {
	case spec.FromImage != "" && spec.FromTemplate != "":
		return "", false, fmt.Errorf("%w: give fromImage or fromTemplate, not both", ErrInvalid)
	case spec.FromTemplate != "":
		if !validRef(spec.FromTemplate) {
			return "", false, fmt.Errorf("%w: fromTemplate %q is not a template name", ErrInvalid, spec.FromTemplate)
		}
		return spec.FromTemplate, true, nil
	case spec.FromImage == "":
		return "", false, fmt.Errorf("%w: fromTemplate or fromImage is required", ErrInvalid)
	}
	img := spec.FromImage
	if strings.ContainsAny(img, " \t\n\r") {
		return "", false, fmt.Errorf("%w: fromImage %q is not an image reference", ErrInvalid, img)
	}
	// The builder also reads oci:<dir> and docker-archive:<file> from the
	// host's disk, which is the operator's to name, never an API key's.
	if ociimage.IsLocalRef(img) {
		return "", false, fmt.Errorf("%w: fromImage %q names a file on the server; name an image in a registry (ubuntu:22.04, ghcr.io/owner/image:tag)", ErrInvalid, img)
	}
	if repo, _, _ := strings.Cut(img, ":"); repo == E2BBaseImage {
		return BaseTemplate, true, nil
	}
	// Docker reads a name without tag or digest as :latest; Airlock's builder
	// reads a bare name as a template's, so the tag is written out.
	if !ociimage.IsImageRef(img) && !strings.ContainsAny(path.Base(img), ":@") {
		img += ":latest"
	}
	// Airlock builds only debian:bookworm[-slim] itself and refuses other
	// debian: short names (so that a typo there does not pull); the SDK's
	// fromDebianImage() means Docker Hub's image, so it is named in full.
	if strings.HasPrefix(img, "debian:") && img != "debian:bookworm" && img != "debian:bookworm-slim" {
		img = "docker.io/library/" + img
	}
	if !ociimage.IsImageRef(img) && !ociimage.IsDockerHubRef(img) {
		return "", false, fmt.Errorf("%w: fromImage %q is not an image reference (ubuntu:22.04, docker.io/library/ubuntu:22.04, ghcr.io/owner/image:tag)", ErrInvalid, spec.FromImage)
	}
	return img, false, nil
}
