package dockerfile

import (
	"encoding/json"
	"path"
	"strconv"
	"strings"

	"github.com/moby/buildkit/frontend/dockerfile/shell"
)

// Config is the image configuration a step runs with and a build ends with.
type Config struct {
	Env     []string // KEY=VALUE, in order, keys unique
	User    string   // user[:group] as written (expanded); "" = root
	Workdir string   // absolute; "/" when nothing set it
}

// StepKind says what a step does.
type StepKind int

const (
	// StepRun runs Args in a build sandbox.
	StepRun StepKind = iota + 1
	// StepCopy copies Sources from the build context to Dest (COPY, or ADD
	// with Add set: local tar archives are extracted).
	StepCopy
	// StepWorkdir creates Dest if missing, owned by the user in effect.
	StepWorkdir
)

func (k StepKind) String() string {
	switch k {
	case StepRun:
		return "run"
	case StepCopy:
		return "copy"
	case StepWorkdir:
		return "workdir"
	}
	return "step(" + strconv.Itoa(int(k)) + ")"
}

// Step is one layer-producing instruction with every variable expanded.
type Step struct {
	Line int
	Text string // the instruction as written (continuations joined), for display
	Kind StepKind

	// Args is RUN's argv: shell form is ["/bin/sh", "-c", script] (the
	// script unexpanded: the shell expands it with Config.Env); exec form
	// is the JSON array as given.
	Args []string

	// Sources are COPY/ADD sources (expanded; relative to the build
	// context, may be glob patterns). Dest is absolute and clean; it ends
	// in "/" exactly when the destination must be a directory (it was
	// written with a trailing "/" or as "."), except that "/" is "/".
	// For StepWorkdir, Dest is the directory (no trailing "/").
	Sources []string
	Dest    string
	Chown   string // --chown value (expanded), "" if not given
	Chmod   string // --chmod value: octal, e.g. "755"; "" if not given
	Add     bool   // ADD rather than COPY

	// Config is in effect for the step. For RUN, Env also holds the ARG
	// values in scope (visible to the command, not persisted).
	Config Config

	// CacheText is canonical text for the step's cache key: the kind, the
	// expanded arguments and the config in effect; never the line number,
	// comments or layout.
	CacheText string
}

// vars is an ordered variable set for expansion; it implements
// shell.EnvGetter.
type vars struct {
	keys []string
	m    map[string]string
}

func newVars() *vars { return &vars{m: map[string]string{}} }

func (v *vars) Get(k string) (string, bool) { s, ok := v.m[k]; return s, ok }
func (v *vars) Keys() []string              { return v.keys }

// set updates k in place (Docker keeps an overwritten ENV at its position).
func (v *vars) set(k, val string) {
	if _, ok := v.m[k]; !ok {
		v.keys = append(v.keys, k)
	}
	v.m[k] = val
}

func (v *vars) list() []string {
	out := make([]string, 0, len(v.keys))
	for _, k := range v.keys {
		out = append(out, k+"="+v.m[k])
	}
	return out
}

// metaArgs evaluates the ARGs before FROM: each default may use the ones
// before it; a build arg overrides the default.
func (f *File) metaArgs(buildArgs map[string]string) (*vars, error) {
	lex := shell.NewLex(f.escape)
	meta := newVars()
	for _, a := range f.MetaArgs {
		if v, ok := buildArgs[a.Name]; ok {
			meta.set(a.Name, v)
			continue
		}
		if !a.HasDefault {
			continue
		}
		v, _, err := lex.ProcessWord(a.Default, meta)
		if err != nil {
			return nil, errorf(a.Line, "ARG %s: %v", a.Name, err)
		}
		meta.set(a.Name, v)
	}
	return meta, nil
}

// FromRef returns the FROM reference with the ARGs before FROM expanded.
func (f *File) FromRef(buildArgs map[string]string) (ref string, line int, err error) {
	meta, err := f.metaArgs(buildArgs)
	if err != nil {
		return "", 0, err
	}
	ref, _, perr := shell.NewLex(f.escape).ProcessWord(f.From.Ref, meta)
	if perr != nil {
		return "", f.From.Line, errorf(f.From.Line, "FROM: %v", perr)
	}
	if strings.TrimSpace(ref) == "" {
		return "", f.From.Line, errorf(f.From.Line, "FROM %s expands to an empty name", f.From.Ref)
	}
	return ref, f.From.Line, nil
}

