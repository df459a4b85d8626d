package template

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// SettingsFile is the name of the settings file beside a Dockerfile, Airlock's
// counterpart of E2B's e2b.toml.
const SettingsFile = "airlock.toml"

// Settings are what a template's sandboxes get by default, and how it is named.
// They are not part of any layer key: changing a default re-points the template
// to the same layers instead of rebuilding them.
type Settings struct {
	// Name is the template's name (also its id); BuildRequest.Name overrides it.
	Name string `toml:"template_name" json:"-"`
	// Dockerfile is the Dockerfile's path relative to the settings file.
	Dockerfile  string   `toml:"dockerfile" json:"-"`
	Description string   `toml:"description" json:"description,omitempty"`
	Aliases     []string `toml:"aliases" json:"aliases,omitempty"`
	CPUCount    int      `toml:"cpu_count" json:"cpuCount"`
	MemoryMB    int      `toml:"memory_mb" json:"memoryMB"`
	DiskSizeMB  int      `toml:"disk_mb" json:"diskSizeMB"`
	// StartCmd runs in the background when a sandbox starts; create returns once
	// ReadyCmd exits 0 (or, without one, once StartCmd runs).
	StartCmd string `toml:"start_cmd" json:"startCmd,omitempty"`
	ReadyCmd string `toml:"ready_cmd" json:"readyCmd,omitempty"`
	// ReadyTimeoutSec bounds the wait for ReadyCmd; 0 means DefaultReadyTimeout.
	ReadyTimeoutSec int `toml:"ready_timeout" json:"readyTimeoutSec,omitempty"`
	// DefaultUser runs commands when a client names none; empty means the
	// Dockerfile's last USER, else "user" when the image has one, else root.
	DefaultUser string `toml:"user" json:"defaultUser"`
	// DefaultWorkdir empty means the Dockerfile's last WORKDIR, else the
	// default user's home directory.
	DefaultWorkdir string `toml:"workdir" json:"defaultWorkdir"`
	// Runtime is the isolation backend ("linux", "gvisor"); empty means the
	// server's default (serve --runtime).
	Runtime string `toml:"runtime" json:"runtime,omitempty"`
	// Kernels are the code-interpreter languages whose default contexts start
	// with every sandbox (python, javascript, typescript, bash, r, java), so a first
	// runCode does not wait for a kernel to start.
	Kernels []string `toml:"kernels" json:"kernels,omitempty"`
	// BuildArgs are ARG values, overridden by --build-arg.
	BuildArgs map[string]string `toml:"build_args" json:"-"`
}

// Defaults for settings a template leaves unset.
const (
	DefaultCPUCount     = 2
	DefaultMemoryMB     = 512
	DefaultDiskSizeMB   = 1024
	DefaultReadyTimeout = 60 * time.Second
)

var (
	validName    = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)
	validRuntime = regexp.MustCompile(`^[a-z0-9]+$`)
	validArg     = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// kernelLanguages are the languages the code interpreter knows.
var kernelLanguages = map[string]bool{"python": true, "javascript": true, "typescript": true, "bash": true, "r": true, "java": true}

// ValidName checks a template name or alias.
func ValidName(name string) error {
	if !validName.MatchString(name) {
		return fmt.Errorf("%w: template name %q: use 1-63 lower-case letters, digits, '.', '_' or '-', starting with a letter or digit", ErrInvalid, name)
	}
	return nil
}

// ParseSettings decodes an airlock.toml. Unknown keys are errors: a misspelt
// "memory_mb" must not silently build a template with the default memory.
func ParseSettings(data []byte) (Settings, error) {
	var s Settings
	md, err := toml.NewDecoder(bytes.NewReader(data)).Decode(&s)
	if err != nil {
		return Settings{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = k.String()
		}
		sort.Strings(keys)
		return Settings{}, fmt.Errorf("%w: unknown keys %s (known: template_name, dockerfile, description, aliases, cpu_count, memory_mb, disk_mb, start_cmd, ready_cmd, ready_timeout, user, workdir, runtime, kernels, [build_args])",
			ErrInvalid, strings.Join(keys, ", "))
	}
	return s, s.validate()
}

