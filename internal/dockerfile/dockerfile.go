// Package dockerfile parses the subset of the Dockerfile language that Airlock
// templates are built from (FROM, RUN, COPY, ADD, ENV, ARG, WORKDIR, USER) and
// plans it into steps with every variable expanded.
//
// Syntax (line continuations, comments, parser directives, JSON forms,
// heredocs) is BuildKit's own parser, and $VAR expansion is BuildKit's shell
// lexer, so a Dockerfile means here what it means to `docker build`. This
// package adds the subset check, Docker's ARG/ENV scoping rules, and the
// canonical cache text of each step.
package dockerfile

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/moby/buildkit/frontend/dockerfile/parser"
)

// Error is a problem in a Dockerfile, located at a line (1-based; 0 when the
// problem is the file as a whole, e.g. it has no instructions).
type Error struct {
	Line int
	Msg  string
}

func (e *Error) Error() string {
	if e.Line <= 0 {
		return "Dockerfile: " + e.Msg
	}
	return fmt.Sprintf("Dockerfile line %d: %s", e.Line, e.Msg)
}

func errorf(line int, format string, args ...any) *Error {
	return &Error{Line: line, Msg: fmt.Sprintf(format, args...)}
}

// Supported lists the instructions Airlock accepts, for error messages.
const Supported = "FROM, RUN, COPY, ADD, ENV, ARG, WORKDIR, USER"

// maxSize bounds what Parse reads: a Dockerfile is a short text file, and a
// bound keeps a hostile upload from costing memory.
const maxSize = 1 << 20

// File is a parsed Dockerfile that passed the subset check.
type File struct {
	// MetaArgs are the ARG instructions before FROM: usable in FROM only,
	// unless re-declared after it (as in Docker).
	MetaArgs []Arg
	From     From
	// Instructions are those after FROM, in order.
	Instructions []Instruction

	escape rune // the escape character (the `# escape=` directive)
}

// Arg is one name of an ARG instruction.
type Arg struct {
	Line       int
	Name       string
	Default    string // unexpanded
	HasDefault bool
}

// From is the FROM instruction.
type From struct {
	Line int
	Ref  string // as written, before ARG expansion
	Name string // the stage name after AS, if any (unused: there is one stage)
}

// Instruction is one instruction after FROM, checked but not yet expanded.
type Instruction struct {
	Line int    // first line
	Cmd  string // lower case: run, copy, add, env, arg, workdir, user
	Text string // as written, continuation lines joined

	// Args are the arguments: RUN shell form: one element, the script; RUN
	// exec form and COPY/ADD: the words (COPY/ADD: sources then dest); ENV:
	// key, value pairs; WORKDIR/USER: one element.
	Args []string
	JSON bool // exec (JSON array) form
	// Flags are the --name=value flags (COPY/ADD: chown, chmod).
	Flags map[string]string
	// ArgDecls are the names an ARG instruction declares.
	ArgDecls []Arg
}

// Parse reads a Dockerfile and checks it against Airlock's subset. Errors are
// *Error with the line of the offending instruction.
func Parse(r io.Reader) (*File, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxSize+1))
	if err != nil {
		return nil, fmt.Errorf("reading Dockerfile: %w", err)
	}
	if len(data) > maxSize {
		return nil, errorf(0, "larger than %d bytes", maxSize)
	}
	res, err := parser.Parse(strings.NewReader(string(data)))
	if err != nil {
		return nil, parserError(err)
	}
	f := &File{escape: res.EscapeToken}
	seenFrom := false
	for _, n := range res.AST.Children {
		cmd := strings.ToLower(n.Value)
		line := n.StartLine
		if cmd == "from" {
			if seenFrom {
				return nil, errorf(line, "multi-stage builds are not supported (a second FROM)")
			}
			seenFrom = true
			if f.From, err = parseFrom(n); err != nil {
				return nil, err
			}
			continue
		}
		if !seenFrom {
			if cmd == "arg" {
				decls, err := parseArg(n)
				if err != nil {
					return nil, err
				}
				f.MetaArgs = append(f.MetaArgs, decls...)
				continue
			}
			if _, known := handlers[cmd]; known {
				return nil, errorf(line, "%s before FROM: only ARG may come before FROM", strings.ToUpper(cmd))
			}
		}
		h, ok := handlers[cmd]
		if !ok {
			return nil, unsupported(n.Value, line)
		}
		in, err := h(n)
		if err != nil {
			return nil, err
		}
		in.Line = line
		in.Cmd = cmd
		in.Text = n.Original
		f.Instructions = append(f.Instructions, in)
	}
	if !seenFrom {
		return nil, errorf(0, "no FROM instruction")
	}
	return f, nil
}

