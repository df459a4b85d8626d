// Package buildstep is `envd step`: the first process of a template build's
// sandbox, which runs one build step (a RUN instruction) as Docker would —
// user and groups resolved against the image's own /etc files, the
// environment completed, stdin from /dev/null — reaps every orphan while it
// waits, and writes how the step ended for the host (envdapi.StepResult).
package buildstep

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/airlock-sandbox/airlock/internal/envdapi"
	"github.com/airlock-sandbox/airlock/internal/sysinfo"
	"github.com/airlock-sandbox/airlock/internal/unixuser"
)

// Cred is the identity a step's command runs as.
type Cred struct {
	Name   string // "" when the uid has no passwd entry
	UID    uint32
	GID    uint32
	Groups []uint32 // supplementary groups (the primary included)
	Home   string
}

// ResolveUser resolves Docker's USER against the rootfs db reads, the way
// Docker (runc's user.GetExecUser) does:
//   - "" is root;
//   - a name must exist in /etc/passwd; a numeric uid need not (then gid 0,
//     home /);
//   - without a group, the primary group is passwd's and the supplementary
//     groups are those of /etc/group that list the user by name;
//   - with ":group" (a name of /etc/group, or a gid that need not exist), that
//     group is the only one.
func ResolveUser(db *unixuser.EtcUserDB, spec string) (*Cred, error) {
	userPart, groupPart, hasGroup := strings.Cut(spec, ":")
	if hasGroup && groupPart == "" {
		return nil, fmt.Errorf("user %q: empty group", spec)
	}
	if userPart == "" {
		if hasGroup {
			return nil, fmt.Errorf("user %q: empty user", spec)
		}
		userPart = "root"
	}
	c := &Cred{Home: "/"}
	var u *unixuser.User
	if uid, err := strconv.ParseUint(userPart, 10, 32); err == nil {
		c.UID = uint32(uid)
		if name, ok := db.UserName(c.UID); ok {
			if u, err = db.LookupUser(name); err != nil {
				u = nil
			}
		}
	} else {
		if u, err = db.LookupUser(userPart); err != nil {
			return nil, fmt.Errorf("user %q: no such user in /etc/passwd", userPart)
		}
		c.UID = u.UID
	}
	if u != nil {
		c.Name, c.GID, c.Home = u.Name, u.GID, u.Home
		c.Groups = append([]uint32(nil), u.Groups...)
	} else {
		c.Groups = []uint32{0}
	}
	if hasGroup {
		gid, err := resolveGroup(db, groupPart)
		if err != nil {
			return nil, fmt.Errorf("user %q: %w", spec, err)
		}
		c.GID = gid
		c.Groups = []uint32{gid}
	}
	if c.Home == "" {
		c.Home = "/"
	}
	return c, nil
}

func resolveGroup(db *unixuser.EtcUserDB, name string) (uint32, error) {
	if gid, err := strconv.ParseUint(name, 10, 32); err == nil {
		return uint32(gid), nil
	}
	if gid, ok := db.LookupGroup(name); ok {
		return gid, nil
	}
	if name == "root" {
		return 0, nil
	}
	return 0, fmt.Errorf("no such group %q in /etc/group", name)
}

// Env completes a step's environment: HOME, USER, LOGNAME and PATH get
// defaults (from cred) when env lacks them; what env sets wins.
func Env(env []string, cred *Cred) []string {
	out := append([]string(nil), env...)
	has := map[string]bool{}
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		has[k] = true
	}
	name := cred.Name
	if name == "" {
		name = strconv.FormatUint(uint64(cred.UID), 10)
	}
	for _, kv := range [][2]string{{"PATH", envdapi.DefaultPath}, {"HOME", cred.Home}, {"USER", name}, {"LOGNAME", name}} {
		if !has[kv[0]] {
			out = append(out, kv[0]+"="+kv[1])
		}
	}
	return out
}

// lookPath finds a step's program in its PATH, Debian's default without one.
func lookPath(file string, env []string) (string, error) {
	p, err := unixuser.LookPath(file, env, "", envdapi.DefaultPath)
	if errors.Is(err, unixuser.ErrNotInPath) {
		return "", fmt.Errorf("%s: command not found in PATH", file)
	}
	return p, err
}

