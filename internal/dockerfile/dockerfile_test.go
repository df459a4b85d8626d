package dockerfile

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func parse(t *testing.T, src string) *File {
	t.Helper()
	f, err := Parse(strings.NewReader(src))
	if err != nil {
		t.Fatalf("Parse(%q): %v", src, err)
	}
	return f
}

func plan(t *testing.T, src string, base Config, buildArgs map[string]string) ([]Step, Config) {
	t.Helper()
	steps, final, err := parse(t, src).Plan(base, buildArgs)
	if err != nil {
		t.Fatalf("Plan(%q): %v", src, err)
	}
	return steps, final
}

func TestParseErrors(t *testing.T) {
	cases := []struct {
		name string
		src  string
		line int
		msg  string // substring of the message
	}{
		{"empty", "", 0, "empty"},
		{"only comments", "# a\n\n# b\n", 0, "empty"},
		{"no FROM", "ARG A=1\n", 0, "no FROM"},
		{"RUN before FROM", "ARG A\nRUN true\nFROM x\n", 2, "RUN before FROM"},
		{"two FROMs", "FROM a\nRUN true\nFROM b\n", 3, "multi-stage builds are not supported"},
		{"CMD", "FROM a\n\nCMD [\"x\"]\n", 3, "use start_cmd in airlock.toml"},
		{"ENTRYPOINT", "FROM a\nENTRYPOINT x\n", 2, "use start_cmd in airlock.toml"},
		{"LABEL", "FROM a\nLABEL a=b\n", 2, "LABEL is not supported (supported: FROM, RUN, COPY, ADD, ENV, ARG, WORKDIR, USER)"},
		{"unknown", "FROM a\nFROB x\n", 2, `unknown instruction "FROB" (supported: FROM, RUN`},
		{"ADD URL", "FROM a\nADD https://example.com/x.tgz /x\n", 2, "use RUN curl"},
		{"COPY --from", "FROM a\nCOPY --from=builder /a /b\n", 2, "COPY --from is not supported"},
		{"COPY --link", "FROM a\nCOPY --link a /b\n", 2, "COPY does not support the flag --link (supported: --chown, --chmod)"},
		{"RUN --mount", "FROM a\nRUN --mount=type=cache,target=/x true\n", 2, "RUN does not support the flag --mount"},
		{"FROM --platform", "FROM --platform=linux/arm64 a\n", 1, "FROM does not support the flag --platform"},
		{"FROM two words", "FROM a b\n", 1, "FROM takes one image"},
		{"COPY one arg", "FROM a\nCOPY a\n", 2, "at least one source and a destination"},
		{"COPY chown no value", "FROM a\nCOPY --chown a /b\n", 2, "--chown needs a value"},
		{"COPY twice chmod", "FROM a\nCOPY --chmod=1 --chmod=2 a /b\n", 2, "given twice"},
		{"RUN empty", "FROM a\nRUN\n", 2, "RUN needs a command"},
		{"RUN empty JSON", "FROM a\nRUN []\n", 2, "RUN needs a command"},
		{"RUN bad JSON", "FROM a\nRUN [\"a\", 1]\n", 2, "strings only"},
		{"ENV no value", "FROM a\nENV A\n", 2, "ENV must have two arguments"},
		{"ENV empty", "FROM a\nENV\n", 2, "ENV needs name=value"},
		{"ENV no name", "FROM a\nENV =x\n", 2, "variable name"},
		{"ARG empty", "FROM a\nARG\n", 2, "ARG needs a name"},
		{"WORKDIR empty", "FROM a\nWORKDIR\n", 2, "WORKDIR needs a directory"},
		{"USER empty", "FROM a\nUSER\n", 2, "USER needs"},
		{"unterminated heredoc", "FROM a\nRUN <<EOF\necho\n", 2, "unterminated heredoc"},
		{"shebang heredoc", "FROM a\nRUN <<EOF\n#!/usr/bin/python3\nprint(1)\nEOF\n", 2, "#! interpreter"},
		{"COPY heredoc", "FROM a\nCOPY <<EOF /x\nhi\nEOF\n", 2, "heredocs in COPY are not supported"},
		{
			"line after continuations and comments",
			"# syntax=docker/dockerfile:1\nFROM a\n# comment\nRUN echo a \\\n  # inner comment\n  b \\\n\n  c\n\nEXPOSE 80\n", 10, "EXPOSE is not supported",
		},
		{
			"error inside a continued instruction is at its first line",
			"FROM a\nRUN true\nCOPY \\\n  --from=x \\\n  a /b\n", 3, "COPY --from",
		},
		{"heredoc lines count", "FROM a\nRUN <<EOF\none\ntwo\nEOF\nVOLUME /x\n", 6, "VOLUME is not supported"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(strings.NewReader(c.src))
			var de *Error
			if !errors.As(err, &de) {
				t.Fatalf("err = %v (%T), want *Error", err, err)
			}
			if de.Line != c.line || !strings.Contains(de.Msg, c.msg) {
				t.Fatalf("got line %d %q, want line %d containing %q", de.Line, de.Msg, c.line, c.msg)
			}
			if c.line > 0 && !strings.HasPrefix(err.Error(), "Dockerfile line ") {
				t.Fatalf("Error() = %q", err.Error())
			}
		})
	}
}

