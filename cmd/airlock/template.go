package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/daemon"
	"github.com/airlock-sandbox/airlock/internal/layout"
	"github.com/airlock-sandbox/airlock/internal/ociimage"
	"github.com/airlock-sandbox/airlock/internal/template"
)

func templateCmd() *cobra.Command {
	var dataDir string
	cmd := &cobra.Command{Use: "template", Short: "Build, list, inspect and remove sandbox templates"}
	cmd.PersistentFlags().StringVar(&dataDir, "data-dir", layout.DefaultRoot, "directory for templates, sandboxes and state")
	// Only builds pull images; build's PreRunE fills mirrors.
	var mirrorFlags []string
	var mirrors []ociimage.Mirror
	open := func() (*template.Store, error) {
		envd, _ := findEnvd() // only RUN steps need it; the build says so if it is missing
		return template.Open(template.Options{DataDir: dataDir, EnvdPath: envd, RegistryMirrors: mirrors})
	}
	build := templateBuildCmd(open)
	addRegistryMirrorFlag(build, &mirrorFlags)
	build.PreRunE = func(*cobra.Command, []string) (err error) {
		mirrors, err = registryMirrors(mirrorFlags)
		return err
	}
	cmd.AddCommand(build, templateListCmd(open), templateInspectCmd(open), templateRmCmd(open, &dataDir))
	return cmd
}

