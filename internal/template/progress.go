package template

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Build phases, in the order a build goes through them.
const (
	phaseStart    = "starting"
	phaseResolve  = "resolving packages"
	phaseDownload = "downloading"
	phaseExtract  = "extracting"
	// debootstrap unpacks and configures the required packages, then does the same
	// for the rest; one phase with both counts reads better than four that alternate.
	phaseInstall = "installing"
	phaseStep    = "step"
	phaseFinish  = "finishing"
)

const (
	tailLines = 20
	// maxLine bounds the partial-line buffer so a command that prints without newlines
	// can't grow it without limit.
	maxLine = 64 << 10
	// A log that is not a terminal gets a line at each phase change, then at most one
	// every logEvery while counts move, and a heartbeat every heartbeat while they don't,
	// so a CI log shows the build is alive without a line per package.
	logEvery    = 5 * time.Second
	heartbeat   = 15 * time.Second
	redrawEvery = 100 * time.Millisecond
)

// debootstrap prints "I: <Verb> <package> <version>" while downloading and
// "I: <Verb> <package>..." while installing; phrases with spaces ("Unpacking required
// packages...") are phase banners, not packages.
var (
	dbDownloadRe = regexp.MustCompile(`^I: (Retrieving|Validating) (\S+) (\S+)$`)
	dbInstallRe  = regexp.MustCompile(`^I: (Extracting|Unpacking|Configuring) (\S+?)\.\.\.$`)
)

// dbEvent is one recognised line of debootstrap output.
type dbEvent struct {
	Phase string // one of the phase constants
	Verb  string // Retrieving, Validating, Extracting, Unpacking, Configuring; "" for banners
	Pkg   string // package name (architecture suffix removed)
}

// parseDebootstrapLine recognises the progress lines of debootstrap's stdout. Lines it
// doesn't know (warnings, dpkg chatter) return ok=false and only go to the raw log.
func parseDebootstrapLine(line string) (dbEvent, bool) {
	if m := dbDownloadRe.FindStringSubmatch(line); m != nil {
		// "Retrieving Packages " / "Retrieving InRelease " fetch the index, not a package;
		// they fail the regexp thanks to the empty version.
		return dbEvent{Phase: phaseDownload, Verb: m[1], Pkg: m[2]}, true
	}
	if m := dbInstallRe.FindStringSubmatch(line); m != nil {
		pkg, _, _ := strings.Cut(m[2], ":")
		ph := phaseInstall
		if m[1] == "Extracting" {
			ph = phaseExtract
		}
		return dbEvent{Phase: ph, Verb: m[1], Pkg: pkg}, true
	}
	switch {
	case strings.HasPrefix(line, "I: Retrieving InRelease"),
		strings.HasPrefix(line, "I: Retrieving Release"),
		strings.HasPrefix(line, "I: Retrieving Packages"),
		strings.HasPrefix(line, "I: Resolving dependencies"),
		strings.HasPrefix(line, "I: Checking component"):
		return dbEvent{Phase: phaseResolve}, true
	case strings.HasPrefix(line, "I: Installing core packages"),
		strings.HasPrefix(line, "I: Unpacking required packages"),
		strings.HasPrefix(line, "I: Configuring required packages"),
		strings.HasPrefix(line, "I: Unpacking the base system"),
		strings.HasPrefix(line, "I: Configuring the base system"):
		return dbEvent{Phase: phaseInstall}, true
	}
	return dbEvent{}, false
}

// progress turns the raw output of a build into a short status for a person, while
// keeping every byte in the raw log and the last lines for the error message.
type progress struct {
	mu    sync.Mutex
	out   io.Writer
	tty   bool
	width int // terminal columns; status lines are cut to fit so \r redraws one line
	name  string
	now   func() time.Time
	start time.Time
	log   io.Writer // the build.log file; nil discards
	raw   io.Writer // BuildRequest.Output: what goes to log, live; nil discards

	buf  []byte
	tail []string

	phase      string
	pkg        string
	downloaded int
	extracted  int
	unpacked   int
	configured int
	step       int
	steps      int
	stepName   string
	// phaseAt is when the build entered its current phase (or step), for "on step 2
	// for 1:10" in answers to clients.
	phaseAt  time.Time
	phaseKey string

	printedAt    time.Time
	printedPhase string // phase (and step number) of the last line printed
	printed      string // last status shown, without the elapsed time
	drawn        bool   // a tty line is on screen without its newline yet
	finished     bool   // the final line is out; no more status redraws

	stop chan struct{}
	done chan struct{}
}

