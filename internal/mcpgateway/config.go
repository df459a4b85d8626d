package mcpgateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// fieldKind is the JSON type a config field must have.
type fieldKind int

const (
	kindString     fieldKind = iota // a string
	kindStringList                  // an array of strings
	kindStringMap                   // an object whose values are strings
)

func (k fieldKind) String() string {
	switch k {
	case kindString:
		return "a string"
	case kindStringList:
		return "an array of strings"
	default:
		return "an object of strings"
	}
}

// field is one key of a server's entry in the config.
type field struct {
	Name     string
	Kind     fieldKind
	Required bool // present and not empty ("" or [])
}

// values holds an entry's checked fields: string, []string or
// map[string]string by the field's kind.
type values map[string]any

func (v values) string(name string) string {
	s, _ := v[name].(string)
	return s
}

func (v values) strings(name string) []string {
	s, _ := v[name].([]string)
	return s
}

func (v values) stringMap(name string) map[string]string {
	m, _ := v[name].(map[string]string)
	return m
}

// serverSpec is one configured server, checked, with everything needed to
// prepare and run it.
type serverSpec struct {
	// Key is the server's key in the config.
	Key string
	// Prefix starts the names of the server's tools and prompts
	// (`<prefix>_<name>`).
	Prefix string
	// Catalog is the catalog entry; nil for a custom server.
	Catalog *catalogServer
	// Owner and Repo name a custom server's GitHub repository; Dir is its
	// clone (the working directory of installCmd and runCmd).
	Owner, Repo, Dir string
	InstallCmd       string
	// Argv and Env (added to the gateway's environment) start the server.
	Argv []string
	Env  []string
}

// custom reports whether the server is a GitHub repository rather than a
// catalog server.
func (s *serverSpec) custom() bool { return s.Catalog == nil }

// configError lists every problem found in a config, one per line, so that a
// user fixes them in one round (the SDK shows the command's stderr as is).
type configError struct{ problems []string }

func (e *configError) Error() string { return strings.Join(e.problems, "\n") }

// validOwner and validRepo apply GitHub's rules for names, tightened: an
// owner is 1-39 letters, digits and inner hyphens; a repository is 1-100
// letters, digits, '.', '-' and '_', and not "." or "..". Both become path
// components of the clone, so nothing else may pass. (Loops rather than
// regexps: this package is linked into envd, whose every start would pay
// for compiling them.)
func validOwner(s string) bool {
	if len(s) == 0 || len(s) > 39 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	return onlyChars(s, "-")
}

func validRepo(s string) bool {
	return len(s) > 0 && len(s) <= 100 && s != "." && s != ".." && onlyChars(s, "._-")
}

// onlyChars reports whether s holds only ASCII letters, digits and extra.
func onlyChars(s, extra string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte(extra, c) >= 0) {
			return false
		}
	}
	return true
}

// parseConfig checks the --config value (E2B's `mcp` option as JSON) and
// returns the servers in key order. Every problem is reported, each on its
// own line of the *configError. A catalog server that is not installed under
// o.CatalogDir is a problem too: the command must fail before it starts
// anything, with a reason the user can act on.
func parseConfig(raw []byte, o *Options) ([]*serverSpec, error) {
	var entries map[string]json.RawMessage
	trimmed := bytes.TrimSpace(raw)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return nil, &configError{[]string{"config: must be a JSON object whose keys are MCP server names, e.g. {\"memory\": {}}"}}
	}
	if err := json.Unmarshal(trimmed, &entries); err != nil {
		return nil, &configError{[]string{fmt.Sprintf("config: not valid JSON: %v", err)}}
	}
	keys := make([]string, 0, len(entries))
	for k := range entries {
		keys = append(keys, k)
	}
	slices.Sort(keys)

	var problems []string
	var specs []*serverSpec
	for _, key := range keys {
		spec, errs := parseEntry(key, entries[key], o)
		problems = append(problems, errs...)
		if spec != nil && len(errs) == 0 {
			specs = append(specs, spec)
		}
	}
	if len(problems) > 0 {
		return nil, &configError{problems}
	}
	assignPrefixes(specs)
	return specs, nil
}

// parseEntry checks one server's entry.
func parseEntry(key string, raw json.RawMessage, o *Options) (*serverSpec, []string) {
	if rest, ok := strings.CutPrefix(key, "github/"); ok {
		return parseCustom(key, rest, raw, o)
	}
	c := lookupCatalog(key)
	if c == nil {
		return nil, []string{fmt.Sprintf("%q: unknown MCP server; Airlock's catalog has %s, and custom servers use the key github/<owner>/<repo> with {\"runCmd\": ...}", key, catalogNames())}
	}
	v, problems := checkFields(key, raw, c.Fields)
	if len(problems) > 0 {
		return nil, problems
	}
	bin := c.binPath(o)
	if fi, err := os.Stat(bin); err != nil || fi.IsDir() {
		return nil, []string{fmt.Sprintf("%q: not installed in this sandbox's template (no %s): create the sandbox from the mcp-gateway template, or add it to your template with `mcp-gateway pull %s` (the SDK's Template().addMcpServer(%q))", key, bin, c.Name, c.Name)}
	}
	args, env := c.Launch(v, o)
	return &serverSpec{
		Key: key, Catalog: c,
		Argv: append([]string{bin}, args...),
		Env:  env,
	}, nil
}