func TestErrorString(t *testing.T) {
	if got := (&Error{Line: 7, Msg: "boom"}).Error(); got != "Dockerfile line 7: boom" {
		t.Fatal(got)
	}
	if got := (&Error{Msg: "boom"}).Error(); got != "Dockerfile: boom" {
		t.Fatal(got)
	}
}

func TestPlanInstructions(t *testing.T) {
	base := Config{Env: []string{"PATH=/usr/bin:/bin", "HOME=/root"}}
	src := `FROM base
RUN apt-get update && \
    apt-get install -y curl
RUN ["echo", "$HOME", "exec form"]
ENV A=1 B="two words" C=$HOME
ENV LEGACY hello   world
ENV PATH=/opt/bin:$PATH
WORKDIR app
WORKDIR /srv/$A
WORKDIR sub/../data
USER user:$A
COPY --chown=user:grp --chmod=0640 a.txt b/ ./
COPY x rel/y
COPY x /abs/dir/
COPY . .
ADD ["arch ive.tar", "/opt/"]
`
	steps, final := plan(t, src, base, nil)
	type want struct {
		kind    StepKind
		line    int
		args    []string
		sources []string
		dest    string
	}
	wants := []want{
		{StepRun, 2, []string{"/bin/sh", "-c", "apt-get update &&     apt-get install -y curl"}, nil, ""},
		{StepRun, 4, []string{"echo", "$HOME", "exec form"}, nil, ""},
		{StepWorkdir, 8, nil, nil, "/app"},
		{StepWorkdir, 9, nil, nil, "/srv/1"},
		{StepWorkdir, 10, nil, nil, "/srv/1/data"},
		{StepCopy, 12, nil, []string{"a.txt", "b/"}, "/srv/1/data/"},
		{StepCopy, 13, nil, []string{"x"}, "/srv/1/data/rel/y"},
		{StepCopy, 14, nil, []string{"x"}, "/abs/dir/"},
		{StepCopy, 15, nil, []string{"."}, "/srv/1/data/"},
		{StepCopy, 16, nil, []string{"arch ive.tar"}, "/opt/"},
	}
	if len(steps) != len(wants) {
		t.Fatalf("got %d steps: %+v", len(steps), steps)
	}
	for i, w := range wants {
		s := steps[i]
		if s.Kind != w.kind || s.Line != w.line || !reflect.DeepEqual(s.Args, w.args) ||
			!reflect.DeepEqual(s.Sources, w.sources) || s.Dest != w.dest {
			t.Errorf("step %d = %+v, want %+v", i, s, w)
		}
		if s.CacheText == "" || strings.Contains(s.CacheText, "\"line\"") {
			t.Errorf("step %d CacheText %q", i, s.CacheText)
		}
	}
	if got := steps[5]; got.Chown != "user:grp" || got.Chmod != "0640" || got.Add {
		t.Errorf("COPY flags: %+v", got)
	}
	if !steps[9].Add {
		t.Errorf("ADD not marked: %+v", steps[9])
	}
	if steps[0].Text != "RUN apt-get update &&     apt-get install -y curl" {
		t.Errorf("Text = %q", steps[0].Text)
	}
	wantEnv := []string{"PATH=/opt/bin:/usr/bin:/bin", "HOME=/root", "A=1", "B=two words", "C=/root", "LEGACY=hello   world"}
	if !reflect.DeepEqual(final.Env, wantEnv) {
		t.Errorf("final env = %q\nwant %q", final.Env, wantEnv)
	}
	if final.User != "user:1" || final.Workdir != "/srv/1/data" {
		t.Errorf("final = %+v", final)
	}
	// Config per step: the first RUN sees the base config.
	if !reflect.DeepEqual(steps[0].Config, Config{Env: base.Env, Workdir: "/"}) {
		t.Errorf("step 0 config = %+v", steps[0].Config)
	}
	// The WORKDIR step runs with the user in effect before USER.
	if steps[2].Config.User != "" || steps[5].Config.User != "user:1" {
		t.Errorf("users: %q %q", steps[2].Config.User, steps[5].Config.User)
	}
}

