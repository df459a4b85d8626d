package sudo

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/airlock-sandbox/airlock/internal/envdapi"
	"github.com/airlock-sandbox/airlock/internal/testenv"
	"github.com/airlock-sandbox/airlock/internal/unixuser"
	"github.com/airlock-sandbox/airlock/internal/unixuser/unixusertest"
)

// These tests run the real envd binary as the sudo shim (invoked as "sudo",
// as uid 1000, with no setuid bit anywhere) against a Server in this process
// serving the sudo socket, with the fake sandbox root of newEnv for users.

// sudoShim links the envd binary as dir/sudo. The test build lives in a
// private temp dir of this test process; uid 1000 must be able to run it.
func sudoShim(t *testing.T, dir string) string {
	t.Helper()
	bin := testenv.EnvdBinary(t)
	if os.Getenv("AIRLOCK_ENVD") == "" {
		must(t, os.Chmod(filepath.Dir(bin), 0o755))
	}
	must(t, os.MkdirAll(dir, 0o755))
	shim := filepath.Join(dir, "sudo")
	must(t, os.Symlink(bin, shim))
	return shim
}

type sudoEnv struct {
	t           testing.TB
	home, rhome string
	shim        string
	sock        string
}

func newSudoEnv(t *testing.T) *sudoEnv {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the envd binary")
	}
	if os.Geteuid() != 0 {
		testenv.Missing(t, "sudo tests switch users and chown files; run them as root")
	}
	root := unixusertest.New(t)
	se := &sudoEnv{t: t, home: root.Home, rhome: root.RootHome,
		shim: sudoShim(t, filepath.Join(root.Dir, "bin")), sock: filepath.Join(root.Dir, "run", "envd", "sudo.sock")}
	srv := &Server{Users: &unixuser.EtcUserDB{Root: root.Dir}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	// The umask envd's Serve may leave in place while binding must not matter.
	old := syscall.Umask(0o177)
	l, err := Listen(se.sock)
	syscall.Umask(old)
	must(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	fi, err := os.Stat(se.sock)
	must(t, err)
	if fi.Mode().Perm() != 0o666 || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("sudo socket mode %v, want a 0666 socket", fi.Mode())
	}
	fi, err = os.Stat(filepath.Dir(se.sock))
	must(t, err)
	if fi.Mode().Perm() != 0o755 {
		t.Fatalf("sudo socket dir mode %v, want 0755", fi.Mode().Perm())
	}
	return se
}

// cmd prepares the shim as the default user (uid 1000) in its home.
func (se *sudoEnv) cmd(args ...string) *exec.Cmd {
	c := &exec.Cmd{Path: se.shim, Args: append([]string{"sudo"}, args...), Dir: se.home}
	c.Env = []string{SocketEnv + "=" + se.sock, "PATH=" + envdapi.DefaultPath, "HOME=" + se.home, "USER=user",
		"TERM=xterm-test", "FOO=from-caller", "SHELL=/bin/sh"}
	c.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1000, Gid: 1000, Groups: []uint32{1000}}}
	return c
}

type sudoResult struct {
	stdout, stderr string
	code           int
}

func (se *sudoEnv) run(stdin string, args ...string) sudoResult {
	se.t.Helper()
	return runCmd(se.t, se.cmd(args...), stdin)
}

func runCmd(t testing.TB, c *exec.Cmd, stdin string) sudoResult {
	t.Helper()
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr, c.Stdin = &out, &errb, strings.NewReader(stdin)
	done := make(chan error, 1)
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- c.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(60 * time.Second):
		_ = c.Process.Kill()
		<-done
		t.Fatalf("%v did not finish; stdout %q stderr %q", c.Args, out.String(), errb.String())
	}
	code := 0
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("%v: %v", c.Args, err)
		}
		code = ee.ExitCode()
	}
	return sudoResult{stdout: out.String(), stderr: errb.String(), code: code}
}

