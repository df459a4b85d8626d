package sudo

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/unixuser"
	"github.com/airlock-sandbox/airlock/internal/usercgroup"
)

// sudoPlan is a validated sudo request: who runs what, where, with which
// environment. It follows sudo 1.9 with Debian's default sudoers (env_reset,
// secure_path) so scripts written for E2B's sudo see the same environment.
type sudoPlan struct {
	user *unixuser.User
	path string   // executable
	argv []string // argv[0] included ("-bash" for a login shell)
	env  []string
	dir  string
	// dirOptional: the cwd is the caller's, which the target user may not be
	// able to enter; sudo then warns and runs the command anyway.
	dirOptional bool
}

// sudoKeepEnv are the variables env_reset keeps from the caller: sudo's
// built-in keep list plus its env_check list (terminal, locale, time zone).
var sudoKeepEnv = map[string]bool{
	"TERM": true, "COLORTERM": true, "DISPLAY": true, "XAUTHORITY": true, "XAUTHORIZATION": true,
	"LANG": true, "LANGUAGE": true, "LINGUAS": true, "TZ": true, "COLORS": true, "LS_COLORS": true,
	"PS1": true, "PS2": true, "HOSTNAME": true, "KRB5CCNAME": true, "XDG_CURRENT_DESKTOP": true,
}

func sudoKeeps(name string) bool {
	return sudoKeepEnv[name] || strings.HasPrefix(name, "LC_")
}

// sudoPlan resolves a request from the caller with the given credentials.
func (s *Server) sudoPlan(req *sudoRequest, cred *unix.Ucred) (*sudoPlan, error) {
	callerName, ok := s.Users.UserName(cred.Uid)
	if !ok {
		callerName = "#" + strconv.FormatUint(uint64(cred.Uid), 10)
	}
	target, err := s.sudoTarget(req, cred, callerName)
	if err != nil {
		return nil, err
	}
	if req.Group != "" {
		gid, err := s.sudoGroupID(req.Group)
		if err != nil {
			return nil, err
		}
		// -g replaces the primary group; supplementary groups stay the user's.
		target.GID = gid
		target.Groups = append([]uint32{gid}, target.Groups...)
	}
	shell := target.Shell
	if shell == "" {
		shell = "/bin/sh"
	}

	// The caller's environment, in order, without the shim's own knob.
	var callerKeys []string
	callerEnv := map[string]string{}
	for _, kv := range req.Env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" || k == SocketEnv || strings.Contains(kv, "\x00") {
			continue
		}
		if _, dup := callerEnv[k]; !dup {
			callerKeys = append(callerKeys, k)
		}
		callerEnv[k] = v
	}
	var order []string
	vals := map[string]string{}
	set := func(k, v string) {
		if _, ok := vals[k]; !ok {
			order = append(order, k)
		}
		vals[k] = v
	}
	keep := map[string]bool{}
	for _, k := range req.PreserveList {
		keep[k] = true
	}
	preserveAll := req.PreserveEnv && !req.Login
	for _, k := range callerKeys {
		if preserveAll || sudoKeeps(k) || keep[k] {
			set(k, callerEnv[k])
		}
	}
	if _, ok := vals["HOME"]; !ok || !preserveAll || req.SetHome {
		set("HOME", target.Home)
	}
	set("PATH", sudoSecurePath)
	if _, ok := vals["SHELL"]; !ok || !preserveAll {
		set("SHELL", shell)
	}
	set("LOGNAME", target.Name)
	set("USER", target.Name)
	if !preserveAll {
		set("MAIL", "/var/mail/"+target.Name)
	}
	set("SUDO_USER", callerName)
	set("SUDO_UID", strconv.FormatUint(uint64(cred.Uid), 10))
	set("SUDO_GID", strconv.FormatUint(uint64(cred.Gid), 10))
	for _, kv := range req.Assign {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.Contains(kv, "\x00") {
			return nil, fmt.Errorf("invalid environment assignment %q", kv)
		}
		set(k, v)
	}

	pl := &sudoPlan{user: target, dir: req.Cwd, dirOptional: true}
	if req.Chdir != "" {
		pl.dir, pl.dirOptional = req.Chdir, false
		if !filepath.IsAbs(pl.dir) && req.Cwd != "" {
			pl.dir = filepath.Join(req.Cwd, pl.dir)
		}
	}
	if pl.dir == "" || !filepath.IsAbs(pl.dir) {
		pl.dir = "/"
	}
	switch {
	case req.Login:
		// A login shell in the target's home, as `sudo -i` (and `su -`) do.
		pl.path = shell
		pl.argv = []string{"-" + filepath.Base(shell)}
		if len(req.Command) > 0 {
			pl.argv = append(pl.argv, "-c", sudoShellJoin(req.Command))
		}
		pl.dir, pl.dirOptional = target.Home, true
	case req.Shell:
		if sh := callerEnv["SHELL"]; sh != "" {
			shell = sh
		}
		pl.path = shell
		pl.argv = []string{shell}
		if len(req.Command) > 0 {
			pl.argv = append(pl.argv, "-c", sudoShellJoin(req.Command))
		}
	default:
		if len(req.Command) == 0 || req.Command[0] == "" {
			return nil, errors.New("no command given")
		}
		env := []string{"PATH=" + vals["PATH"]}
		path, err := unixuser.LookPath(req.Command[0], env, pl.dir, "")
		if err != nil {
			return nil, fmt.Errorf("%s: command not found", req.Command[0])
		}
		pl.path = path
		pl.argv = append([]string{req.Command[0]}, req.Command[1:]...)
	}
	cmdline := strings.Join(append([]string{pl.path}, pl.argv[1:]...), " ")
	if len(cmdline) > 4096 {
		cmdline = cmdline[:4096]
	}
	set("SUDO_COMMAND", cmdline)
	for _, k := range order {
		pl.env = append(pl.env, k+"="+vals[k])
	}
	return pl, nil
}