// parseCustom checks a `github/<owner>/<repo>` entry.
func parseCustom(key, path string, raw json.RawMessage, o *Options) (*serverSpec, []string) {
	owner, repo, ok := strings.Cut(path, "/")
	if !ok || !validOwner(owner) || !validRepo(repo) {
		return nil, []string{fmt.Sprintf("%q: a custom server's key must be github/<owner>/<repo>: owner of letters, digits and inner '-' (at most 39), repository of letters, digits, '.', '-' and '_'", key)}
	}
	v, problems := checkFields(key, raw, customFields)
	if len(problems) > 0 {
		return nil, problems
	}
	env := make([]string, 0, len(v.stringMap("envs")))
	for k, val := range v.stringMap("envs") {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.Contains(val, "\x00") {
			problems = append(problems, fmt.Sprintf("%q: envs: %q is not a valid environment variable", key, k))
			continue
		}
		env = append(env, k+"="+val)
	}
	slices.Sort(env)
	if len(problems) > 0 {
		return nil, problems
	}
	return &serverSpec{
		Key: key, Owner: owner, Repo: repo,
		Dir:        filepath.Join(o.GitHubDir, owner, repo),
		InstallCmd: v.string("installCmd"),
		Argv:       []string{"/bin/sh", "-c", v.string("runCmd")},
		Env:        env,
	}, nil
}

// checkFields checks an entry against its fields: an object, no unknown keys,
// each value of its kind, the required ones present and not empty.
func checkFields(key string, raw json.RawMessage, fields []field) (values, []string) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
		return nil, []string{fmt.Sprintf("%q: must be an object%s", key, fieldList(fields))}
	}
	var problems []string
	names := make([]string, 0, len(obj))
	for k := range obj {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		if !slices.ContainsFunc(fields, func(f field) bool { return f.Name == k }) {
			problems = append(problems, fmt.Sprintf("%q: unknown field %q%s", key, k, fieldList(fields)))
		}
	}
	v := values{}
	for _, f := range fields {
		raw, ok := obj[f.Name]
		if !ok || string(raw) == "null" {
			if f.Required {
				problems = append(problems, fmt.Sprintf("%q: %q is required (%s)", key, f.Name, f.Kind))
			}
			continue
		}
		val, err := decodeField(raw, f.Kind)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%q: %q must be %s", key, f.Name, f.Kind))
			continue
		}
		if f.Required && isEmpty(val) {
			problems = append(problems, fmt.Sprintf("%q: %q must not be empty", key, f.Name))
			continue
		}
		v[f.Name] = val
	}
	return v, problems
}

// decodeField decodes a value of one kind; anything else (a number where a
// string belongs, an array holding a number) is an error.
func decodeField(raw json.RawMessage, k fieldKind) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	var err error
	var out any
	switch k {
	case kindString:
		var s string
		err = dec.Decode(&s)
		out = s
	case kindStringList:
		var l []string
		if err = dec.Decode(&l); err == nil && slices.Contains(l, "") {
			err = errors.New("empty string")
		}
		out = l
	case kindStringMap:
		var m map[string]string
		err = dec.Decode(&m)
		if m == nil && err == nil {
			m = map[string]string{}
		}
		out = m
	}
	if err != nil {
		return nil, err
	}
	// json.Unmarshal into a string accepts only a JSON string, into []string
	// only an array of strings (or null, handled by the caller): nothing to
	// coerce, so a successful decode is the type check.
	return out, nil
}

func isEmpty(v any) bool {
	switch v := v.(type) {
	case string:
		return strings.TrimSpace(v) == ""
	case []string:
		return len(v) == 0
	}
	return false
}

// fieldList is the tail of a message that names an entry's fields.
func fieldList(fields []field) string {
	if len(fields) == 0 {
		return " with no fields ({})"
	}
	parts := make([]string, len(fields))
	for i, f := range fields {
		req := "optional"
		if f.Required {
			req = "required"
		}
		parts[i] = fmt.Sprintf("%s (%s, %s)", f.Name, f.Kind, req)
	}
	return "; its fields: " + strings.Join(parts, ", ")
}

// assignPrefixes names each server's tools: a catalog server by its key, a
// custom server by its repository, or owner-repo where that name is not
// unique (two custom servers share a repository name, or one would take a
// catalog key); characters outside [A-Za-z0-9_-] become '-' (tool names
// allow little else), and a name still taken gets -2, -3, ... Names are
// compared without case, so no two prefixes differ only in case.
func assignPrefixes(specs []*serverSpec) {
	base := func(s *serverSpec) string {
		if s.custom() {
			return sanitize(s.Repo)
		}
		return s.Key
	}
	count := map[string]int{}
	for _, s := range specs {
		count[strings.ToLower(base(s))]++
	}
	taken := map[string]bool{}
	for _, s := range specs { // catalog keys first: they never change
		if !s.custom() {
			s.Prefix = s.Key
			taken[strings.ToLower(s.Key)] = true
		}
	}
	for _, s := range specs {
		if !s.custom() {
			continue
		}
		p := base(s)
		if count[strings.ToLower(p)] > 1 || lookupCatalog(strings.ToLower(p)) != nil {
			p = sanitize(s.Owner + "-" + s.Repo)
		}
		for i, q := 2, p; ; i++ {
			if !taken[strings.ToLower(q)] {
				p = q
				break
			}
			q = fmt.Sprintf("%s-%d", p, i)
		}
		taken[strings.ToLower(p)] = true
		s.Prefix = p
	}
}

func sanitize(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !onlyChars(string(c), "_-") {
			b[i] = '-'
		}
	}
	return string(b)
}