func newProgress(out io.Writer, name string) *progress {
	if out == nil {
		out = io.Discard
	}
	p := &progress{out: out, name: name, now: time.Now, phase: phaseStart}
	if f, ok := out.(*os.File); ok {
		if _, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS); err == nil {
			p.tty = true
			if ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ); err == nil && ws.Col > 0 {
				p.width = int(ws.Col)
			}
		}
	}
	p.start = p.now()
	p.phaseAt = p.start
	return p
}

// moved notes the time of a phase or step change; callers hold p.mu.
func (p *progress) moved() {
	key := p.phase
	if p.phase == phaseStep {
		key = fmt.Sprintf("%s %d", p.phase, p.step)
	}
	if key != p.phaseKey {
		p.phaseKey, p.phaseAt = key, p.now()
	}
}

// snapshot is where the build is (without the template's name) and since when.
func (p *progress) snapshot() (string, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.moved()
	st := strings.TrimPrefix(p.status(true), p.name+": ")
	if p.phase == phaseStart {
		st = "starting"
	}
	return st, p.phaseAt
}

// run redraws the status once a second, so the elapsed time moves and slow steps that
// print nothing (configuring python, say) still show life. Stop it with close.
func (p *progress) run() {
	stop, done := make(chan struct{}), make(chan struct{})
	p.stop, p.done = stop, done
	go func() {
		defer close(done)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				p.mu.Lock()
				p.render()
				p.mu.Unlock()
			}
		}
	}()
}

// close stops the ticker and ends a tty status line with a newline, so whatever the
// caller prints next starts on a clean line.
func (p *progress) close() {
	if p.stop != nil {
		close(p.stop)
		<-p.done
		p.stop = nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.flushPartial()
	if p.tty && p.drawn {
		fmt.Fprintln(p.out)
		p.drawn = false
	}
}

// setLog sets where raw output goes; the builder opens build.log after the first status.
func (p *progress) setLog(w io.Writer) {
	p.mu.Lock()
	p.log = w
	p.mu.Unlock()
}

// Write takes raw command output: it goes to the log, its lines to the tail, and the
// lines debootstrap uses for progress move the status.
func (p *progress) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.log != nil {
		// A full disk must not hide the build's own error; the log is best effort.
		_, _ = p.log.Write(b)
	}
	if p.raw != nil {
		_, _ = p.raw.Write(b)
	}
	p.buf = append(p.buf, b...)
	for {
		i := bytes.IndexByte(p.buf, '\n')
		if i < 0 {
			break
		}
		p.line(string(p.buf[:i]))
		p.buf = p.buf[i+1:]
	}
	if len(p.buf) > maxLine {
		p.flushPartial()
	}
	p.render()
	return len(b), nil
}

func (p *progress) flushPartial() {
	if len(p.buf) > 0 {
		p.line(string(p.buf))
		p.buf = p.buf[:0]
	}
}

// note records a line of the builder's own in the log and the tail (e.g. "+ step 2/5").
func (p *progress) note(format string, a ...any) {
	s := fmt.Sprintf(format, a...)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.log != nil {
		_, _ = io.WriteString(p.log, s+"\n")
	}
	if p.raw != nil {
		_, _ = io.WriteString(p.raw, s+"\n")
	}
	p.addTail(s)
}

func (p *progress) line(l string) {
	l = strings.TrimRight(l, "\r")
	p.addTail(l)
	if p.phase == phaseStep {
		// A terminal shows a step's latest output line after its status.
		if t := strings.TrimSpace(l); t != "" {
			p.pkg = shorten(t, 50)
		}
		return
	}
	ev, ok := parseDebootstrapLine(l)
	if !ok {
		return
	}
	p.phase = ev.Phase
	p.moved()
	if ev.Pkg != "" {
		p.pkg = ev.Pkg
	}
	switch ev.Verb {
	case "Retrieving":
		p.downloaded++
	case "Extracting":
		p.extracted++
	case "Unpacking":
		p.unpacked++
	case "Configuring":
		p.configured++
	}
}

