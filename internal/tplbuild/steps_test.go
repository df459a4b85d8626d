package tplbuild

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
)

const testHash = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestConvert(t *testing.T) {
	spec := Spec{
		FromTemplate: "base",
		Steps: []Step{
			{Type: "COPY", Args: []string{"app/", "/opt/app", "", ""}, FilesHash: testHash},
			{Type: "ENV", Args: []string{"A", `say "hi" \ $HOME`, "B", "2"}},
			{Type: "WORKDIR", Args: []string{"/opt/app"}},
			{Type: "RUN", Args: []string{"apt-get install -y jq\necho done", "root"}},
			{Type: "USER", Args: []string{"alice"}},
			{Type: "RUN", Args: []string{"whoami"}},
			{Type: "COPY", Args: []string{"x.sh", "bin/", "bob:staff", "0755"}, FilesHash: testHash},
			{Type: "USER", Args: []string{"root"}},
		},
	}
	got, err := Convert(spec, "user")
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Join([]string{
		`FROM base`,
		`USER user`,
		`COPY --chown=user ["` + testHash + `/app","/opt/app"]`,
		`ENV A="say \"hi\" \\ $HOME" B="2"`,
		`WORKDIR /opt/app`,
		`USER root`,
		`RUN ["/bin/bash","-c","apt-get install -y jq\necho done"]`,
		`USER user`,
		`USER root`,
		`RUN ["/bin/sh","-c","id -u alice \u003e/dev/null 2\u003e\u00261 || useradd --create-home --shell /bin/bash alice"]`,
		`USER alice`,
		`RUN ["/bin/bash","-c","whoami"]`,
		`COPY --chown=bob:staff --chmod=755 ["` + testHash + `/x.sh","bin/"]`,
		`USER root`,
	}, "\n") + "\n"
	if got.Dockerfile != want {
		t.Errorf("Dockerfile:\n%s\nwant:\n%s", got.Dockerfile, want)
	}
	// Lines map back to the SDK's steps: the RUN of step 4 is line 7, the
	// useradd of step 5 line 10.
	for line, step := range map[int]int{1: 0, 3: 1, 7: 4, 8: 4, 10: 5, 12: 6, 13: 7} {
		if got.StepOfLine[line] != step {
			t.Errorf("line %d: step %d, want %d", line, got.StepOfLine[line], step)
		}
	}
	if len(got.Copies) != 2 || got.Copies[0].Src != "app/" || got.Copies[1].Dest != "bin/" || got.Copies[1].Step != 7 {
		t.Errorf("copies: %+v", got.Copies)
	}
}

func TestConvertSourceUserRoot(t *testing.T) {
	got, err := Convert(Spec{FromTemplate: "python3", Steps: []Step{
		{Type: "COPY", Args: []string{"f", "/f"}, FilesHash: testHash},
		{Type: "RUN", Args: []string{"true", "nobody"}},
	}}, "")
	if err != nil {
		t.Fatal(err)
	}
	want := "FROM python3\nCOPY [\"" + testHash + "/f\",\"/f\"]\nUSER nobody\nRUN [\"/bin/bash\",\"-c\",\"true\"]\nUSER root\n"
	if got.Dockerfile != want {
		t.Errorf("got\n%s\nwant\n%s", got.Dockerfile, want)
	}
}

func TestConvertRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec Spec
		msg  string
	}{
		{"unknown type", Spec{FromTemplate: "base", Steps: []Step{{Type: "ADD", Args: []string{"a", "b"}}}}, "unknown step type"},
		{"credentials without password", Spec{FromImage: "ubuntu:22.04", FromImageRegistry: []byte(`{"type":"registry","username":"u"}`)}, "username and a password"},
		{"aws credentials", Spec{FromImage: "1.dkr.ecr.us-east-1.amazonaws.com/x:1", FromImageRegistry: []byte(`{"type":"aws","awsAccessKeyId":"a"}`)}, `type "aws"`},
		{"gcp credentials", Spec{FromImage: "gcr.io/p/x:1", FromImageRegistry: []byte(`{"type":"gcp","serviceAccountJson":"{}"}`)}, "not supported"},
		{"odd credentials", Spec{FromImage: "ubuntu:22.04", FromImageRegistry: []byte(`{"type":"kerberos"}`)}, "unknown"},
		{"credentials not JSON", Spec{FromImage: "ubuntu:22.04", FromImageRegistry: []byte(`[1]`)}, "fromImageRegistry"},
		{"credentials for a template", Spec{FromTemplate: "base", FromImageRegistry: []byte(`{"type":"registry","username":"u","password":"p"}`)}, "needs fromImage"},
		{"credentials for base", Spec{FromImage: "e2bdev/base", FromImageRegistry: []byte(`{"type":"registry","username":"u","password":"p"}`)}, "not one"},
		{"both sources", Spec{FromImage: "ubuntu:22.04", FromTemplate: "base"}, "not both"},
		{"bad image", Spec{FromImage: "Ubuntu:22.04"}, "not an image reference"},
		{"image with space", Spec{FromImage: "ubuntu:22.04 AS x"}, "not an image reference"},
		{"no source", Spec{}, "fromTemplate or fromImage is required"},
		{"bad source", Spec{FromTemplate: "../x"}, "is not a template name"},
		{"env odd", Spec{FromTemplate: "base", Steps: []Step{{Type: "ENV", Args: []string{"A"}}}}, "key, value pairs"},
		{"env key", Spec{FromTemplate: "base", Steps: []Step{{Type: "ENV", Args: []string{"A B", "1"}}}}, "invalid variable name"},
		{"env newline", Spec{FromTemplate: "base", Steps: []Step{{Type: "ENV", Args: []string{"A", "1\n2"}}}}, "line break"},
		{"run empty", Spec{FromTemplate: "base", Steps: []Step{{Type: "RUN", Args: []string{" "}}}}, "args must be"},
		{"run user", Spec{FromTemplate: "base", Steps: []Step{{Type: "RUN", Args: []string{"x", "a b"}}}}, "invalid user"},
		{"user name", Spec{FromTemplate: "base", Steps: []Step{{Type: "USER", Args: []string{"x;rm"}}}}, "valid user name"},
		{"workdir newline", Spec{FromTemplate: "base", Steps: []Step{{Type: "WORKDIR", Args: []string{"/a\nRUN x"}}}}, "cannot carry"},
		{"copy no hash", Spec{FromTemplate: "base", Steps: []Step{{Type: "COPY", Args: []string{"a", "/b"}}}}, "filesHash"},
		{"copy escapes", Spec{FromTemplate: "base", Steps: []Step{{Type: "COPY", Args: []string{"../a", "/b"}, FilesHash: testHash}}}, "inside the template's context"},
		{"copy absolute", Spec{FromTemplate: "base", Steps: []Step{{Type: "COPY", Args: []string{"/etc", "/b"}, FilesHash: testHash}}}, "inside the template's context"},
		{"copy mode", Spec{FromTemplate: "base", Steps: []Step{{Type: "COPY", Args: []string{"a", "/b", "", "rwx"}, FilesHash: testHash}}}, "not octal"},
	} {
		_, err := Convert(tc.spec, "")
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v, want ErrInvalid with %q", tc.name, err, tc.msg)
		}
	}
}

func TestSource(t *testing.T) {
	for _, tc := range []struct {
		spec       Spec
		ref        string
		isTemplate bool
	}{
		{Spec{FromTemplate: "python3"}, "python3", true},
		{Spec{FromImage: "e2bdev/base"}, "base", true},
		{Spec{FromImage: "e2bdev/base:latest"}, "base", true},
		{Spec{FromImage: "ubuntu:22.04"}, "ubuntu:22.04", false},
		{Spec{FromImage: "ubuntu"}, "ubuntu:latest", false},
		{Spec{FromImage: "oven/bun"}, "oven/bun:latest", false},
		{Spec{FromImage: "debian:stable"}, "docker.io/library/debian:stable", false},
		{Spec{FromImage: "debian:bookworm"}, "debian:bookworm", false},
		{Spec{FromImage: "ghcr.io/owner/img:1"}, "ghcr.io/owner/img:1", false},
		{Spec{FromImage: "docker.io/e2bdev/base:latest"}, "docker.io/e2bdev/base:latest", false},
	} {
		ref, isTemplate, err := Source(tc.spec)
		if err != nil || ref != tc.ref || isTemplate != tc.isTemplate {
			t.Errorf("%+v: %q %v %v, want %q %v", tc.spec, ref, isTemplate, err, tc.ref, tc.isTemplate)
		}
	}
	// Files on the server are the operator's to import, not an API key's.
	for _, img := range []string{"oci:/var/lib/airlock/layout", "oci:/tmp/x@sha256:00", "docker-archive:/root/image.tar", "docker-archive:/etc/shadow:x:1"} {
		if _, _, err := Source(Spec{FromImage: img}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "file on the server") {
			t.Errorf("fromImage %q: %v", img, err)
		}
	}
	got, err := Convert(Spec{FromImage: "ubuntu:22.04", Steps: []Step{{Type: "RUN", Args: []string{"true"}}}}, "")
	if err != nil || got.Dockerfile != "FROM ubuntu:22.04\nRUN [\"/bin/bash\",\"-c\",\"true\"]\n" {
		t.Errorf("fromImage: %q %v", got.Dockerfile, err)
	}
}

