package template

import (
	"bufio"
	"bytes"
	"os"
	"strings"
	"testing"
	"time"
)

func TestParseDebootstrapLine(t *testing.T) {
	for line, want := range map[string]dbEvent{
		"I: Retrieving InRelease ":                         {Phase: phaseResolve},
		"I: Resolving dependencies of base packages...":    {Phase: phaseResolve},
		"I: Retrieving libc6 2.36-9+deb12u10":              {Phase: phaseDownload, Verb: "Retrieving", Pkg: "libc6"},
		"I: Validating bsdutils 1:2.38.1-5+deb12u3":        {Phase: phaseDownload, Verb: "Validating", Pkg: "bsdutils"},
		"I: Extracting libc-bin...":                        {Phase: phaseExtract, Verb: "Extracting", Pkg: "libc-bin"},
		"I: Installing core packages...":                   {Phase: phaseInstall},
		"I: Unpacking required packages...":                {Phase: phaseInstall},
		"I: Unpacking gcc-12-base:amd64...":                {Phase: phaseInstall, Verb: "Unpacking", Pkg: "gcc-12-base"},
		"I: Configuring the base system...":                {Phase: phaseInstall},
		"I: Configuring libstdc++6:amd64...":               {Phase: phaseInstall, Verb: "Configuring", Pkg: "libstdc++6"},
		"I: Configuring ca-certificates...":                {Phase: phaseInstall, Verb: "Configuring", Pkg: "ca-certificates"},
		"I: Base system installed successfully.":           {},
		"W: Failure trying to run: chroot /x dpkg":         {},
		"I: Valid Release signature (key id 4D64FEC11...)": {},
	} {
		got, ok := parseDebootstrapLine(line)
		if ok != (want != dbEvent{}) || got != want {
			t.Errorf("%q: got %+v, %v; want %+v", line, got, ok, want)
		}
	}
}

// fakeClock advances by step on every reading, standing in for the time between lines.
func fakeClock(step time.Duration) func() time.Time {
	t := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	return func() time.Time { t = t.Add(step); return t }
}

// TestProgressOnRecordedLog replays the stdout of a real debootstrap of the base template
// (testdata/debootstrap.log) the way a CI log would see it.
func TestProgressOnRecordedLog(t *testing.T) {
	data, err := os.ReadFile("testdata/debootstrap.log")
	if err != nil {
		t.Fatal(err)
	}
	var out, log bytes.Buffer
	p := newProgress(&out, "base")
	p.now = fakeClock(100 * time.Millisecond) // ~67 s for the 673 lines
	p.start = p.now()
	p.setLog(&log)
	// Feed it in odd-sized chunks: pipes don't respect line boundaries.
	for len(data) > 0 {
		n := min(37, len(data))
		if _, err := p.Write(data[:n]); err != nil {
			t.Fatal(err)
		}
		data = data[n:]
	}
	p.close()

	if p.downloaded != 144 || p.extracted != 88 || p.unpacked != 139 || p.configured != 142 {
		t.Errorf("counts: downloaded %d extracted %d unpacked %d configured %d; want 144 88 139 142",
			p.downloaded, p.extracted, p.unpacked, p.configured)
	}
	if !bytes.Equal(log.Bytes(), mustRead(t, "testdata/debootstrap.log")) {
		t.Error("the raw log is not a byte-for-byte copy of the output")
	}
	if tail := p.Tail(); len(tail) != tailLines || tail[len(tail)-1] != "I: Base system installed successfully." {
		t.Errorf("tail = %q", tail)
	}

	lines := nonEmptyLines(out.String())
	if len(lines) < 5 || len(lines) > 25 {
		t.Errorf("%d progress lines for a CI log, want a handful:\n%s", len(lines), out.String())
	}
	// Phases appear in build order, each line stamped with the elapsed time.
	order := []string{"base: resolving packages", "base: downloading packages: ", "base: extracting packages: ", "base: installing packages: "}
	i := 0
	for _, l := range lines {
		if !strings.HasPrefix(l, "[") || !strings.Contains(l, "] base: ") {
			t.Errorf("line without elapsed time: %q", l)
		}
		for j := i; j < len(order); j++ {
			if strings.Contains(l, order[j]) {
				i = j + 1
				break
			}
		}
	}
	if i != len(order) {
		t.Errorf("phases out of order or missing (reached %d of %d):\n%s", i, len(order), out.String())
	}
	if last := lines[len(lines)-1]; !strings.Contains(last, "installing packages: unpacked ") || !strings.Contains(last, "/144") {
		t.Errorf("last line %q", last)
	}
}

func TestProgressTerminalRedrawsOneLine(t *testing.T) {
	var out bytes.Buffer
	p := newProgress(&out, "base")
	p.tty, p.width = true, 40
	p.now = fakeClock(time.Second)
	p.start = p.now()
	for _, l := range []string{"I: Retrieving libc6 2.36", "I: Retrieving a-package-with-a-long-name 1.0", "I: Unpacking libc6:amd64..."} {
		if _, err := p.Write([]byte(l + "\n")); err != nil {
			t.Fatal(err)
		}
	}
	p.setStep(1, 2, "create user")
	if strings.Contains(out.String(), "\n") {
		t.Fatalf("terminal output has a newline before the end: %q", out.String())
	}
	draws := strings.Split(out.String(), "\r\033[K")[1:]
	if len(draws) != 4 {
		t.Fatalf("%d redraws, want 4: %q", len(draws), out.String())
	}
	for _, d := range draws {
		if len(d) > 39 {
			t.Errorf("redraw %q is wider than the 40-column terminal", d)
		}
	}
	if !strings.HasPrefix(draws[1], "base: downloading packages: 2 (a-pack") {
		t.Errorf("draw %q lacks the count and current package", draws[1])
	}
	p.finish("ready in 0:05")
	p.close()
	if !strings.HasSuffix(out.String(), "\r\033[Kbase: ready in 0:05\n") {
		t.Errorf("the final line is not printed once, on its own line: %q", out.String())
	}
}

func TestFormatDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{0: "0:00", 59400 * time.Millisecond: "0:59", 83 * time.Second: "1:23", 61 * time.Minute: "61:00"} {
		if got := FormatDuration(d); got != want {
			t.Errorf("%s: %s, want %s", d, got, want)
		}
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func nonEmptyLines(s string) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) != "" {
			out = append(out, sc.Text())
		}
	}
	return out
}
