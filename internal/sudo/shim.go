package sudo

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/airlock-sandbox/airlock/internal/envdapi"
	"github.com/airlock-sandbox/airlock/internal/unixuser"
	"github.com/creack/pty"
	"golang.org/x/sys/unix"
)

// sudoVersion is the sudo whose behaviour the shim follows (Debian bookworm's).
const sudoVersion = "1.9.13p3"

const sudoUsage = `usage: sudo -h | -K | -k | -V
usage: sudo -v [-AknS] [-g group] [-p prompt] [-u user]
usage: sudo -l [-AknS] [-g group] [-p prompt] [-u user] [command [arg ...]]
usage: sudo [-AEHknS] [-C num] [-D directory] [-g group] [-p prompt] [-u user] [VAR=value] [-i | -s] [command [arg ...]]
`

// sudoOpts is a parsed sudo command line.
type sudoOpts struct {
	req                                 sudoRequest
	list, validate, version, help, kill bool
}

type sudoUsageError struct{ msg string }

func (e *sudoUsageError) Error() string { return e.msg }

// parseSudoArgs parses sudo's options up to the command, as sudo does: options
// stop at the first non-option or at "--"; VAR=value words right after them
// are environment assignments.
func parseSudoArgs(args []string) (*sudoOpts, error) {
	o := &sudoOpts{}
	r := &o.req
	i := 0
	// value returns an option's argument: the rest of the word or the next word.
	value := func(name, rest string) (string, error) {
		if rest != "" {
			return rest, nil
		}
		if i+1 >= len(args) {
			return "", &sudoUsageError{fmt.Sprintf("option requires an argument -- '%s'", name)}
		}
		i++
		return args[i], nil
	}
	longs := map[string]string{
		"user": "u", "group": "g", "prompt": "p", "chdir": "D", "close-from": "C",
		"login": "i", "shell": "s", "non-interactive": "n", "set-home": "H", "stdin": "S",
		"version": "V", "list": "l", "validate": "v", "help": "h", "reset-timestamp": "k",
		"remove-timestamp": "K", "askpass": "A",
	}
	takesArg := map[string]bool{"u": true, "g": true, "p": true, "D": true, "C": true}
	apply := func(f, v string) error {
		switch f {
		case "u":
			r.User = v
		case "g":
			r.Group = v
		case "D":
			r.Chdir = v
		case "p", "C", "n", "S", "A":
			// No password is ever asked, so prompts, askpass, -S and -n change nothing.
		case "E":
			r.PreserveEnv = true
		case "H":
			r.SetHome = true
		case "i":
			r.Login = true
		case "s":
			r.Shell = true
		case "V":
			o.version = true
		case "l":
			o.list = true
		case "v":
			o.validate = true
		case "h":
			o.help = true
		case "k", "K":
			o.kill = true // there are no cached credentials to forget
		default:
			return &sudoUsageError{fmt.Sprintf("invalid option -- '%s'", f)}
		}
		return nil
	}
	for ; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			i++
			break
		}
		if strings.HasPrefix(a, "--") {
			name, v, hasV := strings.Cut(a[2:], "=")
			if name == "preserve-env" {
				if hasV {
					r.PreserveList = append(r.PreserveList, strings.Split(v, ",")...)
				} else {
					r.PreserveEnv = true
				}
				continue
			}
			f, ok := longs[name]
			if !ok {
				return nil, &sudoUsageError{fmt.Sprintf("unrecognized option '%s'", a)}
			}
			if takesArg[f] && !hasV {
				var err error
				if v, err = value(name, ""); err != nil {
					return nil, err
				}
			}
			if err := apply(f, v); err != nil {
				return nil, err
			}
			continue
		}
		if len(a) < 2 || a[0] != '-' {
			break
		}
		for j := 1; j < len(a); j++ {
			f := string(a[j])
			if takesArg[f] {
				v, err := value(f, a[j+1:])
				if err != nil {
					return nil, err
				}
				if err := apply(f, v); err != nil {
					return nil, err
				}
				break
			}
			if err := apply(f, ""); err != nil {
				return nil, err
			}
		}
	}
	for ; i < len(args); i++ {
		k, _, ok := strings.Cut(args[i], "=")
		if !ok || !validEnvName(k) {
			break
		}
		r.Assign = append(r.Assign, args[i])
	}
	r.Command = args[i:]
	if r.Login && r.Shell {
		return nil, &sudoUsageError{"you may not specify both the -i and -s options"}
	}
	return o, nil
}

func validEnvName(k string) bool {
	if k == "" || k[0] >= '0' && k[0] <= '9' {
		return false
	}
	for _, c := range k {
		if !(c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return false
		}
	}
	return true
}