// Plan expands the instructions after FROM into steps. base is the parent's
// config (its Env is visible to expansion); buildArgs are --build-arg values.
// final is the config the built template ends with (ARG values excluded).
func (f *File) Plan(base Config, buildArgs map[string]string) (steps []Step, final Config, err error) {
	meta, err := f.metaArgs(buildArgs)
	if err != nil {
		return nil, Config{}, err
	}
	lex := shell.NewLex(f.escape)
	env := newVars()
	for _, kv := range base.Env {
		k, v, _ := strings.Cut(kv, "=")
		if k != "" {
			env.set(k, v)
		}
	}
	args := newVars() // ARGs declared after FROM
	user := base.User
	workdir := base.Workdir
	if workdir == "" {
		workdir = "/"
	}
	workdir = path.Clean("/" + workdir)

	// scope is what $VAR sees: ARGs, shadowed by ENV (Docker: "ENV always
	// overrides an ARG of the same name").
	scope := func() *vars {
		s := newVars()
		for _, k := range args.keys {
			s.set(k, args.m[k])
		}
		for _, k := range env.keys {
			s.set(k, env.m[k])
		}
		return s
	}
	expand := func(in Instruction, w string) (string, error) {
		out, _, err := lex.ProcessWord(w, scope())
		if err != nil {
			return "", errorf(in.Line, "%s: %v", strings.ToUpper(in.Cmd), err)
		}
		return out, nil
	}
	config := func(withArgs bool) Config {
		c := Config{Env: env.list(), User: user, Workdir: workdir}
		if withArgs {
			for _, k := range args.keys {
				if _, shadowed := env.m[k]; !shadowed {
					c.Env = append(c.Env, k+"="+args.m[k])
				}
			}
		}
		return c
	}

	for _, in := range f.Instructions {
		before := len(steps)
		switch in.Cmd {
		case "arg":
			for _, a := range in.ArgDecls {
				if v, ok := buildArgs[a.Name]; ok {
					args.set(a.Name, v)
					continue
				}
				if a.HasDefault {
					v, err := expand(in, a.Default)
					if err != nil {
						return nil, Config{}, err
					}
					args.set(a.Name, v)
					continue
				}
				// A re-declared meta ARG brings its value into the stage.
				if v, ok := meta.m[a.Name]; ok {
					args.set(a.Name, v)
				}
			}
		case "env":
			// All values of one ENV see the variables as they were before
			// it (Docker: `ENV a=1 b=$a` gives b the old a).
			var kvs []string
			for i := 0; i+1 < len(in.Args); i += 2 {
				v, err := expand(in, in.Args[i+1])
				if err != nil {
					return nil, Config{}, err
				}
				kvs = append(kvs, in.Args[i], v)
			}
			for i := 0; i+1 < len(kvs); i += 2 {
				env.set(kvs[i], kvs[i+1])
			}
		case "user":
			u, err := expand(in, in.Args[0])
			if err != nil {
				return nil, Config{}, err
			}
			if u == "" || strings.HasPrefix(u, ":") || strings.HasSuffix(u, ":") || strings.Count(u, ":") > 1 {
				return nil, Config{}, errorf(in.Line, "USER %q is not user or user:group", u)
			}
			user = u
		case "workdir":
			d, err := expand(in, in.Args[0])
			if err != nil {
				return nil, Config{}, err
			}
			if d == "" {
				return nil, Config{}, errorf(in.Line, "WORKDIR expands to an empty path")
			}
			workdir = path.Join(workdir, d)
			if path.IsAbs(d) {
				workdir = path.Clean(d)
			}
			steps = append(steps, Step{Kind: StepWorkdir, Dest: workdir, Config: config(false)})
		case "run":
			argv := in.Args
			if !in.JSON {
				argv = []string{"/bin/sh", "-c", in.Args[0]}
			}
			steps = append(steps, Step{Kind: StepRun, Args: argv, Config: config(true)})
		case "copy", "add":
			st, err := copyStep(in, expand, workdir)
			if err != nil {
				return nil, Config{}, err
			}
			st.Config = config(false)
			steps = append(steps, st)
		default:
			// Parse admits nothing else.
			return nil, Config{}, errorf(in.Line, "internal error: unplanned instruction %s", in.Cmd)
		}
		if len(steps) > before {
			st := &steps[len(steps)-1]
			st.Line, st.Text = in.Line, in.Text
			st.CacheText = st.cacheText()
		}
	}
	return steps, config(false), nil
}

