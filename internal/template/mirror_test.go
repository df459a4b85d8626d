package template

import (
	"os"
	"path/filepath"
	"testing"
)

// debianSources is /etc/apt/sources.list.d/debian.sources as Debian 12 cloud images
// ship it, with the security stanza first to show it is skipped.
const debianSources = `Types: deb
# http://snapshot.debian.org/archive/debian-security/20250520T000000Z
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://src.example/debian
Suites: bookworm
Components: main

Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://mirror.example/debian/ http://second.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By:
 -----BEGIN PGP PUBLIC KEY BLOCK-----
 .
 -----END PGP PUBLIC KEY BLOCK-----
`

func TestMirrorFromDeb822(t *testing.T) {
	if got := mirrorFromDeb822([]byte(debianSources)); got != "http://mirror.example/debian" {
		t.Errorf("got %q", got)
	}
	disabled := "Types: deb\nURIs: http://off.example/debian\nSuites: bookworm\nEnabled: no\n"
	if got := mirrorFromDeb822([]byte(disabled)); got != "" {
		t.Errorf("disabled stanza: got %q", got)
	}
}

func TestMirrorFromSourcesList(t *testing.T) {
	list := `# deb http://commented.example/debian bookworm main
deb-src http://src.example/debian bookworm main
deb http://security.debian.org/debian-security bookworm-security main
deb [arch=amd64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://opts.example/debian/ bookworm main
deb http://later.example/debian bookworm main
`
	if got := mirrorFromSourcesList([]byte(list)); got != "http://opts.example/debian" {
		t.Errorf("got %q", got)
	}
	if got := mirrorFromSourcesList([]byte("deb http://old.example/debian bookworm/updates main\n")); got != "" {
		t.Errorf("security-only list: got %q", got)
	}
}

func TestHostMirrorOrder(t *testing.T) {
	root := t.TempDir()
	write := func(rel, content string) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got := hostMirror(root); got != "" {
		t.Errorf("no sources: got %q", got)
	}
	write("etc/apt/sources.list", "deb http://list.example/debian bookworm main\n")
	if got := hostMirror(root); got != "http://list.example/debian" {
		t.Errorf("sources.list only: got %q", got)
	}
	write("etc/apt/sources.list.d/debian.sources", debianSources)
	if got := hostMirror(root); got != "http://mirror.example/debian" {
		t.Errorf("debian.sources wins: got %q", got)
	}
}

func TestDetectMirrorEnvOverride(t *testing.T) {
	t.Setenv(MirrorEnv, "http://override.example/debian")
	if got := DetectMirror(); got != "http://override.example/debian" {
		t.Errorf("got %q", got)
	}
	t.Setenv(MirrorEnv, "")
	if got := DetectMirror(); got == "" {
		t.Error("empty mirror without override")
	}
}