// parserError turns a BuildKit parser error into an *Error at its line.
func parserError(err error) error {
	line := 0
	var le *parser.LocationError
	if errors.As(err, &le) && len(le.Locations) > 0 && len(le.Locations[0]) > 0 {
		line = le.Locations[0][0].Start.Line
	}
	msg := err.Error()
	if le != nil {
		msg = le.Unwrap().Error()
	}
	if msg == "file with no instructions" {
		return errorf(0, "empty (no instructions)")
	}
	return &Error{Line: line, Msg: msg}
}

var hints = map[string]string{
	"cmd":         "; use start_cmd in airlock.toml",
	"entrypoint":  "; use start_cmd in airlock.toml",
	"healthcheck": "; use ready_cmd in airlock.toml",
	"expose":      "; sandbox ports are reachable without it",
	"shell":       "; RUN uses /bin/sh -c, or write RUN in exec (JSON) form",
}

func unsupported(name string, line int) error {
	cmd := strings.ToLower(name)
	if _, known := knownDocker[cmd]; known {
		return errorf(line, "%s is not supported (supported: %s)%s", strings.ToUpper(cmd), Supported, hints[cmd])
	}
	return errorf(line, "unknown instruction %q (supported: %s)", name, Supported)
}

var knownDocker = map[string]struct{}{
	"cmd": {}, "entrypoint": {}, "expose": {}, "healthcheck": {}, "label": {},
	"maintainer": {}, "onbuild": {}, "shell": {}, "stopsignal": {}, "volume": {},
}

var handlers = map[string]func(*parser.Node) (Instruction, error){
	"run":     parseRun,
	"copy":    func(n *parser.Node) (Instruction, error) { return parseCopy(n, false) },
	"add":     func(n *parser.Node) (Instruction, error) { return parseCopy(n, true) },
	"env":     parseEnv,
	"arg":     parseArgInstruction,
	"workdir": func(n *parser.Node) (Instruction, error) { return parseSingle(n, "WORKDIR", "a directory") },
	"user":    func(n *parser.Node) (Instruction, error) { return parseSingle(n, "USER", "a user[:group]") },
}

func words(n *parser.Node) []string {
	var out []string
	for w := n.Next; w != nil; w = w.Next {
		out = append(out, w.Value)
	}
	return out
}

// flags splits --name=value flags, refusing any name not in allowed.
func flags(n *parser.Node, instr string, allowed ...string) (map[string]string, error) {
	out := map[string]string{}
	for _, fl := range n.Flags {
		name, value, hasValue := strings.Cut(strings.TrimPrefix(fl, "--"), "=")
		ok := false
		for _, a := range allowed {
			ok = ok || a == name
		}
		if !ok {
			if instr == "COPY" && name == "from" {
				return nil, errorf(n.StartLine, "COPY --from is not supported (there is one build stage and no other image to copy from)")
			}
			if len(allowed) == 0 {
				return nil, errorf(n.StartLine, "%s does not support the flag --%s", instr, name)
			}
			return nil, errorf(n.StartLine, "%s does not support the flag --%s (supported: --%s)", instr, name, strings.Join(allowed, ", --"))
		}
		if !hasValue || value == "" {
			return nil, errorf(n.StartLine, "%s --%s needs a value (--%s=...)", instr, name, name)
		}
		if _, dup := out[name]; dup {
			return nil, errorf(n.StartLine, "%s --%s given twice", instr, name)
		}
		out[name] = value
	}
	return out, nil
}

func parseFrom(n *parser.Node) (From, error) {
	if _, err := flags(n, "FROM"); err != nil {
		return From{}, err
	}
	w := words(n)
	switch {
	case len(w) == 1:
		return From{Line: n.StartLine, Ref: w[0]}, nil
	case len(w) == 3 && strings.EqualFold(w[1], "as"):
		return From{Line: n.StartLine, Ref: w[0], Name: w[2]}, nil
	case len(w) == 0:
		return From{}, errorf(n.StartLine, "FROM needs an image or template name")
	default:
		return From{}, errorf(n.StartLine, "FROM takes one image or template name (optionally followed by AS name)")
	}
}

func parseRun(n *parser.Node) (Instruction, error) {
	if _, err := flags(n, "RUN"); err != nil {
		return Instruction{}, err
	}
	in := Instruction{Args: words(n), JSON: n.Attributes["json"]}
	if len(in.Args) == 0 || (!in.JSON && strings.TrimSpace(in.Args[0]) == "") {
		return Instruction{}, errorf(n.StartLine, "RUN needs a command")
	}
	if len(n.Heredocs) > 0 {
		script, err := runHeredoc(n, in.Args[0])
		if err != nil {
			return Instruction{}, err
		}
		in.Args = []string{script}
	}
	return in, nil
}