func TestExpansion(t *testing.T) {
	cases := []struct{ in, want string }{
		{`$A`, "a"},
		{`${A}x`, "ax"},
		{`${UNSET:-def}`, "def"},
		{`${A:-def}`, "a"},
		{`${A:+alt}`, "alt"},
		{`${UNSET:+alt}`, ""},
		{`'$A'`, "$A"},
		{`"$A b"`, "a b"},
		{`\$A`, "$A"},
		{`${EMPTY:-e}`, "e"},
		{`${EMPTY-e}`, ""},
		{`$UNSET.`, "."},
		{`${A#a}`, ""},
	}
	for _, c := range cases {
		src := "FROM x\nENV A=a EMPTY=\nENV R=" + c.in + "\n"
		_, final := plan(t, src, Config{}, nil)
		got := final.Env[len(final.Env)-1]
		if got != "R="+c.want {
			t.Errorf("ENV R=%s gave %q, want %q", c.in, got, "R="+c.want)
		}
	}
	// ${VAR:?msg} fails with the instruction's line.
	_, _, err := parse(t, "FROM x\n\nWORKDIR ${NOPE:?must be set}\n").Plan(Config{}, nil)
	var de *Error
	if !errors.As(err, &de) || de.Line != 3 || !strings.Contains(de.Msg, "must be set") {
		t.Fatalf("err = %v", err)
	}
}

func TestEnvSemantics(t *testing.T) {
	// Values in one ENV see the variables from before it (Docker's rule).
	_, final := plan(t, "FROM x\nENV abc=hello\nENV abc=bye def=$abc\nENV ghi=$abc\n", Config{}, nil)
	if want := []string{"abc=bye", "def=hello", "ghi=bye"}; !reflect.DeepEqual(final.Env, want) {
		t.Fatalf("env = %q, want %q", final.Env, want)
	}
	// An overwritten key keeps its position and stays unique.
	_, final = plan(t, "FROM x\nENV X=1\nENV PATH=/p\nENV X=2\n", Config{Env: []string{"PATH=/bin", "X=0"}}, nil)
	if want := []string{"PATH=/p", "X=2"}; !reflect.DeepEqual(final.Env, want) {
		t.Fatalf("env = %q, want %q", final.Env, want)
	}
}