func copyStep(in Instruction, expand func(Instruction, string) (string, error), workdir string) (Step, error) {
	instr := strings.ToUpper(in.Cmd)
	st := Step{Kind: StepCopy, Add: in.Cmd == "add"}
	n := len(in.Args)
	for _, s := range in.Args[:n-1] {
		v, err := expand(in, s)
		if err != nil {
			return Step{}, err
		}
		if v == "" {
			return Step{}, errorf(in.Line, "%s source %q expands to an empty path", instr, s)
		}
		if st.Add && isURL(v) {
			return Step{}, errorf(in.Line, "ADD from a URL (%s) is not supported; use RUN curl ... or RUN git clone ...", v)
		}
		st.Sources = append(st.Sources, v)
	}
	dest, err := expand(in, in.Args[n-1])
	if err != nil {
		return Step{}, err
	}
	if dest == "" {
		return Step{}, errorf(in.Line, "%s destination expands to an empty path", instr)
	}
	// As BuildKit: a trailing "/" or a bare "." means "a directory".
	dir := strings.HasSuffix(dest, "/") || dest == "."
	if path.IsAbs(dest) {
		st.Dest = path.Clean(dest)
	} else {
		st.Dest = path.Join(workdir, dest)
	}
	if dir && st.Dest != "/" {
		st.Dest += "/"
	}
	if len(st.Sources) > 1 && !strings.HasSuffix(st.Dest, "/") {
		return Step{}, errorf(in.Line, "%s with more than one source needs a directory destination ending in /", instr)
	}
	if v, ok := in.Flags["chown"]; ok {
		if st.Chown, err = expand(in, v); err != nil {
			return Step{}, err
		}
		if st.Chown == "" || strings.HasPrefix(st.Chown, ":") || strings.HasSuffix(st.Chown, ":") || strings.Count(st.Chown, ":") > 1 {
			return Step{}, errorf(in.Line, "%s --chown=%q is not user, user:group, uid or uid:gid", instr, st.Chown)
		}
	}
	if v, ok := in.Flags["chmod"]; ok {
		if st.Chmod, err = expand(in, v); err != nil {
			return Step{}, err
		}
		if m, err := strconv.ParseUint(st.Chmod, 8, 32); err != nil || m > 0o7777 {
			return Step{}, errorf(in.Line, "%s --chmod=%q is not an octal mode (e.g. 755)", instr, st.Chmod)
		}
	}
	return st, nil
}

// cacheText is the canonical form of a step: JSON of a fixed struct (field
// order fixed, no maps), versioned so a change of format misses the cache.
func (s *Step) cacheText() string {
	b, err := json.Marshal(struct {
		V       int      `json:"v"`
		Kind    string   `json:"kind"`
		Args    []string `json:"args,omitempty"`
		Sources []string `json:"sources,omitempty"`
		Dest    string   `json:"dest,omitempty"`
		Chown   string   `json:"chown,omitempty"`
		Chmod   string   `json:"chmod,omitempty"`
		Add     bool     `json:"add,omitempty"`
		Env     []string `json:"env"`
		User    string   `json:"user"`
		Workdir string   `json:"workdir"`
	}{1, s.Kind.String(), s.Args, s.Sources, s.Dest, s.Chown, s.Chmod, s.Add, s.Config.Env, s.Config.User, s.Config.Workdir})
	if err != nil {
		// Marshalling strings and slices of strings cannot fail.
		panic(err)
	}
	return string(b)
}
