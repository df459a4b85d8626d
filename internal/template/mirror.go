package template

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strings"
)

// MirrorEnv overrides the Debian mirror used to build templates.
const MirrorEnv = "AIRLOCK_DEBIAN_MIRROR"

// DefaultMirror is used when neither the environment nor the host's apt sources name one.
const DefaultMirror = "http://deb.debian.org/debian"

// DetectMirror returns the Debian mirror to build from: $AIRLOCK_DEBIAN_MIRROR, else the
// mirror the host's apt already uses, else DefaultMirror. Reusing the host's mirror
// matters on machines that can only reach a local or proxied mirror.
func DetectMirror() string {
	if m := strings.TrimSpace(os.Getenv(MirrorEnv)); m != "" {
		return m
	}
	if m := hostMirror("/"); m != "" {
		return m
	}
	return DefaultMirror
}

// hostMirror reads the apt sources under root: the deb822 file debian.sources first (the
// Debian 12 default), then the one-line sources.list. It returns "" when neither names a
// Debian archive.
func hostMirror(root string) string {
	if b, err := os.ReadFile(filepath.Join(root, "etc/apt/sources.list.d/debian.sources")); err == nil {
		if m := mirrorFromDeb822(b); m != "" {
			return m
		}
	}
	if b, err := os.ReadFile(filepath.Join(root, "etc/apt/sources.list")); err == nil {
		if m := mirrorFromSourcesList(b); m != "" {
			return m
		}
	}
	return ""
}

// mirrorFromDeb822 returns the first URI of the first enabled "deb" stanza that is not the
// security archive: the security archive has no "bookworm" suite, so debootstrap can't use it.
func mirrorFromDeb822(b []byte) string {
	for _, stanza := range bytes.Split(b, []byte("\n\n")) {
		fields := map[string]string{}
		sc := bufio.NewScanner(bytes.NewReader(stanza))
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue // continuation lines (Signed-By blocks) carry nothing we need
			}
			fields[strings.ToLower(strings.TrimSpace(k))] = strings.TrimSpace(v)
		}
		if !hasWord(fields["types"], "deb") || strings.EqualFold(fields["enabled"], "no") {
			continue
		}
		uris := strings.Fields(fields["uris"])
		if len(uris) == 0 || isSecurity(uris[0], strings.Fields(fields["suites"])) {
			continue
		}
		return strings.TrimRight(uris[0], "/")
	}
	return ""
}

// mirrorFromSourcesList returns the URI of the first "deb" line that is not the security
// archive, skipping any [option=value ...] block.
func mirrorFromSourcesList(b []byte) string {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = strings.TrimSpace(line[:i])
		}
		rest, ok := strings.CutPrefix(line, "deb ")
		if !ok {
			continue
		}
		rest = strings.TrimSpace(rest)
		if strings.HasPrefix(rest, "[") {
			end := strings.IndexByte(rest, ']')
			if end < 0 {
				continue
			}
			rest = rest[end+1:]
		}
		f := strings.Fields(rest)
		if len(f) < 2 || isSecurity(f[0], f[1:2]) {
			continue
		}
		return strings.TrimRight(f[0], "/")
	}
	return ""
}

func isSecurity(uri string, suites []string) bool {
	if strings.Contains(uri, "debian-security") {
		return true
	}
	for _, s := range suites {
		if !strings.HasSuffix(s, "-security") && !strings.HasSuffix(s, "/updates") {
			return false
		}
	}
	return len(suites) > 0
}

func hasWord(list, w string) bool {
	for _, f := range strings.Fields(list) {
		if f == w {
			return true
		}
	}
	return false
}