func (p *progress) addTail(l string) {
	p.tail = append(p.tail, l)
	if len(p.tail) > tailLines {
		p.tail = p.tail[len(p.tail)-tailLines:]
	}
}

// Tail returns the last lines of output, oldest first.
func (p *progress) Tail() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.tail...)
}

// setStep moves the status to the builder's own step i (1-based) of n.
func (p *progress) setStep(i, n int, name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.phase, p.step, p.steps, p.stepName, p.pkg = phaseStep, i, n, name, ""
	p.moved()
	p.render()
}

func (p *progress) setPhase(phase string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.phase, p.pkg = phase, ""
	p.moved()
	p.render()
}

// finish prints the last status line, e.g. "base: ready in 1:23 (412 MB)".
func (p *progress) finish(msg string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.finished = true
	p.message(msg)
}

// printf prints a line of its own (a warning, say) without breaking the status line.
func (p *progress) printf(format string, a ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.message(fmt.Sprintf(format, a...))
}

func (p *progress) message(msg string) {
	line := fmt.Sprintf("%s: %s", p.name, msg)
	if p.tty {
		fmt.Fprintf(p.out, "\r\033[K%s\n", p.fit(line))
		p.drawn = false
		return
	}
	fmt.Fprintln(p.out, line)
}

// status describes where the build is, without the elapsed time.
func (p *progress) status(withPkg bool) string {
	var s string
	total := p.downloaded
	switch p.phase {
	case phaseDownload:
		s = fmt.Sprintf("downloading packages: %d", p.downloaded)
	case phaseExtract:
		s = fmt.Sprintf("extracting packages: %d", p.extracted)
	case phaseInstall:
		s = fmt.Sprintf("installing packages: unpacked %s, configured %s", count(p.unpacked, total), count(p.configured, total))
	case phaseStep:
		s = fmt.Sprintf("step %d/%d: %s", p.step, p.steps, p.stepName)
	default:
		s = p.phase
	}
	if withPkg && p.pkg != "" {
		s += " (" + p.pkg + ")"
	}
	return p.name + ": " + s
}

// count shows n/total while the total (packages downloaded) is a sound upper bound, and
// plain n otherwise: debootstrap never announces how many packages it will install.
func count(n, total int) string {
	if total >= n && total > 0 {
		return fmt.Sprintf("%d/%d", n, total)
	}
	return fmt.Sprint(n)
}

func (p *progress) render() {
	if p.finished || p.phase == phaseStart {
		return
	}
	now := p.now()
	elapsed := FormatDuration(now.Sub(p.start))
	phase := p.phase
	if phase == phaseStep {
		phase = fmt.Sprintf("%s %d", phase, p.step)
	}
	if p.tty {
		// debootstrap prints two lines per package; ten redraws a second are plenty.
		if phase == p.printedPhase && now.Sub(p.printedAt) < redrawEvery {
			return
		}
		fmt.Fprintf(p.out, "\r\033[K%s", p.fit(p.status(true)+"  "+elapsed))
		p.drawn, p.printedPhase, p.printedAt = true, phase, now
		return
	}
	st := p.status(false)
	switch {
	case phase != p.printedPhase:
	case st != p.printed && now.Sub(p.printedAt) >= logEvery:
	case now.Sub(p.printedAt) >= heartbeat:
	default:
		return
	}
	fmt.Fprintf(p.out, "[%s] %s\n", elapsed, st)
	p.printed, p.printedPhase, p.printedAt = st, phase, now
}

// fit cuts a status line to the terminal width: a line that wraps can't be redrawn
// with \r.
func (p *progress) fit(s string) string {
	if p.width > 1 && len(s) > p.width-1 {
		return s[:p.width-1]
	}
	return s
}

// FormatDuration prints m:ss, the way people read build times (and serve its
// start-up times).
func FormatDuration(d time.Duration) string {
	d = d.Round(time.Second)
	return fmt.Sprintf("%d:%02d", int(d/time.Minute), int(d%time.Minute/time.Second))
}
