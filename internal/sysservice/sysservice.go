// Package sysservice installs `airlock serve` as a systemd service: a unit
// that starts it at boot with the flags it was installed with, restarts it
// when it fails, and leaves the sandboxes running when it stops (the next
// start re-adopts them, as after any restart of the server).
//
// Install and Uninstall work on a running systemd (daemon-reload, enable,
// start) and offline, on a root directory (systemctl --root: the unit and
// its enablement are written, and it starts at the next boot).
package sysservice

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/localca"
)

// Name is the unit's name.
const Name = "airlock.service"

// Options say what to install and where.
type Options struct {
	// Root is the root directory the unit is installed under ("" or "/":
	// this machine, through its running systemd when there is one).
	Root string
	// Binary and Envd are the absolute paths of the airlock and envd
	// binaries the service runs.
	Binary, Envd string
	// ServeArgs are passed to `airlock serve` as they are.
	ServeArgs []string
	// APIKey, when set, goes into EnvFile (mode 0600), never into the unit,
	// which anyone may read.
	APIKey string
	// NoStart installs and enables without starting (or restarting) now.
	NoStart bool
}

// UnitPath and EnvFile are where the unit and its environment file go,
// under root.
func UnitPath(root string) string { return filepath.Join(rootOf(root), "etc/systemd/system", Name) }
func EnvFile(root string) string  { return filepath.Join(rootOf(root), "etc/default/airlock") }

func rootOf(root string) string {
	if root == "" {
		return "/"
	}
	return root
}

// envFileOnHost is EnvFile as the unit names it (always on the host it
// runs on).
const envFileOnHost = "/etc/default/airlock"

// Unit renders the unit file.
//
// KillMode=process: stopping the service stops the server alone. Every
// sandbox's processes (and lxcfs, which serves their /proc views) were
// started by it and sit in the service's cgroup; the default would kill
// them all, while Airlock keeps sandboxes across restarts of the server and
// re-adopts them. The open-file limit is raised here because a server holds
// three or four descriptors per sandbox and only a process with
// CAP_SYS_RESOURCE, as systemd is, can raise the hard limit.
func Unit(o Options) string {
	args := append([]string{o.Binary, "serve"}, o.ServeArgs...)
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = quote(a)
	}
	return fmt.Sprintf(`# Written by "airlock service install"; "airlock service uninstall" removes it.
[Unit]
Description=Airlock: secure sandboxes for AI agents, E2B-compatible
Documentation=https://github.com/airlock-sandbox/airlock
After=network-online.target
Wants=network-online.target

[Service]
Type=exec
ExecStart=%s
Environment=AIRLOCK_ENVD=%s
EnvironmentFile=-%s
Restart=on-failure
RestartSec=2s
KillMode=process
TimeoutStopSec=30s
LimitNOFILE=1048576
TasksMax=infinity
SyslogIdentifier=airlock

[Install]
WantedBy=multi-user.target
`, strings.Join(quoted, " "), quote(o.Envd), envFileOnHost)
}

// quote quotes a word for a unit's command line when it needs it; % and $
// are escaped so systemd expands neither.
func quote(s string) string {
	s = strings.ReplaceAll(s, "%", "%%")
	s = strings.ReplaceAll(s, "$", "$$")
	if s != "" && !strings.ContainsAny(s, " \t\"'\\;") {
		return s
	}
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}

// Running reports whether systemd runs this machine (sd_booted(3)).
func Running() bool {
	_, err := os.Stat("/run/systemd/system")
	return err == nil
}

// live reports whether Install and Uninstall act on the running systemd.
func (o Options) live() bool { return rootOf(o.Root) == "/" && Running() }

func systemctl(root string, args ...string) error {
	if rootOf(root) != "/" {
		args = append([]string{"--root=" + root}, args...)
	}
	out, err := exec.Command("systemctl", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("systemctl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// writeFile replaces path atomically (localca.WriteAtomic): a crash leaves
// the old file or the new one.
func writeFile(path string, data []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return localca.WriteAtomic(path, data, mode)
}

// Install writes the unit (and the environment file with an API key),
// enables it and, on a running systemd, (re)starts it unless NoStart. It
// says what it did.
func Install(o Options) (string, error) {
	if !filepath.IsAbs(o.Binary) || !filepath.IsAbs(o.Envd) {
		return "", errors.New("service: the airlock and envd binaries must be absolute paths")
	}
	for _, p := range []string{o.Binary, o.Envd} {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("service: %w", err)
		}
	}
	if o.APIKey != "" {
		if err := writeFile(EnvFile(o.Root), []byte("AIRLOCK_API_KEY="+o.APIKey+"\n"), 0o600); err != nil {
			return "", fmt.Errorf("service: environment file: %w", err)
		}
	}
	if err := writeFile(UnitPath(o.Root), []byte(Unit(o)), 0o644); err != nil {
		return "", fmt.Errorf("service: unit: %w", err)
	}
	var did []string
	did = append(did, "wrote "+UnitPath(o.Root))
	if o.live() {
		if err := systemctl(o.Root, "daemon-reload"); err != nil {
			return "", err
		}
	}
	if err := systemctl(o.Root, "enable", Name); err != nil {
		return "", err
	}
	did = append(did, "enabled it (it starts at boot)")
	switch {
	case o.NoStart:
	case o.live():
		if err := systemctl(o.Root, "restart", Name); err != nil {
			return "", err
		}
		did = append(did, "started it (journalctl -u airlock -f shows its log)")
	case rootOf(o.Root) != "/":
		did = append(did, "it starts at the next boot of the system under "+o.Root)
	default:
		did = append(did, "systemd does not run this machine now, so it was not started")
	}
	return strings.Join(did, "; "), nil
}

// Uninstall stops and disables the service and removes its unit and
// environment file. The data dir, with its templates and any sandboxes
// still running, stays.
func Uninstall(o Options) (string, error) {
	if _, err := os.Stat(UnitPath(o.Root)); errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("service: %s is not installed (no %s)", Name, UnitPath(o.Root))
	}
	args := []string{"disable", Name}
	if o.live() {
		args = []string{"disable", "--now", Name}
	}
	if err := systemctl(o.Root, args...); err != nil {
		return "", err
	}
	for _, p := range []string{UnitPath(o.Root), EnvFile(o.Root)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("service: %w", err)
		}
	}
	if o.live() {
		if err := systemctl(o.Root, "daemon-reload"); err != nil {
			return "", err
		}
	}
	what := "disabled"
	if o.live() {
		what = "stopped and disabled"
	}
	return fmt.Sprintf("%s %s and removed %s; the data dir stays (sandboxes still running keep running until killed)", what, Name, UnitPath(o.Root)), nil
}