// RunShim is envd invoked as `sudo`: it parses sudo's command line and has the
// envd agent run the command (see the package comment). It returns the exit status:
// the command's, 128+n if a signal killed it, 1 for sudo's own errors.
func RunShim(name string, args []string) int {
	if name == "sudoedit" {
		// Debian links sudoedit to sudo, so it reaches us too.
		fmt.Fprintln(os.Stderr, "sudo: sudoedit is not supported in this sandbox; run the editor with sudo: sudo $EDITOR FILE")
		return 1
	}
	o, err := parseSudoArgs(args)
	if err != nil {
		fmt.Fprintf(os.Stderr, "sudo: %v\n%s", err, sudoUsage)
		return 1
	}
	r := &o.req
	switch {
	case o.help:
		fmt.Printf("sudo - execute a command as another user (airlock envd shim)\n\n%s", sudoUsage)
		return 0
	case o.version:
		fmt.Printf("Sudo version %s (airlock envd %s shim: commands run through envd, no setuid)\n", sudoVersion, envdapi.Version)
		return 0
	case o.list:
		return sudoList(r.Command)
	case o.validate || (o.kill && len(r.Command) == 0 && !r.Login && !r.Shell):
		// Nothing to validate or forget: no password is ever asked.
		return 0
	case len(r.Command) == 0 && !r.Login && !r.Shell:
		fmt.Fprint(os.Stderr, sudoUsage)
		return 1
	}
	code, err := sudoRun(r)
	if err != nil {
		fmt.Fprintf(os.Stderr, "sudo: %v\n", err)
		return 1
	}
	return code
}

// sudoList answers `sudo -l`: the policy is NOPASSWD: ALL for everyone.
func sudoList(command []string) int {
	if len(command) > 0 {
		path, err := unixuser.LookPath(command[0], []string{"PATH=" + sudoSecurePath}, ".", "")
		if err != nil {
			return 1
		}
		fmt.Println(strings.Join(append([]string{path}, command[1:]...), " "))
		return 0
	}
	name, ok := (&unixuser.EtcUserDB{Root: "/"}).UserName(uint32(os.Getuid()))
	if !ok {
		name = fmt.Sprintf("#%d", os.Getuid())
	}
	host, _ := os.Hostname()
	fmt.Printf("User %s may run the following commands on %s:\n    (ALL : ALL) NOPASSWD: ALL\n", name, host)
	return 0
}

func isTerminal(fd int) bool {
	_, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	return err == nil
}

// sudoRun sends the request and relays until the command ends.
func sudoRun(r *sudoRequest) (int, error) {
	sock := os.Getenv(SocketEnv)
	if sock == "" {
		sock = envdapi.SudoSocket
	}
	conn, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return 1, fmt.Errorf("cannot reach envd at %s: %w", sock, err)
	}
	defer conn.Close()
	r.Env = os.Environ()
	r.Cwd, _ = os.Getwd()
	r.Ctty = -1

	// A terminal among our stdio means an interactive use. The command cannot
	// share our terminal as its controlling one (that belongs to our session,
	// and envd starts it in another), so, like sudo's use_pty, it gets a new
	// terminal of its own that we relay to ours. Files that are not terminals
	// are handed over as they are.
	fds := []int{0, 1, 2}
	var tr *sudoTerminal
	for i := range fds {
		if !isTerminal(i) {
			continue
		}
		if tr == nil {
			if tr, err = newSudoTerminal(i); err != nil {
				return 1, err
			}
			defer tr.close()
			r.Ctty = i
		}
		fds[i] = int(tr.slave.Fd())
		tr.ttyFDs[i] = true
	}
	// Catch signals before the command exists: it may be signalled (through
	// us) as soon as it runs. They wait in the channel until it has started.
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTERM, syscall.SIGUSR1,
		syscall.SIGUSR2, syscall.SIGALRM, syscall.SIGWINCH, syscall.SIGTSTP, syscall.SIGCONT)
	defer signal.Stop(sigs)
	err = writeFrame(conn, r, fds)
	if tr != nil {
		// envd holds its own copy now; ours would keep the terminal open after the command ended.
		tr.slave.Close()
	}
	if err != nil {
		return 1, err
	}
	var started sudoReply
	if err := readFrame(conn, sudoMaxMessage, &started); err != nil {
		return 1, fmt.Errorf("no answer from envd: %w", err)
	}
	if started.Error != "" {
		return 1, errors.New(started.Error)
	}

	if tr != nil {
		tr.start()
	}
	replies := make(chan sudoReply, 1)
	go func() {
		var rep sudoReply
		if err := readFrame(conn, sudoMaxMessage, &rep); err != nil {
			rep.Error = "lost connection to envd: " + err.Error()
		}
		replies <- rep
	}()
	var sendMu sync.Mutex
	forward := func(sig syscall.Signal) {
		sendMu.Lock()
		defer sendMu.Unlock()
		_ = conn.SetWriteDeadline(time.Now().Add(sudoWriteTimeout))
		_ = writeFrame(conn, sudoSignal{Signal: int(sig)}, nil)
	}
	for {
		select {
		case sig := <-sigs:
			s := sig.(syscall.Signal)
			switch {
			case s == syscall.SIGWINCH && tr != nil:
				// The kernel tells the command's terminal itself.
				tr.copySize()
			case s == syscall.SIGTSTP:
				// Suspend the command and then ourselves, like a shell job.
				// SIGSTOP, not SIGTSTP: the command's process group has no
				// parent in its session (envd is in another), so the kernel
				// discards SIGTSTP sent to it as to any orphaned group.
				forward(syscall.SIGSTOP)
				if tr != nil {
					tr.restore()
				}
				_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
			case s == syscall.SIGCONT:
				if tr != nil {
					tr.makeRaw()
					tr.copySize()
				}
				forward(s)
			default:
				forward(s)
			}
		case rep := <-replies:
			if tr != nil {
				tr.drain()
			}
			if rep.Exit == nil {
				if rep.Error == "" {
					rep.Error = "envd sent no exit status"
				}
				return 1, errors.New(rep.Error)
			}
			return *rep.Exit, nil
		}
	}
}