func (r sudoResult) want(t *testing.T, code int, stdout string) {
	t.Helper()
	if r.code != code || r.stdout != stdout {
		t.Fatalf("got exit %d stdout %q (stderr %q); want exit %d stdout %q", r.code, r.stdout, r.stderr, code, stdout)
	}
}

func TestSudo(t *testing.T) {
	se := newSudoEnv(t)
	t.Run("whoami is root", func(t *testing.T) {
		se.run("", "whoami").want(t, 0, "root\n")
		se.run("", "id", "-u").want(t, 0, "0\n")
	})
	t.Run("-u user", func(t *testing.T) {
		se.run("", "-u", "user", "id", "-u").want(t, 0, "1000\n")
		se.run("", "-u#1000", "id", "-u").want(t, 0, "1000\n")
		se.run("", "--user=nobody", "id", "-u").want(t, 0, "65534\n")
	})
	t.Run("-g group", func(t *testing.T) {
		// -g alone keeps the caller's own user.
		se.run("", "-g", "sudo", "sh", "-c", "echo $(id -u) $(id -g)").want(t, 0, "1000 27\n")
		se.run("", "-g", "#4242", "id", "-g").want(t, 0, "4242\n")
	})
	t.Run("exit codes propagate", func(t *testing.T) {
		se.run("", "sh", "-c", "exit 7").want(t, 7, "")
		se.run("", "true").want(t, 0, "")
		se.run("", "false").want(t, 1, "")
		se.run("", "sh", "-c", "kill -TERM $$").want(t, 128+int(syscall.SIGTERM), "")
	})
	t.Run("stdin is the caller's", func(t *testing.T) {
		target := filepath.Join(se.rhome, "x") // root's home is 0700
		se.run("hi\n", "tee", target).want(t, 0, "hi\n")
		b, err := os.ReadFile(target)
		must(t, err)
		if string(b) != "hi\n" {
			t.Fatalf("file: %q", b)
		}
		fi, err := os.Stat(target)
		must(t, err)
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != 0 {
			t.Fatalf("file owned by %d, want root", st.Uid)
		}
	})
	t.Run("-n, -S, -k, -v, -V, -l", func(t *testing.T) {
		se.run("", "-n", "true").want(t, 0, "")
		se.run("", "-S", "-k", "echo", "x").want(t, 0, "x\n")
		se.run("", "-v").want(t, 0, "")
		se.run("", "-K").want(t, 0, "")
		if r := se.run("", "-V"); r.code != 0 || !strings.HasPrefix(r.stdout, "Sudo version ") {
			t.Fatalf("-V: %+v", r)
		}
		if r := se.run("", "-l"); r.code != 0 || !strings.Contains(r.stdout, "(ALL : ALL) NOPASSWD: ALL") {
			t.Fatalf("-l: %+v", r)
		}
		se.run("", "-l", "true").want(t, 0, "/usr/bin/true\n")
	})
	t.Run("usage errors", func(t *testing.T) {
		for _, args := range [][]string{{"-Z", "true"}, {"--bogus", "true"}, {}, {"-u"}, {"-i", "-s"}} {
			r := se.run("", args...)
			if r.code != 1 || !strings.Contains(r.stderr, "usage: sudo") {
				t.Fatalf("%v: %+v", args, r)
			}
		}
		if r := se.run("", "-u", "nosuchuser", "true"); r.code != 1 || !strings.Contains(r.stderr, "unknown user nosuchuser") {
			t.Fatalf("unknown user: %+v", r)
		}
		if r := se.run("", "no-such-command-xyz"); r.code != 1 || !strings.Contains(r.stderr, "no-such-command-xyz: command not found") {
			t.Fatalf("unknown command: %+v", r)
		}
	})
	t.Run("environment is reset; -E and --preserve-env keep it", func(t *testing.T) {
		script := `echo "$FOO|$HOME|$USER|$SUDO_USER|$SUDO_UID|$TERM|$PATH|$SUDO_COMMAND"`
		se.run("", "sh", "-c", script).want(t, 0,
			"|"+se.rhome+"|root|user|1000|xterm-test|"+envdapi.DefaultPath+"|/usr/bin/sh -c "+script+"\n")
		se.run("", "-E", "sh", "-c", `echo "$FOO|$HOME|$USER"`).want(t, 0, "from-caller|"+se.home+"|root\n")
		se.run("", "-E", "-H", "sh", "-c", `echo "$HOME"`).want(t, 0, se.rhome+"\n")
		se.run("", "--preserve-env=FOO", "sh", "-c", `echo "$FOO"`).want(t, 0, "from-caller\n")
		se.run("", "BAR=set", "sh", "-c", `echo "$BAR"`).want(t, 0, "set\n")
		// The shim's socket setting is not passed on.
		se.run("", "-E", "sh", "-c", `echo "${`+SocketEnv+`-unset}"`).want(t, 0, "unset\n")
	})
	t.Run("cwd, -D, -i, -s", func(t *testing.T) {
		se.run("", "pwd").want(t, 0, se.home+"\n")
		se.run("", "-D", "/tmp", "pwd").want(t, 0, "/tmp\n")
		// -i: the target's login shell in its home, command escaped for -c.
		se.run("", "-i", "echo", "$0", "a b").want(t, 0, "-bash a b\n")
		se.run("", "-i", "pwd").want(t, 0, se.rhome+"\n")
		se.run("", "-s", "echo", "$0").want(t, 0, "/bin/sh\n")
		se.run("echo from-stdin $(id -u)\n", "-s").want(t, 0, "from-stdin 0\n")
	})
	t.Run("unreachable cwd: warn and run in /", func(t *testing.T) {
		c := se.cmd("-u", "user", "pwd")
		c.Dir, c.SysProcAttr = se.rhome, nil // root's home; the shim itself runs as root here
		r := runCmd(t, c, "")
		if r.code != 0 || r.stdout != "/\n" || !strings.Contains(r.stderr, "unable to change directory to "+se.rhome) {
			t.Fatalf("%+v", r)
		}
	})
}