// runHeredoc turns `RUN <<EOF ... EOF` into the script /bin/sh -c runs, as
// BuildKit does: a lone heredoc is the script itself; a command with
// heredocs is reassembled into one shell script so sh handles the heredocs.
func runHeredoc(n *parser.Node, cmdline string) (string, error) {
	docs := n.Heredocs
	if h, _ := parser.ParseHeredoc(cmdline); h != nil && len(docs) == 1 {
		data := docs[0].Content
		if docs[0].Chomp {
			data = parser.ChompHeredocContent(data)
		}
		if strings.HasPrefix(data, "#!") {
			// BuildKit runs such a heredoc as an executable file it mounts;
			// sh -c would ignore the interpreter line and run it as shell.
			return "", errorf(n.StartLine, "a RUN heredoc with a #! interpreter line is not supported; write the script with COPY and RUN it, or pipe it: RUN python3 <<EOF")
		}
		return data, nil
	}
	full := cmdline
	for _, d := range docs {
		full += "\n" + d.Content + d.Name
	}
	return full, nil
}

func parseCopy(n *parser.Node, add bool) (Instruction, error) {
	instr := "COPY"
	if add {
		instr = "ADD"
	}
	fl, err := flags(n, instr, "chown", "chmod")
	if err != nil {
		return Instruction{}, err
	}
	if len(n.Heredocs) > 0 {
		return Instruction{}, errorf(n.StartLine, "heredocs in %s are not supported; put the file in the build context", instr)
	}
	in := Instruction{Args: words(n), JSON: n.Attributes["json"], Flags: fl}
	if len(in.Args) < 2 {
		return Instruction{}, errorf(n.StartLine, "%s needs at least one source and a destination", instr)
	}
	if add {
		for _, src := range in.Args[:len(in.Args)-1] {
			if isURL(src) {
				return Instruction{}, errorf(n.StartLine, "ADD from a URL (%s) is not supported; use RUN curl ... or RUN git clone ...", src)
			}
		}
	}
	return in, nil
}

// isURL reports a remote ADD source (http(s) URL or git reference), which
// Docker downloads and Airlock does not.
func isURL(s string) bool {
	l := strings.ToLower(s)
	for _, p := range []string{"http://", "https://", "git://", "git@", "ssh://"} {
		if strings.HasPrefix(l, p) {
			return true
		}
	}
	return false
}

func parseEnv(n *parser.Node) (Instruction, error) {
	if _, err := flags(n, "ENV"); err != nil {
		return Instruction{}, err
	}
	var args []string
	// The parser yields triples: key, value, separator ("=" or "" for the
	// legacy `ENV key value` form).
	for k := n.Next; k != nil; {
		v := k.Next
		if v == nil {
			return Instruction{}, errorf(n.StartLine, "ENV needs a value for %s", k.Value)
		}
		if k.Value == "" {
			return Instruction{}, errorf(n.StartLine, "ENV needs a variable name before =")
		}
		args = append(args, k.Value, v.Value)
		k = v.Next
		if k != nil { // skip the separator node
			k = k.Next
		}
	}
	if len(args) == 0 {
		return Instruction{}, errorf(n.StartLine, "ENV needs name=value")
	}
	return Instruction{Args: args}, nil
}

func parseArg(n *parser.Node) ([]Arg, error) {
	if _, err := flags(n, "ARG"); err != nil {
		return nil, err
	}
	var out []Arg
	for _, w := range words(n) {
		name, def, has := strings.Cut(w, "=")
		if name == "" {
			return nil, errorf(n.StartLine, "ARG needs a name before =")
		}
		out = append(out, Arg{Line: n.StartLine, Name: name, Default: def, HasDefault: has})
	}
	if len(out) == 0 {
		return nil, errorf(n.StartLine, "ARG needs a name")
	}
	return out, nil
}

func parseArgInstruction(n *parser.Node) (Instruction, error) {
	decls, err := parseArg(n)
	if err != nil {
		return Instruction{}, err
	}
	return Instruction{ArgDecls: decls}, nil
}

func parseSingle(n *parser.Node, instr, what string) (Instruction, error) {
	if _, err := flags(n, instr); err != nil {
		return Instruction{}, err
	}
	w := words(n)
	if len(w) == 0 || strings.TrimSpace(w[0]) == "" {
		return Instruction{}, errorf(n.StartLine, "%s needs %s", instr, what)
	}
	return Instruction{Args: []string{strings.TrimSpace(w[0])}}, nil
}