func TestConvertForce(t *testing.T) {
	steps := []Step{
		{Type: "RUN", Args: []string{"a"}},
		{Type: "RUN", Args: []string{"b", "root"}, Force: true},
		{Type: "RUN", Args: []string{"c"}, Force: true},
	}
	got, err := Convert(Spec{FromTemplate: "base", Steps: steps}, "user")
	if err != nil {
		t.Fatal(err)
	}
	// FROM, USER user, RUN a, then step 2 from line 4 (USER root, RUN b, USER user).
	if got.NoCacheFromLine != 4 || got.StepOfLine[4] != 2 {
		t.Errorf("NoCacheFromLine %d\n%s", got.NoCacheFromLine, got.Dockerfile)
	}
	if got, _ := Convert(Spec{FromTemplate: "base", Steps: steps[:1]}, "user"); got.NoCacheFromLine != 0 {
		t.Errorf("no force: NoCacheFromLine %d", got.NoCacheFromLine)
	}
	if got, _ := Convert(Spec{FromTemplate: "base", Force: true, Steps: steps[:1]}, "user"); got.NoCacheFromLine != 1 {
		t.Errorf("template force: NoCacheFromLine %d", got.NoCacheFromLine)
	}
}

// A COPY whose source is a pattern copies the pattern's fixed prefix (the
// upload holds only the matches, below it) into dest as a directory, so
// that matched symlinks stay links as E2B keeps them.
func TestConvertCopyPattern(t *testing.T) {
	cases := []struct{ src, dest, want string }{
		{"folder/*", "folder", `["` + testHash + `/folder/","folder/"]`},
		{"src/**/*.py", "/app/", `["` + testHash + `/src/","/app/"]`},
		{"*.txt", "/data", `["` + testHash + `/","/data/"]`},
		{"a/b/file[12].txt", "x", `["` + testHash + `/a/b/","x/"]`},
		{"a/b/plain.txt", "x", `["` + testHash + `/a/b/plain.txt","x"]`},
	}
	for _, c := range cases {
		got, err := Convert(Spec{FromTemplate: "base", Steps: []Step{{Type: "COPY", Args: []string{c.src, c.dest}, FilesHash: testHash}}}, "")
		if err != nil {
			t.Fatalf("%s: %v", c.src, err)
		}
		line := strings.Split(got.Dockerfile, "\n")[1]
		if line != "COPY "+c.want {
			t.Errorf("%s → %s: %s, want COPY %s", c.src, c.dest, line, c.want)
		}
		// The hash is of what the SDK sent: the pattern and dest as given.
		if got.Copies[0].Src != c.src || got.Copies[0].Dest != c.dest {
			t.Errorf("%s: copy %+v", c.src, got.Copies[0])
		}
	}
}

// fromImage's basic-auth credentials become a keychain that answers them for
// the image's registry only.
func TestConvertCredentials(t *testing.T) {
	spec := Spec{FromImage: "registry.example:5000/team/tool:1", FromImageRegistry: []byte(`{"type":"registry","username":"u","password":"p"}`)}
	got, err := Convert(spec, "")
	if err != nil {
		t.Fatal(err)
	}
	if got.Keychain == nil {
		t.Fatal("no keychain")
	}
	if got.Dockerfile != "FROM registry.example:5000/team/tool:1\n" {
		t.Errorf("Dockerfile (no credentials in it): %q", got.Dockerfile)
	}
	for reg, want := range map[string]bool{"registry.example:5000": true, "index.docker.io": false} {
		r, err := name.NewRegistry(reg)
		if err != nil {
			t.Fatal(err)
		}
		a, err := got.Keychain.Resolve(r)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := a.Authorization()
		if err != nil {
			t.Fatal(err)
		}
		if has := cfg.Username == "u" && cfg.Password == "p"; has != want {
			t.Errorf("%s: credentials given = %v, want %v", reg, has, want)
		}
	}
	if plain, err := Convert(Spec{FromImage: "ubuntu:22.04"}, ""); err != nil || plain.Keychain != nil {
		t.Errorf("no credentials: keychain %v, err %v", plain.Keychain, err)
	}
}