// sudoTerminal is the terminal the shim allocates for an interactive command,
// relayed to the shim's own.
type sudoTerminal struct {
	tty    int // one of our stdio fds that is a terminal
	master *os.File
	slave  *os.File
	ttyFDs [3]bool // which of our stdio fds are terminals (get the slave)

	mu       sync.Mutex
	saved    *unix.Termios // our terminal's settings while it is raw
	out      chan struct{} // closed when the master's output has been copied out
	draining atomic.Bool   // the command ended; stop once its terminal is idle
}

func newSudoTerminal(tty int) (*sudoTerminal, error) {
	master, slave, err := pty.Open()
	if err != nil {
		return nil, fmt.Errorf("allocating a terminal: %w", err)
	}
	t := &sudoTerminal{tty: tty, master: master, slave: slave, out: make(chan struct{})}
	// The new terminal starts as ours is: same modes (before we make ours raw)
	// and size.
	if tio, err := unix.IoctlGetTermios(tty, unix.TCGETS); err == nil {
		_ = unix.IoctlSetTermios(int(slave.Fd()), unix.TCSETS, tio)
	}
	t.copySize()
	return t, nil
}

func (t *sudoTerminal) copySize() {
	if ws, err := unix.IoctlGetWinsize(t.tty, unix.TIOCGWINSZ); err == nil {
		_ = pty.Setsize(t.master, &pty.Winsize{Rows: ws.Row, Cols: ws.Col, X: ws.Xpixel, Y: ws.Ypixel})
	}
}

// makeRaw puts our stdin terminal in raw mode, so keys (^C, ^Z) reach the
// command's terminal, whose line discipline acts on them.
func (t *sudoTerminal) makeRaw() {
	if !t.ttyFDs[0] {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.saved != nil {
		return
	}
	tio, err := unix.IoctlGetTermios(0, unix.TCGETS)
	if err != nil {
		return
	}
	saved := *tio
	tio.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
	tio.Oflag &^= unix.OPOST
	tio.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
	tio.Cflag &^= unix.CSIZE | unix.PARENB
	tio.Cflag |= unix.CS8
	tio.Cc[unix.VMIN], tio.Cc[unix.VTIME] = 1, 0
	if unix.IoctlSetTermios(0, unix.TCSETSW, tio) == nil {
		t.saved = &saved
	}
}

func (t *sudoTerminal) restore() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.saved != nil {
		_ = unix.IoctlSetTermios(0, unix.TCSETSW, t.saved)
		t.saved = nil
	}
}

// start relays: our terminal's input to the command's, the command's output
// to our terminal.
func (t *sudoTerminal) start() {
	t.makeRaw()
	if t.ttyFDs[0] {
		go func() { _, _ = io.Copy(t.master, os.Stdin) }()
	}
	var w io.Writer = io.Discard
	switch {
	case t.ttyFDs[1]:
		w = os.Stdout
	case t.ttyFDs[2]:
		w = os.Stderr
	}
	go func() {
		defer close(t.out)
		buf := make([]byte, 32<<10)
		for {
			n, err := t.master.Read(buf)
			if n > 0 {
				if _, werr := w.Write(buf[:n]); werr != nil {
					w = io.Discard
				}
				if t.draining.Load() {
					_ = t.master.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
				}
			}
			if err != nil {
				// EIO: no one has the command's terminal open any more; or
				// idle while draining.
				return
			}
		}
	}()
}

// drain waits, after the command ended, for the output it left in its
// terminal: until the terminal is closed by everyone (EIO) or idle for 100 ms.
// A background process that inherited the terminal may keep it open and keep
// writing; it is followed for 2 s at most.
func (t *sudoTerminal) drain() {
	t.draining.Store(true)
	_ = t.master.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	select {
	case <-t.out:
	case <-time.After(2 * time.Second):
	}
}

func (t *sudoTerminal) close() {
	t.restore()
	t.master.Close()
}