// The shim needs no privilege of its own: under no_new_privs (which makes the
// kernel ignore setuid bits) it still gets root, and the command it asked for
// does not inherit no_new_privs.
func TestSudoUnderNoNewPrivs(t *testing.T) {
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		testenv.Missing(t, "setpriv (util-linux) not installed")
	}
	se := newSudoEnv(t)
	wrap := func(args ...string) *exec.Cmd {
		c := se.cmd(args...)
		c.Path, c.Args = setpriv, append([]string{"setpriv", "--no-new-privs", se.shim}, args...)
		return c
	}
	// The wrapper really sets it (the shim sees it)...
	c := wrap("-l")
	c.Path, c.Args = setpriv, []string{"setpriv", "--no-new-privs", "grep", "^NoNewPrivs:", "/proc/self/status"}
	if r := runCmd(t, c, ""); r.stdout != "NoNewPrivs:\t1\n" {
		t.Fatalf("setpriv did not set no_new_privs: %+v", r)
	}
	// ...and sudo works regardless.
	runCmd(t, wrap("whoami"), "").want(t, 0, "root\n")
	runCmd(t, wrap("grep", "^NoNewPrivs:", "/proc/self/status"), "").want(t, 0, "NoNewPrivs:\t0\n")
}

// startBackground starts the shim with its stdout read line by line.
func (se *sudoEnv) startBackground(t *testing.T, args ...string) (*exec.Cmd, *bufio.Reader, chan sudoResult) {
	t.Helper()
	c := se.cmd(args...)
	out, err := c.StdoutPipe()
	must(t, err)
	var errb bytes.Buffer
	c.Stderr = &errb
	must(t, c.Start())
	done := make(chan sudoResult, 1)
	br := bufio.NewReader(out)
	go func() {
		err := c.Wait()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		}
		done <- sudoResult{stderr: errb.String(), code: code}
	}()
	t.Cleanup(func() { _ = c.Process.Kill() })
	return c, br, done
}

