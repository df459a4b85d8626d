package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"path"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Sandbox files as MCP resources. The resource template
// sandbox://{sandbox_id}/{+path} names any file or directory of a running
// sandbox: resources/read of a file returns it (text when it is UTF-8, a blob
// otherwise, with a MIME type from its name or its first bytes), of a
// directory a JSON listing of its entries, each with its own sandbox:// URI.
// resources/list lists each running sandbox's home directory, so that a
// client that browses resources finds a way in; it is computed per request,
// since sandboxes come and go.

// resourceScheme is the URI scheme of sandbox files.
const resourceScheme = "sandbox"

// sandboxURITemplate is the RFC 6570 template clients fill in: {+path} keeps
// the slashes of a path.
const sandboxURITemplate = resourceScheme + "://{sandbox_id}/{+path}"

// maxResourceBytes bounds a file resources/read returns. A resource is
// meant to be read whole, so a longer file is refused with a message that
// says how to read it in parts, rather than cut without a trace in the
// content itself.
var maxResourceBytes = 1 << 20

// homeDir is where resources/list points in each sandbox: the SDK user's home.
const homeDir = "/home/user"

// directoryMIME is the MIME type of a directory's listing.
const directoryMIME = "application/json"

func registerResources(s *mcp.Server, b Backend) {
	s.AddResourceTemplate(&mcp.ResourceTemplate{
		URITemplate: sandboxURITemplate,
		Name:        "sandbox-file",
		Title:       "A file or directory in a sandbox",
		Description: "A file (its content) or directory (a JSON listing of its entries) in a running sandbox, by absolute path: " +
			"sandbox://<sandbox_id>/home/user/notes.txt. Files of up to 1 MiB; read longer ones in parts with run_command.",
	}, func(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		return readSandboxResource(ctx, b, req.Params.URI)
	})
}

// SandboxURI is the resource URI of a path in a sandbox.
func SandboxURI(sandboxID, p string) string {
	u := url.URL{Scheme: resourceScheme, Host: sandboxID, Path: path.Clean("/" + p)}
	return u.String()
}

// parseSandboxURI splits a sandbox:// URI into the sandbox and the absolute,
// clean path.
func parseSandboxURI(uri string) (id, p string, err error) {
	u, err := url.Parse(uri)
	if err != nil {
		return "", "", fmt.Errorf("not a URI: %w", err)
	}
	if u.Scheme != resourceScheme || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return "", "", fmt.Errorf("%q is not of the form %s", uri, sandboxURITemplate)
	}
	return u.Host, path.Clean("/" + u.Path), nil
}

// invalidParams is the JSON-RPC error for a resource the caller named
// wrongly or cannot have: resources have no isError result, so the message
// is what the caller reads.
func invalidParams(uri, format string, args ...any) error {
	data, _ := json.Marshal(map[string]string{"uri": uri})
	return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf(format, args...), Data: data}
}

func readSandboxResource(ctx context.Context, b Backend, uri string) (*mcp.ReadResourceResult, error) {
	id, p, err := parseSandboxURI(uri)
	if err != nil {
		return nil, invalidParams(uri, "%v", err)
	}
	data, more, err := b.ReadFile(ctx, id, p, maxResourceBytes)
	switch {
	case errors.Is(err, ErrIsDirectory):
		return readDirectoryResource(ctx, b, uri, id, p)
	case errors.Is(err, ErrNotFound):
		return nil, mcp.ResourceNotFoundError(uri)
	case errors.Is(err, ErrPaused):
		return nil, invalidParams(uri, "%v", err)
	case err != nil:
		return nil, fmt.Errorf("read %s: %w", uri, err)
	case more:
		return nil, invalidParams(uri, "%s is larger than %s, the most a resource read returns; read it in parts with run_command (head -c, tail -c, split)",
			p, size(maxResourceBytes))
	}
	typ := mimeType(p, data)
	if utf8.Valid(data) && len(data) > 0 {
		return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: uri, MIMEType: typ, Text: string(data)}}}, nil
	}
	// An empty file goes as an empty blob: the SDK leaves out an empty
	// text, and contents with neither text nor blob are invalid.
	if data == nil {
		data = []byte{}
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: uri, MIMEType: typ, Blob: data}}}, nil
}