// LoadSettings reads the settings file at path; a missing file is no error.
func LoadSettings(path string) (Settings, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return Settings{}, nil
	}
	if err != nil {
		return Settings{}, fmt.Errorf("read %s: %w", path, err)
	}
	s, err := ParseSettings(data)
	if err != nil {
		return Settings{}, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// Merge returns s with every field set in o replacing s's (flags over the file).
func (s Settings) Merge(o Settings) Settings {
	str := func(dst *string, v string) {
		if v != "" {
			*dst = v
		}
	}
	num := func(dst *int, v int) {
		if v != 0 {
			*dst = v
		}
	}
	str(&s.Name, o.Name)
	str(&s.Dockerfile, o.Dockerfile)
	str(&s.Description, o.Description)
	if o.Aliases != nil {
		s.Aliases = o.Aliases
	}
	num(&s.CPUCount, o.CPUCount)
	num(&s.MemoryMB, o.MemoryMB)
	num(&s.DiskSizeMB, o.DiskSizeMB)
	str(&s.StartCmd, o.StartCmd)
	str(&s.ReadyCmd, o.ReadyCmd)
	num(&s.ReadyTimeoutSec, o.ReadyTimeoutSec)
	str(&s.DefaultUser, o.DefaultUser)
	str(&s.DefaultWorkdir, o.DefaultWorkdir)
	str(&s.Runtime, o.Runtime)
	if o.Kernels != nil {
		s.Kernels = o.Kernels
	}
	if len(o.BuildArgs) > 0 {
		args := map[string]string{}
		for k, v := range s.BuildArgs {
			args[k] = v
		}
		for k, v := range o.BuildArgs {
			args[k] = v
		}
		s.BuildArgs = args
	}
	return s
}

func (s Settings) validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, a...))
	}
	if s.Name != "" {
		if err := ValidName(s.Name); err != nil {
			return err
		}
	}
	for _, a := range s.Aliases {
		if err := ValidName(a); err != nil {
			return err
		}
	}
	if s.CPUCount < 0 || s.CPUCount > 64 {
		return bad("cpu_count %d: want 1 to 64", s.CPUCount)
	}
	if s.MemoryMB < 0 || (s.MemoryMB > 0 && s.MemoryMB < 64) || s.MemoryMB > 1<<20 {
		return bad("memory_mb %d: want 64 to 1048576", s.MemoryMB)
	}
	if s.DiskSizeMB < 0 || (s.DiskSizeMB > 0 && s.DiskSizeMB < 64) || s.DiskSizeMB > 1<<20 {
		return bad("disk_mb %d: want 64 to 1048576", s.DiskSizeMB)
	}
	if s.ReadyTimeoutSec < 0 || s.ReadyTimeoutSec > 3600 {
		return bad("ready_timeout %d: want 1 to 3600 seconds", s.ReadyTimeoutSec)
	}
	if s.ReadyCmd != "" && s.StartCmd == "" {
		return bad("ready_cmd needs a start_cmd")
	}
	if s.Runtime != "" && !validRuntime.MatchString(s.Runtime) {
		return bad("runtime %q: want a backend name such as linux or gvisor", s.Runtime)
	}
	if s.DefaultWorkdir != "" && !strings.HasPrefix(s.DefaultWorkdir, "/") {
		return bad("workdir %q must be an absolute path", s.DefaultWorkdir)
	}
	for _, k := range s.Kernels {
		if !kernelLanguages[k] {
			return bad("kernels: unknown language %q (known: python, javascript, typescript, bash, r, java)", k)
		}
	}
	for k := range s.BuildArgs {
		if !validArg.MatchString(k) {
			return bad("build arg name %q", k)
		}
	}
	return nil
}

// withDefaults fills what is still unset once the build knows the image.
func (s Settings) withDefaults() Settings {
	if s.CPUCount == 0 {
		s.CPUCount = DefaultCPUCount
	}
	if s.MemoryMB == 0 {
		s.MemoryMB = DefaultMemoryMB
	}
	if s.DiskSizeMB == 0 {
		s.DiskSizeMB = DefaultDiskSizeMB
	}
	return s
}

// ReadyTimeout is the deadline for the ready command.
func (s Settings) ReadyTimeout() time.Duration {
	if s.ReadyTimeoutSec > 0 {
		return time.Duration(s.ReadyTimeoutSec) * time.Second
	}
	return DefaultReadyTimeout
}