func readLine(t *testing.T, br *bufio.Reader) string {
	t.Helper()
	ch := make(chan string, 1)
	go func() {
		l, _ := br.ReadString('\n')
		ch <- strings.TrimSpace(l)
	}()
	select {
	case l := <-ch:
		return l
	case <-time.After(30 * time.Second):
		t.Fatal("no line from the command")
		return ""
	}
}

func TestSudoForwardsSignals(t *testing.T) {
	se := newSudoEnv(t)
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGUSR1} {
		name := sig.String()
		c, br, done := se.startBackground(t, "bash", "-c",
			`trap 'echo trapped; exit 3' `+strconv.Itoa(int(sig))+`; echo ready; while :; do sleep 0.05; done`)
		if l := readLine(t, br); l != "ready" {
			t.Fatalf("%s: first line %q", name, l)
		}
		must(t, c.Process.Signal(sig))
		if l := readLine(t, br); l != "trapped" {
			t.Fatalf("%s: got %q, want trapped", name, l)
		}
		if r := <-done; r.code != 3 {
			t.Fatalf("%s: exit %d (stderr %q), want 3", name, r.code, r.stderr)
		}
	}
}

// A shim that dies (SIGKILL, as the SDK's kill does to a command's process
// group) takes its command down: the whole session, other job groups included.
func TestSudoShimDeathKillsCommand(t *testing.T) {
	se := newSudoEnv(t)
	c, br, done := se.startBackground(t, "bash", "-c", `set -m; sleep 1000 & echo $!; echo $$; wait`)
	job, err := strconv.Atoi(readLine(t, br))
	must(t, err)
	leader, err := strconv.Atoi(readLine(t, br))
	must(t, err)
	if pg, _ := syscall.Getpgid(job); pg == leader {
		t.Fatalf("the background job should be in its own process group")
	}
	must(t, c.Process.Signal(syscall.SIGKILL))
	<-done
	for _, pid := range []int{leader, job} {
		testenv.Eventually(t, 20*time.Second, "the command to die with its shim", func() bool {
			return !testenv.Alive(pid)
		})
	}
}