func TestArgScoping(t *testing.T) {
	src := `ARG VERSION=bookworm
ARG IMG=debian:${VERSION}
FROM $IMG
RUN echo one
ARG VERSION
ARG LOCAL=l-$VERSION
ARG NODEFAULT
ARG OVERRIDE=default
ENV SHADOW=env
ARG SHADOW=arg
RUN echo two
ENV FROMARG=$LOCAL
WORKDIR /w/$IMG
`
	f := parse(t, src)
	ref, line, err := f.FromRef(nil)
	if err != nil || ref != "debian:bookworm" || line != 3 {
		t.Fatalf("FromRef = %q %d %v", ref, line, err)
	}
	ref, _, err = f.FromRef(map[string]string{"VERSION": "trixie"})
	if err != nil || ref != "debian:trixie" {
		t.Fatalf("FromRef with build arg = %q %v", ref, err)
	}
	ref, _, _ = f.FromRef(map[string]string{"IMG": "base"})
	if ref != "base" {
		t.Fatalf("FromRef IMG override = %q", ref)
	}

	steps, final, err := f.Plan(Config{}, map[string]string{"OVERRIDE": "cli"})
	if err != nil {
		t.Fatal(err)
	}
	// First RUN: no ARG declared after FROM yet, so none is visible.
	if len(steps[0].Config.Env) != 0 {
		t.Errorf("RUN one env = %q", steps[0].Config.Env)
	}
	// Second RUN: stage ARGs visible (NODEFAULT unset: absent); SHADOW
	// comes from ENV, not ARG.
	want := []string{"SHADOW=env", "VERSION=bookworm", "LOCAL=l-bookworm", "OVERRIDE=cli"}
	if !reflect.DeepEqual(steps[1].Config.Env, want) {
		t.Errorf("RUN two env = %q\nwant %q", steps[1].Config.Env, want)
	}
	// ARGs are not persisted; IMG (meta, not re-declared) expands empty.
	if wantF := []string{"SHADOW=env", "FROMARG=l-bookworm"}; !reflect.DeepEqual(final.Env, wantF) {
		t.Errorf("final env = %q, want %q", final.Env, wantF)
	}
	if final.Workdir != "/w" {
		t.Errorf("workdir = %q (a meta ARG not re-declared must not expand)", final.Workdir)
	}

	// A build arg overrides a re-declared meta ARG too.
	steps, _, _ = f.Plan(Config{}, map[string]string{"VERSION": "trixie"})
	if got := steps[1].Config.Env[1]; got != "VERSION=trixie" {
		t.Errorf("re-declared meta ARG with build arg = %q", got)
	}

	// FROM that expands to nothing.
	_, _, err = parse(t, "ARG X\nFROM $X\n").FromRef(nil)
	var de *Error
	if !errors.As(err, &de) || de.Line != 2 {
		t.Fatalf("empty FROM err = %v", err)
	}
}

func TestCopyPlanErrors(t *testing.T) {
	cases := []struct {
		src  string
		line int
		msg  string
	}{
		{"FROM x\nCOPY a b /dir\n", 2, "more than one source needs a directory destination"},
		{"FROM x\nCOPY --chmod=9z a /d\n", 2, "not an octal mode"},
		{"FROM x\nCOPY --chmod=17777 a /d\n", 2, "not an octal mode"},
		{"FROM x\nCOPY --chown=:g a /d\n", 2, "--chown"},
		{"FROM x\nARG U=https://example.com/x\nADD $U /d\n", 3, "ADD from a URL"},
		{"FROM x\nCOPY $NOTHING /d\n", 2, "expands to an empty path"},
		{"FROM x\nUSER a:b:c\n", 2, "not user or user:group"},
	}
	for _, c := range cases {
		_, _, err := parse(t, c.src).Plan(Config{}, nil)
		var de *Error
		if !errors.As(err, &de) || de.Line != c.line || !strings.Contains(de.Msg, c.msg) {
			t.Errorf("%q: err = %v, want line %d %q", c.src, err, c.line, c.msg)
		}
	}
}

func TestHeredocs(t *testing.T) {
	steps, _ := plan(t, "FROM x\nRUN <<EOF\necho a\necho b\nEOF\nRUN <<-EOT\n\techo c\nEOT\nRUN cat <<EOF > /f\nhi $HOME\nEOF\n", Config{}, nil)
	want := [][]string{
		{"/bin/sh", "-c", "echo a\necho b\n"},
		{"/bin/sh", "-c", "echo c\n"},
		{"/bin/sh", "-c", "cat <<EOF > /f\nhi $HOME\nEOF"},
	}
	for i, w := range want {
		if !reflect.DeepEqual(steps[i].Args, w) {
			t.Errorf("step %d args = %q, want %q", i, steps[i].Args, w)
		}
	}
}