// sudoTarget resolves -u (default root). -g alone keeps the caller's own user.
func (s *Server) sudoTarget(req *sudoRequest, cred *unix.Ucred, callerName string) (*unixuser.User, error) {
	name := req.User
	if name == "" {
		name = "root"
		if req.Group != "" {
			name = callerName
		}
	}
	if strings.HasPrefix(name, "#") {
		uid, err := strconv.ParseUint(name[1:], 10, 32)
		if err != nil {
			return nil, fmt.Errorf("unknown user %s", name)
		}
		if n, ok := s.Users.UserName(uint32(uid)); ok {
			name = n
		} else {
			// An id without an account, as sudo allows: no home, its own group.
			return &unixuser.User{Name: name, UID: uint32(uid), GID: uint32(uid), Groups: []uint32{uint32(uid)}, Home: "/", Shell: "/bin/sh"}, nil
		}
	}
	u, err := s.Users.LookupUser(name)
	if err != nil {
		return nil, fmt.Errorf("unknown user %s", name)
	}
	return u, nil
}

// sudoGroupID resolves -g: a group name of the sandbox's /etc/group or #gid.
func (s *Server) sudoGroupID(name string) (uint32, error) {
	if strings.HasPrefix(name, "#") {
		gid, err := strconv.ParseUint(name[1:], 10, 32)
		if err != nil {
			return 0, fmt.Errorf("unknown group %s", name)
		}
		return uint32(gid), nil
	}
	if db, ok := s.Users.(*unixuser.EtcUserDB); ok {
		if gid, ok := db.LookupGroup(name); ok {
			return gid, nil
		}
	}
	return 0, fmt.Errorf("unknown group %s", name)
}

// sudoShellJoin joins a command for `sh -c` the way sudo -s/-i do: every
// character but letters, digits, '_', '-' and '$' is backslash-escaped.
func sudoShellJoin(args []string) string {
	var b strings.Builder
	for i, a := range args {
		if i > 0 {
			b.WriteByte(' ')
		}
		for _, r := range a {
			if !(r == '_' || r == '-' || r == '$' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= 0x80) {
				b.WriteByte('\\')
			}
			b.WriteRune(r)
		}
	}
	return b.String()
}

// start runs the plan with the shim's files as stdio, in a new session (so
// signals reach its whole process group and a terminal can be its controlling
// one). syscall.ForkExec rather than os/exec: os/exec would switch the shim's
// files to blocking mode behind its back (File.Fd), and it wants an os.File
// per descriptor.
func (pl *sudoPlan) start(fds []int, ctty int) (*sudoChild, error) {
	sys := &syscall.SysProcAttr{Setsid: true, Credential: unixuser.Credential(pl.user)}
	if ctty >= 0 && ctty < sudoFDs {
		sys.Setctty, sys.Ctty = true, ctty
	}
	attr := &syscall.ProcAttr{
		Dir:   pl.dir,
		Env:   pl.env,
		Files: []uintptr{uintptr(fds[0]), uintptr(fds[1]), uintptr(fds[2])},
		Sys:   sys,
	}
	var pid int
	forkExec := func() (err error) {
		// In a cgroup of its own, as every user process (internal/usercgroup).
		err, _ = usercgroup.Start(sys, func() (err error) {
			pid, err = syscall.ForkExec(pl.path, pl.argv, attr)
			return err
		})
		return err
	}
	err := forkExec()
	if err != nil && pl.dirOptional && pl.dir != "/" && (errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.ENOENT)) {
		// The child changes directory after switching user; the caller's cwd
		// (or the target's home) may be out of its reach. sudo warns and goes on.
		if _, statErr := os.Stat(pl.path); statErr == nil {
			msg := fmt.Sprintf("sudo: unable to change directory to %s: %v\n", pl.dir, err)
			_, _ = syscall.Write(fds[2], []byte(msg))
			attr.Dir = "/"
			err = forkExec()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("unable to execute %s: %w", pl.path, err)
	}
	return &sudoChild{pid: pid}, nil
}