// With a terminal, the command gets one of its own as controlling terminal:
// interactive programs, ^C and window sizes work as with sudo's use_pty.
func TestSudoTerminal(t *testing.T) {
	se := newSudoEnv(t)
	type term struct {
		c    *exec.Cmd
		ptm  *os.File
		mu   sync.Mutex
		out  bytes.Buffer
		done chan int
	}
	start := func(args ...string) *term {
		c := se.cmd(args...)
		ptm, err := pty.StartWithSize(c, &pty.Winsize{Rows: 30, Cols: 100})
		must(t, err)
		tm := &term{c: c, ptm: ptm, done: make(chan int, 1)}
		go func() {
			buf := make([]byte, 4096)
			for {
				n, err := ptm.Read(buf)
				tm.mu.Lock()
				tm.out.Write(buf[:n])
				tm.mu.Unlock()
				if err != nil {
					return
				}
			}
		}()
		go func() {
			err := c.Wait()
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			}
			tm.done <- code
		}()
		t.Cleanup(func() { _ = c.Process.Kill(); ptm.Close() })
		return tm
	}
	text := func(tm *term) string {
		tm.mu.Lock()
		defer tm.mu.Unlock()
		return tm.out.String()
	}
	waitFor := func(tm *term, sub string) {
		t.Helper()
		testenv.Eventually(t, 30*time.Second, "terminal output "+strconv.Quote(sub), func() bool {
			return strings.Contains(text(tm), sub)
		})
	}
	wait := func(tm *term) int {
		t.Helper()
		select {
		case code := <-tm.done:
			return code
		case <-time.After(30 * time.Second):
			t.Fatalf("shim did not exit; output %q", text(tm))
			return -1
		}
	}

	// A controlling terminal of its own, with our size; a prompt and a reply.
	tm := start("bash", "-c", `tty; stty size; ps -o tty= -p $$; read -p "name? " x; echo "hello-$x"`)
	waitFor(tm, "name? ")
	outer, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(int(tm.ptm.Fd())))
	must(t, err)
	_, _ = tm.ptm.Write([]byte("bob\r"))
	waitFor(tm, "hello-bob")
	if code := wait(tm); code != 0 {
		t.Fatalf("exit %d: %q", code, text(tm))
	}
	lines := strings.Split(strings.ReplaceAll(text(tm), "\r", ""), "\n")
	if len(lines) < 3 || !strings.HasPrefix(lines[0], "/dev/pts/") || lines[1] != "30 100" ||
		!strings.HasPrefix(lines[2], "pts/") || "/dev/"+lines[2] != lines[0] {
		t.Fatalf("terminal: %q (outer %s)", text(tm), outer)
	}

	// ^C reaches the command through its terminal's line discipline.
	tm = start("sh", "-c", "echo ready; sleep 1000")
	waitFor(tm, "ready")
	// Under load the first ^C can land while sh is still between its echo and
	// the sleep; repeat it until the command ends rather than race that window.
	stopCtrlC := make(chan struct{})
	go func() {
		for {
			_, _ = tm.ptm.Write([]byte{3})
			select {
			case <-stopCtrlC:
				return
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()
	code := wait(tm)
	close(stopCtrlC)
	if code != 128+int(syscall.SIGINT) {
		t.Fatalf("^C: exit %d, output %q", code, text(tm))
	}

	// A resize of our terminal reaches the command's. The shim learns of it by
	// SIGWINCH, asynchronously: ask again until the new size shows.
	tm = start("bash", "-c", `echo ready; while read x; do [ "$x" = q ] && exit 0; stty size; done`)
	waitFor(tm, "ready")
	must(t, pty.Setsize(tm.ptm, &pty.Winsize{Rows: 41, Cols: 133}))
	testenv.Eventually(t, 30*time.Second, "the new size in the command's terminal", func() bool {
		_, _ = tm.ptm.Write([]byte("\r"))
		time.Sleep(50 * time.Millisecond)
		return strings.Contains(text(tm), "41 133")
	})
	_, _ = tm.ptm.Write([]byte("q\r"))
	if code := wait(tm); code != 0 {
		t.Fatalf("resize: exit %d, output %q", code, text(tm))
	}
}

func countFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	must(t, err)
	return len(ents)
}

// Bad clients end their own connection and nothing else: no panic, no leaked
// fds, no wedged goroutine; sudo keeps working.
func TestSudoServerRejectsBadClients(t *testing.T) {
	old := sudoHandshakeTimeout
	sudoHandshakeTimeout = 300 * time.Millisecond
	defer func() { sudoHandshakeTimeout = old }()
	se := newSudoEnv(t)
	se.run("", "true").want(t, 0, "") // warm up, so the fd baseline includes lazily opened files

	dial := func() *net.UnixConn {
		c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: se.sock, Net: "unix"})
		must(t, err)
		return c
	}
	// answer reads the server's reply (if any) and then EOF.
	answer := func(c *net.UnixConn) string {
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		var r sudoReply
		err := readFrame(c, sudoMaxMessage, &r)
		if err != nil {
			return "closed: " + err.Error()
		}
		// EOF, or a reset when the server left part of a bad request unread.
		if _, err := c.Read(make([]byte, 1)); err != io.EOF && !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("connection not closed after the error reply: %v", err)
		}
		return r.Error
	}
	pipeFDs := func(n int) []int {
		var fds []int
		for len(fds) < n {
			var p [2]int
			must(t, syscall.Pipe2(p[:], syscall.O_CLOEXEC))
			fds = append(fds, p[0], p[1])
		}
		t.Cleanup(func() {
			for _, fd := range fds {
				syscall.Close(fd)
			}
		})
		return fds[:n]
	}
	frame := func(body string) []byte {
		b := make([]byte, 4+len(body))
		binary.BigEndian.PutUint32(b, uint32(len(body)))
		copy(b[4:], body)
		return b
	}

	// The fds to send are made first: they are this process's too, and the
	// count must show only what the server received.
	rights := map[int][]byte{}
	for _, n := range []int{2, 3, 5} {
		rights[n] = syscall.UnixRights(pipeFDs(n)...)
	}
	before := countFDs(t)

	// Silent clients, more than are read at once: each is dropped after the
	// handshake timeout, and sudo still works (once slots free up).
	var silent []*net.UnixConn
	for range sudoMaxHandshakes + 4 {
		silent = append(silent, dial())
	}
	se.run("", "true").want(t, 0, "")
	for _, c := range silent {
		if got := answer(c); !strings.Contains(got, "invalid request") {
			t.Fatalf("silent client: %q", got)
		}
		c.Close()
	}
	cases := []struct {
		name string
		data []byte
		fds  int
		want string
	}{
		{"no fds", frame(`{"command":["true"]}`), 0, "carried 0 fds"},
		{"too many fds", frame(`{"command":["true"]}`), 5, "too many fds"},
		{"two fds", frame(`{"command":["true"]}`), 2, "carried 2 fds"},
		{"huge frame", []byte{0xff, 0xff, 0xff, 0xff}, 3, "too large"},
		{"not json", frame(`{nope`), 3, "decoding"},
		{"short body", frame(`{"command":["true"]}`)[:10], 3, "invalid request"},
		{"no command", frame(`{"ctty":-1}`), 3, "no command given"},
	}
	for _, tc := range cases {
		c := dial()
		if _, _, err := c.WriteMsgUnix(tc.data, rights[tc.fds], nil); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := answer(c); !strings.Contains(got, tc.want) {
			t.Fatalf("%s: got %q, want %q", tc.name, got, tc.want)
		}
		c.Close()
	}
	se.run("", "sh", "-c", "exit 5").want(t, 5, "")
	testenv.Eventually(t, 20*time.Second, "received fds to be closed", func() bool {
		return countFDs(t) <= before
	})
}