func TestEscapeDirective(t *testing.T) {
	steps, _ := plan(t, "# escape=`\nFROM x\nRUN echo a `\n  b\nENV P=C:\\dir\n", Config{}, nil)
	if got := steps[0].Args[2]; got != "echo a   b" {
		t.Errorf("script = %q", got)
	}
}

func TestCacheText(t *testing.T) {
	a, _ := plan(t, "FROM x\nENV A=1\nRUN echo hi\nCOPY a /b/\n", Config{}, nil)
	b, _ := plan(t, "# a comment\n\nFROM   x\n\n  # another\nENV   A=1\n\n\nrun echo hi\ncopy  a   /b/\n", Config{}, nil)
	for i := range a {
		if a[i].CacheText != b[i].CacheText {
			t.Errorf("step %d: layout changed the cache text:\n%s\n%s", i, a[i].CacheText, b[i].CacheText)
		}
	}
	c, _ := plan(t, "FROM x\nENV A=2\nRUN echo hi\nCOPY a /b/\n", Config{}, nil)
	if c[0].CacheText == a[0].CacheText {
		t.Error("an ENV change before RUN kept the RUN cache text")
	}
	d, _ := plan(t, "FROM x\nENV A=1\nRUN echo  hi\nCOPY a /b/\n", Config{}, nil)
	if d[0].CacheText == a[0].CacheText {
		t.Error("a changed script kept the cache text")
	}
	// ARG values reach RUN's cache text.
	e1, _ := plan(t, "FROM x\nARG V=1\nRUN make\n", Config{}, nil)
	e2, _ := plan(t, "FROM x\nARG V=1\nRUN make\n", Config{}, map[string]string{"V": "2"})
	if e1[0].CacheText == e2[0].CacheText {
		t.Error("an ARG value change kept the RUN cache text")
	}
	// The base config counts too.
	f1, _ := plan(t, "FROM x\nRUN make\n", Config{User: "u"}, nil)
	f2, _ := plan(t, "FROM x\nRUN make\n", Config{}, nil)
	if f1[0].CacheText == f2[0].CacheText {
		t.Error("a different base user kept the RUN cache text")
	}
	// COPY and ADD of the same sources differ.
	g, _ := plan(t, "FROM x\nADD a /b/\n", Config{}, nil)
	h, _ := plan(t, "FROM x\nCOPY a /b/\n", Config{}, nil)
	if g[0].CacheText == h[0].CacheText {
		t.Error("ADD and COPY share a cache text")
	}
	// Deterministic across calls.
	a2, _ := plan(t, "FROM x\nENV A=1\nRUN echo hi\nCOPY a /b/\n", Config{}, nil)
	if !reflect.DeepEqual(a, a2) {
		t.Error("Plan is not deterministic")
	}
}

// FuzzParse: arbitrary input must never panic Parse, FromRef or Plan.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"FROM a\nRUN x\n",
		"ARG A=1\nFROM $A\nENV B=${A:-x} C d\nCOPY --chown=1:1 a b /c/\nWORKDIR w\nUSER u\n",
		"FROM a\nRUN <<EOF\nx\nEOF\n",
		"# escape=`\nFROM a\nRUN [\"a\"]\n",
		"FROM a\nADD x.tar .\nARG B\nENV X=${B:?no}\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if len(s) > 4096 {
			return
		}
		df, err := Parse(strings.NewReader(s))
		if err != nil {
			var de *Error
			if !errors.As(err, &de) {
				t.Fatalf("error is %T, not *Error: %v", err, err)
			}
			return
		}
		_, _, _ = df.FromRef(map[string]string{"A": "b"})
		steps, _, err := df.Plan(Config{Env: []string{"PATH=/bin"}}, nil)
		if err == nil {
			for _, st := range steps {
				if st.CacheText == "" || st.Line <= 0 {
					t.Fatalf("step without cache text or line: %+v", st)
				}
			}
		}
	})
}