// mimeType is the file's type by its extension, else by its first bytes
// (what a browser would guess), without parameters for binary types.
func mimeType(p string, data []byte) string {
	if t := mime.TypeByExtension(path.Ext(p)); t != "" {
		return t
	}
	return http.DetectContentType(data)
}

type dirEntryOut struct {
	Name     string `json:"name"`
	URI      string `json:"uri"`
	Type     string `json:"type"`
	Size     int64  `json:"size"`
	Modified string `json:"modified,omitempty"`
}

type dirListingOut struct {
	Path    string        `json:"path"`
	Entries []dirEntryOut `json:"entries"`
}

// maxDirEntries bounds a directory listing like maxResourceBytes a file.
const maxDirEntries = 1000

func readDirectoryResource(ctx context.Context, b Backend, uri, id, p string) (*mcp.ReadResourceResult, error) {
	entries, err := b.ListFiles(ctx, id, p, 1)
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return nil, mcp.ResourceNotFoundError(uri)
		}
		return nil, fmt.Errorf("list %s: %w", uri, err)
	}
	out := dirListingOut{Path: p, Entries: make([]dirEntryOut, 0, min(len(entries), maxDirEntries))}
	for i, e := range entries {
		if i == maxDirEntries {
			break
		}
		out.Entries = append(out.Entries, dirEntryOut{Name: e.Name, URI: SandboxURI(id, e.Path), Type: e.Type, Size: e.Size, Modified: rfc3339(e.Modified)})
	}
	text, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode listing of %s: %w", uri, err)
	}
	c := &mcp.ResourceContents{URI: uri, MIMEType: directoryMIME, Text: string(text)}
	if len(entries) > maxDirEntries {
		c.Meta = mcp.Meta{"io.airlock/truncated": fmt.Sprintf("the first %d of %d entries", maxDirEntries, len(entries))}
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{c}}, nil
}

// privateNow is the caching hint (2026-07-28's ttlMs and cacheScope) of
// what depends on the API key and changes at any time: a sandbox's files and
// the list of sandboxes. The SDK's default is "public", which would let an
// intermediary serve one key's files to another.
var privateNow = mcp.Cacheable{TTLMs: 0, CacheScope: "private"}

// cacheable sets privateNow on the resource results the SDK builds.
func cacheable(_ context.Context, req mcp.Request, c *mcp.Cacheable) {
	switch req.(type) {
	case *mcp.ReadResourceRequest, *mcp.ListResourcesRequest:
		*c = privateNow
	}
}

// listSandboxResources answers resources/list: each running sandbox's home
// directory. The SDK lists only resources added ahead of time; sandboxes come
// and go, so this middleware answers the method itself.
func listSandboxResources(b Backend) mcp.Middleware {
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if method != "resources/list" {
				return next(ctx, method, req)
			}
			if p, ok := req.GetParams().(*mcp.ListResourcesParams); ok && p != nil && p.Cursor != "" {
				// One page holds every sandbox; a cursor can only be stale.
				return &mcp.ListResourcesResult{Resources: []*mcp.Resource{}, Cacheable: privateNow}, nil
			}
			sbs, err := b.ListSandboxes(ctx, ListSandboxesRequest{State: "running", NoMetrics: true})
			if err != nil {
				return nil, fmt.Errorf("list sandboxes: %w", err)
			}
			res := &mcp.ListResourcesResult{Resources: make([]*mcp.Resource, 0, len(sbs)), Cacheable: privateNow}
			for _, sb := range sbs {
				res.Resources = append(res.Resources, &mcp.Resource{
					URI:         SandboxURI(sb.SandboxID, homeDir),
					Name:        sb.SandboxID + homeDir,
					Title:       fmt.Sprintf("%s in sandbox %s (%s)", homeDir, sb.SandboxID, sb.Template),
					Description: "The home directory of a running sandbox: a JSON listing whose entries have their own sandbox:// URIs.",
					MIMEType:    directoryMIME,
				})
			}
			return res, nil
		}
	}
}