// Run is `envd step`: it reads a envdapi.StepSpec from in, runs the command as
// described (stdin /dev/null, stdout and stderr both to envd's stdout), reaps
// every process that ends while it waits (it is the sandbox's pid 1, so every
// orphan becomes its child), writes the envdapi.StepResult, and returns envd's own
// exit status. When it returns, the sandbox's pid 1 exits and the kernel kills
// whatever the step left running.
func Run(in io.Reader, logger *slog.Logger) int {
	var spec envdapi.StepSpec
	if err := json.NewDecoder(io.LimitReader(in, 4<<20)).Decode(&spec); err != nil {
		logger.Error("step: reading the spec from stdin", "err", err)
		return 2
	}
	exitFile := spec.ExitFile
	if exitFile == "" {
		exitFile = envdapi.StepExitFile
	}
	res := runStep(spec)
	if err := envdapi.WriteStepResult(exitFile, res); err != nil {
		logger.Error("step: writing the result", "err", err)
		return 2
	}
	if res.Error != "" {
		fmt.Fprintf(os.Stdout, "airlock: %s\n", res.Error)
		return 1
	}
	return 0
}

func runStep(spec envdapi.StepSpec) envdapi.StepResult {
	if len(spec.Args) == 0 {
		return envdapi.StepResult{Error: "step has no command"}
	}
	cred, err := ResolveUser(&unixuser.EtcUserDB{Root: "/"}, spec.User)
	if err != nil {
		return envdapi.StepResult{Error: err.Error()}
	}
	cwd := spec.Cwd
	if cwd == "" {
		cwd = "/"
	}
	if fi, err := os.Stat(cwd); err != nil || !fi.IsDir() {
		return envdapi.StepResult{Error: fmt.Sprintf("working directory %s does not exist", cwd)}
	}
	env := Env(spec.Env, cred)
	bin, err := lookPath(spec.Args[0], env)
	if err != nil {
		return envdapi.StepResult{Error: err.Error()}
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return envdapi.StepResult{Error: err.Error()}
	}
	defer devnull.Close()
	groups := cred.Groups
	if len(groups) == 0 {
		groups = []uint32{cred.GID}
	}
	// Register before the child exists so that no signal is lost; pid 1
	// ignores every other signal, as the kernel does for a namespace's init.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)
	// os.StartProcess, not os/exec: this process reaps every child with
	// wait4(-1), which would steal os/exec's own Wait. Forked, like every
	// user process of a sandbox, from a thread that dropped CAP_SYS_PTRACE
	// and traps sysinfo (internal/sysinfo): a build step is no less the
	// user's code than a command.
	var p *os.Process
	started := make(chan error, 1)
	sysinfo.OnDisposableThread(func() {
		err, filterErr := sysinfo.PrepareThread()
		if err != nil {
			started <- err
			return
		}
		if filterErr != nil {
			fmt.Fprintf(os.Stdout, "airlock: sysinfo shows the host's memory in this step: %v\n", filterErr)
		}
		p, err = os.StartProcess(bin, spec.Args, &os.ProcAttr{
			Dir:   cwd,
			Env:   env,
			Files: []*os.File{devnull, os.Stdout, os.Stdout},
			Sys: &syscall.SysProcAttr{
				Credential: &syscall.Credential{Uid: cred.UID, Gid: cred.GID, Groups: groups},
				Setsid:     true,
			},
		})
		started <- err
	})
	if err := <-started; err != nil {
		return envdapi.StepResult{Error: fmt.Sprintf("start %s: %v", spec.Args[0], err)}
	}
	go func() {
		for sig := range sigs {
			_ = p.Signal(sig)
		}
	}()
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			return envdapi.StepResult{Error: fmt.Sprintf("wait: %v", err)}
		}
		if pid != p.Pid {
			continue // an orphan the step left: reaped
		}
		switch {
		case ws.Exited():
			return envdapi.StepResult{ExitCode: ws.ExitStatus()}
		case ws.Signaled():
			return envdapi.StepResult{ExitCode: 128 + int(ws.Signal()), Signal: int(ws.Signal())}
		}
	}
}