func templateBuildCmd(open func() (*template.Store, error)) *cobra.Command {
	var (
		file, name, config string
		buildArgs          []string
		replace            bool
		set                template.Settings
	)
	c := &cobra.Command{
		Use:   "build [CONTEXT_DIR | BUILTIN]",
		Short: "Build a template from a Dockerfile (or a built-in by name)",
		Long: `Build a template from a Dockerfile (FROM, RUN, COPY, ADD, ENV, ARG, WORKDIR, USER).

CONTEXT_DIR (default ".") is what COPY and ADD read from; the Dockerfile is
CONTEXT_DIR/Dockerfile unless -f names another. Settings come from airlock.toml
beside the Dockerfile (or --config), then from the flags:

  template_name = "my-app"          cpu_count = 2        memory_mb = 1024
  disk_mb = 2048                    start_cmd = "..."    ready_cmd = "..."
  ready_timeout = 60                user = "user"        workdir = "/home/user"
  aliases = ["app"]                 description = "..."  runtime = "gvisor"
  [build_args]
  VERSION = "1.2"

FROM takes debian:bookworm or debian:bookworm-slim (built with debootstrap),
another template by name, or an OCI image: a registry reference
(registry.example.com/app:1, or a Docker Hub name with a tag: ubuntu:22.04),
oci:<layout dir>[:tag] or docker-archive:<file>. --registry-mirror sends the
pulls of a registry to a mirror (docker.io=http://10.0.0.5:5000 pulls
ubuntu:22.04 as library/ubuntu:22.04 from 10.0.0.5:5000).

Every step is cached by content: an unchanged rebuild takes seconds, a change
rebuilds from the first changed step. With a built-in's name and no Dockerfile
(airlock template build python3) it builds that built-in.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			s, err := open()
			if err != nil {
				return err
			}
			arg := "."
			if len(args) == 1 {
				arg = args[0]
			}
			builtin := ""
			if file == "" {
				switch {
				case len(args) == 1 && s.IsBuiltin(arg) && !isDir(arg):
					builtin = arg
				case len(args) == 0 && name != "" && s.IsBuiltin(name):
					builtin = name
				}
			}
			start := time.Now()
			var t template.Template
			if builtin != "" {
				t, err = s.BuildBuiltin(ctx, builtin, os.Stderr)
			} else {
				t, err = buildFromDockerfile(ctx, s, arg, file, config, name, buildArgs, replace, set)
			}
			if err != nil {
				return err
			}
			fmt.Printf("template %s ready in %s: %s, %d layers, rootfs %s\n", t.Name, time.Since(start).Round(100*time.Millisecond), formatMB(t.SizeBytes), len(t.Layers), t.RootFS)
			return nil
		},
	}
	f := c.Flags()
	f.StringVarP(&file, "file", "f", "", "the Dockerfile (default CONTEXT_DIR/Dockerfile)")
	f.StringVar(&name, "name", "", "template name (default template_name in airlock.toml, else the context directory's name)")
	f.StringVar(&config, "config", "", "settings file (default airlock.toml beside the Dockerfile)")
	f.StringArrayVar(&buildArgs, "build-arg", nil, "ARG value, KEY=VALUE (repeatable)")
	f.BoolVar(&replace, "replace", false, "replace a template of that name built from another Dockerfile")
	f.IntVar(&set.CPUCount, "cpu-count", 0, "CPUs of each sandbox (default 2)")
	f.IntVar(&set.MemoryMB, "memory-mb", 0, "memory limit of each sandbox in MB (default 512)")
	f.IntVar(&set.DiskSizeMB, "disk-mb", 0, "disk quota of each sandbox in MB (default 1024)")
	f.StringVar(&set.StartCmd, "start-cmd", "", "command started in the background when a sandbox is created")
	f.StringVar(&set.ReadyCmd, "ready-cmd", "", "create returns once this command exits 0")
	f.IntVar(&set.ReadyTimeoutSec, "ready-timeout", 0, "seconds to wait for the ready command (default 60)")
	f.StringVar(&set.DefaultUser, "user", "", "default user of commands (default: the last USER, else 'user' if the image has one, else root)")
	f.StringVar(&set.DefaultWorkdir, "workdir", "", "default working directory (default: the last WORKDIR, else the user's home)")
	f.StringVar(&set.Runtime, "runtime", "", "isolation backend of its sandboxes: linux or gvisor (default: the server's)")
	return c
}

func buildFromDockerfile(ctx context.Context, s *template.Store, contextDir, file, config, name string, buildArgs []string, replace bool, flags template.Settings) (template.Template, error) {
	contextDir, err := filepath.Abs(contextDir)
	if err != nil {
		return template.Template{}, err
	}
	if !isDir(contextDir) {
		return template.Template{}, fmt.Errorf("build context %s is not a directory (to build a built-in, name one of its templates: base, python3, node, code-interpreter-v1, mcp-gateway)", contextDir)
	}
	if file == "" {
		file = filepath.Join(contextDir, "Dockerfile")
	}
	file, err = filepath.Abs(file)
	if err != nil {
		return template.Template{}, err
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return template.Template{}, fmt.Errorf("read the Dockerfile: %w", err)
	}
	if config == "" {
		config = filepath.Join(filepath.Dir(file), template.SettingsFile)
	}
	settings, err := template.LoadSettings(config)
	if err != nil {
		return template.Template{}, err
	}
	if settings.Dockerfile != "" && !isFlagSet(file, contextDir) {
		// The settings file names the Dockerfile, relative to itself.
		file = filepath.Join(filepath.Dir(config), settings.Dockerfile)
		if data, err = os.ReadFile(file); err != nil {
			return template.Template{}, fmt.Errorf("read the Dockerfile named in %s: %w", config, err)
		}
	}
	args := map[string]string{}
	for _, a := range buildArgs {
		k, v, ok := strings.Cut(a, "=")
		if !ok {
			// Docker takes a bare KEY from the environment.
			v, ok = os.LookupEnv(k)
			if !ok {
				return template.Template{}, fmt.Errorf("--build-arg %q: want KEY=VALUE", a)
			}
		}
		args[k] = v
	}
	flags.BuildArgs = args
	settings = settings.Merge(flags)
	if name == "" {
		name = settings.Name
	}
	if name == "" {
		name = strings.ToLower(filepath.Base(contextDir))
		if template.ValidName(name) != nil {
			return template.Template{}, fmt.Errorf("name the template: --name NAME or template_name in %s (the context directory's name %q is not a valid template name)", template.SettingsFile, filepath.Base(contextDir))
		}
	}
	return s.Build(ctx, template.BuildRequest{
		Name: name, Dockerfile: data, DockerfilePath: file, ContextDir: contextDir,
		Settings: settings, Replace: replace,
	}, os.Stderr)
}

// isFlagSet reports whether the Dockerfile was named explicitly rather than found
// at its default place in the context.
func isFlagSet(file, contextDir string) bool {
	return file != filepath.Join(contextDir, "Dockerfile")
}

func templateListCmd(open func() (*template.Store, error)) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List templates with their size and the layer cache's disk use",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := open()
			if err != nil {
				return err
			}
			ts, err := s.List()
			if err != nil {
				return err
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "NAME\tALIASES\tKIND\tREADY\tSIZE\tLAYERS\tCPU\tMEMORY\tBUILT")
			for _, t := range ts {
				kind, built, size := "user", "-", "-"
				if t.Builtin {
					kind = "built-in"
				}
				if t.Ready {
					built = t.BuiltAt.Local().Format("2006-01-02 15:04")
					size = formatMB(t.SizeBytes)
				}
				aliases := strings.Join(t.Aliases, ",")
				if aliases == "" {
					aliases = "-"
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%v\t%s\t%d\t%d\t%d MB\t%s\n", t.Name, aliases, kind, t.Ready, size, len(t.Layers), t.Settings.CPUCount, t.Settings.MemoryMB, built)
			}
			if err := w.Flush(); err != nil {
				return err
			}
			total, err := s.DiskUsage()
			if err != nil {
				return err
			}
			fmt.Printf("\nlayers on disk: %s (files shared between layers and templates counted once)\n", formatMB(total))
			return nil
		},
	}
}

func templateInspectCmd(open func() (*template.Store, error)) *cobra.Command {
	return &cobra.Command{
		Use:   "inspect NAME",
		Short: "Show a template's settings, image config, layers and source as JSON",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := open()
			if err != nil {
				return err
			}
			t, err := s.Get(args[0])
			if err != nil {
				return err
			}
			out := map[string]any{
				"name": t.Name, "aliases": t.Aliases, "description": t.Description, "builtin": t.Builtin,
				"rootfs": t.RootFS, "sizeBytes": t.SizeBytes, "layers": t.Layers, "config": t.Config,
				"settings": t.Settings, "source": t.Source, "createdAt": t.CreatedAt, "builtAt": t.BuiltAt,
				"buildSeconds": t.BuildSeconds, "buildLog": t.BuildLog,
			}
			enc := json.NewEncoder(os.Stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(out)
		},
	}
}

func templateRmCmd(open func() (*template.Store, error), dataDir *string) *cobra.Command {
	return &cobra.Command{
		Use:   "rm NAME...",
		Short: "Remove templates (refused while a sandbox uses one) and the layers only they used",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := open()
			if err != nil {
				return err
			}
			inUse := func(t template.Template) (int, error) {
				return daemon.RecordedSandboxes(cmd.Context(), layout.DataDir{Root: *dataDir}, t)
			}
			var errs []error
			for _, n := range args {
				if err := s.Remove(cmd.Context(), n, inUse); err != nil {
					errs = append(errs, err)
					continue
				}
				fmt.Printf("removed template %s\n", n)
			}
			return errors.Join(errs...)
		},
	}
}

func isDir(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}

func formatMB(n int64) string { return fmt.Sprintf("%d MB", (n+500_000)/1_000_000) }
