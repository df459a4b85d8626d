package volumecontent

import (
	"errors"
	"strings"
)

// maxPathLength bounds a request's path (Linux's PATH_MAX).
const maxPathLength = 4096

var (
	errPathEmpty   = errors.New("path is required")
	errPathNUL     = errors.New("path contains a NUL byte")
	errPathLong    = errors.New("path is longer than 4096 bytes")
	errPathEscapes = errors.New("path escapes the volume")
)

// cleanPath turns a request's path into one relative to the volume's root:
// "." for the root itself, else slash-separated components with no ".", ".."
// or empty ones. Absolute and relative paths both name a place inside the
// volume ("/a" and "a" are the same file), as upstream's content API treats
// them; a ".." that would climb above the root is refused rather than
// clamped, so a client learns its path was wrong.
//
// This is only the lexical half of path safety. Symlinks inside the volume
// are resolved by the kernel beneath the volume's root (os.Root), which
// refuses any that lead out; see open.go.
func cleanPath(p string) (string, error) {
	switch {
	case p == "":
		return "", errPathEmpty
	case len(p) > maxPathLength:
		return "", errPathLong
	case strings.IndexByte(p, 0) >= 0:
		return "", errPathNUL
	}
	var out []string
	for c := range strings.SplitSeq(p, "/") {
		switch c {
		case "", ".":
		case "..":
			if len(out) == 0 {
				return "", errPathEscapes
			}
			out = out[:len(out)-1]
		default:
			out = append(out, c)
		}
	}
	if len(out) == 0 {
		return ".", nil
	}
	return strings.Join(out, "/"), nil
}

// display is how a cleaned path is shown back: absolute from the volume's
// root, as upstream's entries carry it.
func display(rel string) string {
	if rel == "." {
		return "/"
	}
	return "/" + rel
}