// ^Z (SIGTSTP to the shim) suspends the command and the shim, like a shell
// job; SIGCONT (fg) resumes both.
func TestSudoSuspendResume(t *testing.T) {
	se := newSudoEnv(t)
	c, br, done := se.startBackground(t, "sh", "-c", `echo $$; exec sleep 1000`)
	pid, err := strconv.Atoi(readLine(t, br))
	must(t, err)
	state := func(pid int) string {
		st := procStatusField(pid, "State")
		if st == "" {
			return "gone"
		}
		return st[:1]
	}
	must(t, c.Process.Signal(syscall.SIGTSTP))
	testenv.Eventually(t, 20*time.Second, "command and shim to stop", func() bool {
		return state(pid) == "T" && state(c.Process.Pid) == "T"
	})
	must(t, c.Process.Signal(syscall.SIGCONT))
	testenv.Eventually(t, 20*time.Second, "command and shim to run again", func() bool {
		return state(pid) == "S" && state(c.Process.Pid) != "T"
	})
	must(t, c.Process.Signal(syscall.SIGTERM))
	if r := <-done; r.code != 128+int(syscall.SIGTERM) {
		t.Fatalf("exit %d (stderr %q)", r.code, r.stderr)
	}
}

func TestSudoeditRefused(t *testing.T) {
	se := newSudoEnv(t)
	c := se.cmd("/etc/hostname")
	c.Args[0] = "sudoedit"
	if r := runCmd(t, c, ""); r.code != 1 || !strings.Contains(r.stderr, "sudoedit is not supported") {
		t.Fatalf("%+v", r)
	}
}

func procStatusField(pid int, field string) string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, field+":") {
			return strings.TrimSpace(l[len(field)+1:])
		}
	}
	return ""
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
