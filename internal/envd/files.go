package envd

import (
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"mime/multipart"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/airlock-sandbox/airlock/internal/envdapi"
	"github.com/airlock-sandbox/airlock/internal/unixuser"
)

const (
	// Metadata limits of docs/E2B-WIRE.md §3.7.3: 246 = 255 (xattr name limit) - len("user.e2b.").
	maxMetadataKey   = 246
	maxMetadataTotal = 4096
)

// filesError is an HTTP failure of /files with the status and message the SDKs
// show to users.
type filesError struct {
	status int
	msg    string
}

func (e *filesError) Error() string { return e.msg }

func filesErr(status int, format string, args ...any) *filesError {
	return &filesError{status: status, msg: fmt.Sprintf(format, args...)}
}

func (s *Server) handleFiles(w http.ResponseWriter, r *http.Request) {
	var op string
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		op = "read"
	case http.MethodPost:
		op = "write"
	default:
		writeJSONError(w, http.StatusMethodNotAllowed, "method not allowed")
		return
	}
	q := r.URL.Query()
	if ferr := s.checkFilesAuth(r, q, op); ferr != nil {
		writeJSONError(w, ferr.status, ferr.msg)
		return
	}
	username := q.Get("username")
	u, err := s.lookupUser(username)
	if err != nil {
		writeJSONError(w, http.StatusUnauthorized, fmt.Sprintf("error looking up user '%s': %v", username, err))
		return
	}
	if op == "read" {
		s.download(w, r, s.resolvePath(q.Get("path"), u))
		return
	}
	results, ferr := s.upload(r, q.Get("path"), u)
	if ferr != nil {
		writeJSONError(w, ferr.status, ferr.msg)
		return
	}
	writeJSON(w, http.StatusOK, results)
}

// checkFilesAuth implements docs/E2B-WIRE.md §3.7.3: the access token header, or else a URL
// signature (optionally expiring) made with the token.
func (s *Server) checkFilesAuth(r *http.Request, q url.Values, op string) *filesError {
	token := s.id.accessToken()
	if token == "" {
		return nil
	}
	if got := r.Header.Get("X-Access-Token"); got != "" {
		if !tokenMatches(got, token) {
			return filesErr(http.StatusUnauthorized, "access token present in header but does not match")
		}
		return nil
	}
	sig := q.Get("signature")
	if sig == "" {
		return filesErr(http.StatusUnauthorized, "missing signature query parameter")
	}
	exp := q.Get("signature_expiration")
	want := envdapi.QuerySignature(q.Get("path"), op, q.Get("username"), token, exp)
	if !tokenMatches(sig, want) {
		return filesErr(http.StatusUnauthorized, "invalid signature")
	}
	if exp != "" {
		n, err := strconv.ParseInt(exp, 10, 64)
		if err != nil {
			return filesErr(http.StatusUnauthorized, "invalid signature expiration")
		}
		if n < time.Now().Unix() {
			return filesErr(http.StatusUnauthorized, "signature is already expired")
		}
	}
	return nil
}

// FilesSignatureValid reports whether r is a /files request whose URL signature
// was made with token. The host calls it to route header-less signed URLs, which
// carry no sandbox id, to the one sandbox whose token produced the signature.
func FilesSignatureValid(r *http.Request, token string) bool {
	if token == "" {
		return false
	}
	op := "read"
	if r.Method == http.MethodPost {
		op = "write"
	}
	q := r.URL.Query()
	sig := q.Get("signature")
	return sig != "" && tokenMatches(sig, envdapi.QuerySignature(q.Get("path"), op, q.Get("username"), token, q.Get("signature_expiration")))
}

// acceptEncoding picks gzip or identity from an Accept-Encoding header; ok is
// false when the client accepts neither (406).
func acceptEncoding(h string) (gzipOK bool, ok bool) {
	if strings.TrimSpace(h) == "" {
		return false, true
	}
	q := map[string]float64{}
	for _, part := range strings.Split(h, ",") {
		coding, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		coding = strings.ToLower(strings.TrimSpace(coding))
		if coding == "" {
			continue
		}
		v := 1.0
		for _, p := range strings.Split(params, ";") {
			if k, val, found := strings.Cut(strings.TrimSpace(p), "="); found && strings.EqualFold(strings.TrimSpace(k), "q") {
				if f, err := strconv.ParseFloat(strings.TrimSpace(val), 64); err == nil {
					v = f
				}
			}
		}
		q[coding] = v
	}
	weight := func(c string) float64 {
		if v, ok := q[c]; ok {
			return v
		}
		if v, ok := q["*"]; ok {
			return v
		}
		if c == "identity" {
			return 0.001 // acceptable unless refused explicitly
		}
		return 0
	}
	g, id := weight("gzip"), weight("identity")
	if g > 0 && g >= id {
		return true, true
	}
	return false, id > 0
}

func (s *Server) download(w http.ResponseWriter, r *http.Request, path string) {
	f, err := os.Open(path)
	if err != nil {
		switch {
		case errors.Is(err, fs.ErrNotExist):
			writeJSONError(w, http.StatusNotFound, fmt.Sprintf("path '%s' does not exist", path))
		case errors.Is(err, fs.ErrPermission):
			writeJSONError(w, http.StatusForbidden, fmt.Sprintf("cannot read '%s': permission denied", path))
		default:
			writeJSONError(w, pathErrorStatus(err), fmt.Sprintf("cannot open '%s': %v", path, err))
		}
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		writeJSONError(w, http.StatusInternalServerError, fmt.Sprintf("cannot stat '%s': %v", path, err))
		return
	}
	if fi.IsDir() {
		writeJSONError(w, http.StatusBadRequest, fmt.Sprintf("path '%s' is a directory", path))
		return
	}
	h := w.Header()
	h.Set("Vary", "Accept-Encoding")
	name := filepath.Base(path)
	if cd := mime.FormatMediaType("inline", map[string]string{"filename": name}); cd != "" {
		h.Set("Content-Disposition", cd)
	}
	ctype := mime.TypeByExtension(filepath.Ext(name))
	if ctype == "" && fi.Mode().IsRegular() {
		var buf [512]byte
		n, _ := io.ReadFull(f, buf[:])
		ctype = http.DetectContentType(buf[:n])
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			writeJSONError(w, http.StatusInternalServerError, fmt.Sprintf("cannot read '%s': %v", path, err))
			return
		}
	}
	if ctype == "" {
		ctype = "application/octet-stream"
	}
	h.Set("Content-Type", ctype)

	useGzip, ok := acceptEncoding(r.Header.Get("Accept-Encoding"))
	if !ok {
		writeJSONError(w, http.StatusNotAcceptable, "no acceptable content encoding (supported: gzip, identity)")
		return
	}
	if r.Header.Get("Range") != "" {
		useGzip = false // ranges address the identity bytes
	}
	switch {
	case useGzip:
		h.Set("Content-Encoding", "gzip")
		w.WriteHeader(http.StatusOK)
		if r.Method == http.MethodHead {
			return
		}
		gz, _ := gzip.NewWriterLevel(w, gzip.BestSpeed)
		if _, err := io.Copy(gz, f); err != nil {
			s.log.Debug("download interrupted", "path", path, "err", err)
			return
		}
		_ = gz.Close()
	case fi.Mode().IsRegular():
		http.ServeContent(w, r, name, fi.ModTime(), f)
	default:
		// /proc files and devices report size 0 but have content: stream them.
		w.WriteHeader(http.StatusOK)
		if r.Method != http.MethodHead {
			_, _ = io.Copy(w, f)
		}
	}
}

// uploadResult is one element of the POST /files response array.
type uploadResult struct {
	Name     string            `json:"name"`
	Path     string            `json:"path"`
	Type     string            `json:"type"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

func parseMetadata(h http.Header) (map[string]string, *filesError) {
	var meta map[string]string
	total := 0
	keys := make([]string, 0)
	for k := range h {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		rest, ok := strings.CutPrefix(http.CanonicalHeaderKey(k), "X-Metadata-")
		if !ok {
			continue
		}
		key := strings.ToLower(rest)
		val := h.Get(k)
		if key == "" || !printableASCII(key) || !printableASCII(val) {
			return nil, filesErr(http.StatusBadRequest, "metadata key and value must be printable ASCII (header %s)", k)
		}
		if len(key) > maxMetadataKey {
			return nil, filesErr(http.StatusBadRequest, "metadata key '%s' is longer than %d bytes", key, maxMetadataKey)
		}
		total += len(key) + len(val)
		if total > maxMetadataTotal {
			return nil, filesErr(http.StatusBadRequest, "metadata is larger than %d bytes", maxMetadataTotal)
		}
		if meta == nil {
			meta = map[string]string{}
		}
		meta[key] = val
	}
	return meta, nil
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// upload writes every file of a POST /files request.
func (s *Server) upload(r *http.Request, pathParam string, u *unixuser.User) ([]uploadResult, *filesError) {
	meta, ferr := parseMetadata(r.Header)
	if ferr != nil {
		return nil, ferr
	}
	body := io.Reader(r.Body)
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip", "x-gzip":
		gz, err := gzip.NewReader(r.Body)
		if err != nil {
			return nil, filesErr(http.StatusBadRequest, "invalid gzip request body: %v", err)
		}
		defer gz.Close()
		body = gz
	default:
		return nil, filesErr(http.StatusBadRequest, "unsupported content encoding '%s' (supported: gzip)", enc)
	}
	ctype := r.Header.Get("Content-Type")
	mediaType, params, err := mime.ParseMediaType(ctype)
	if ctype == "" {
		mediaType, err = "application/octet-stream", nil
	}
	if err != nil {
		return nil, filesErr(http.StatusBadRequest, "invalid content type '%s': %v", ctype, err)
	}
	switch mediaType {
	case "multipart/form-data":
		boundary := params["boundary"]
		if boundary == "" {
			return nil, filesErr(http.StatusBadRequest, "multipart body without boundary")
		}
		return s.uploadMultipart(multipart.NewReader(body, boundary), pathParam, u, meta)
	case "application/octet-stream":
		if pathParam == "" {
			return nil, filesErr(http.StatusBadRequest, "the path query parameter is required for application/octet-stream uploads")
		}
		dst := s.resolvePath(pathParam, u)
		res, ferr := s.writeUpload(dst, body, u, meta)
		if ferr != nil {
			return nil, ferr
		}
		return []uploadResult{res}, nil
	default:
		return nil, filesErr(http.StatusBadRequest, "unsupported content type '%s' (use multipart/form-data or application/octet-stream)", mediaType)
	}
}

// partFileName reads a part's filename from its Content-Disposition. Go's
// Part.FileName() keeps only the base name, but the SDKs put the full target path
// there (docs/E2B-WIRE.md §3.7.3). Browsers and undici follow the HTML form encoding, which
// escapes only '"', CR and LF (as %22, %0D, %0A) and leaves backslashes alone, so
// the quoted value is read literally rather than as an RFC 2616 quoted-string.
func partFileName(p *multipart.Part) (name string, isFile bool) {
	cd := p.Header.Get("Content-Disposition")
	_, params, err := mime.ParseMediaType(cd)
	raw := dispositionParams(cd)
	if _, extended := raw["filename*"]; !extended {
		if v, ok := raw["filename"]; ok {
			return formUnescaper.Replace(v), true
		}
	}
	if err == nil {
		if fn, ok := params["filename"]; ok {
			return fn, true
		}
		return "", params["name"] == "file"
	}
	return "", raw["name"] == "file"
}

var formUnescaper = strings.NewReplacer("%22", `"`, "%0D", "\r", "%0A", "\n", "%0d", "\r", "%0a", "\n")

// dispositionParams splits a Content-Disposition value into lower-cased parameter
// names and their values, quotes removed, with no escape processing.
func dispositionParams(v string) map[string]string {
	out := map[string]string{}
	var parts []string
	inQuote, start := false, 0
	for i := 0; i < len(v); i++ {
		switch v[i] {
		case '"':
			inQuote = !inQuote
		case ';':
			if !inQuote {
				parts = append(parts, v[start:i])
				start = i + 1
			}
		}
	}
	parts = append(parts, v[start:])
	for _, part := range parts[1:] {
		k, val, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			continue
		}
		val = strings.TrimSpace(val)
		if len(val) >= 2 && val[0] == '"' && val[len(val)-1] == '"' {
			val = val[1 : len(val)-1]
		}
		out[strings.ToLower(strings.TrimSpace(k))] = val
	}
	return out
}

func (s *Server) uploadMultipart(mr *multipart.Reader, pathParam string, u *unixuser.User, meta map[string]string) ([]uploadResult, *filesError) {
	var results []uploadResult
	seen := map[string]bool{}
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, filesErr(http.StatusBadRequest, "reading multipart body: %v", err)
		}
		name, isFile := partFileName(part)
		if !isFile {
			part.Close()
			continue
		}
		target := name
		if pathParam != "" {
			target = pathParam
		}
		if target == "" {
			part.Close()
			return nil, filesErr(http.StatusBadRequest, "a file part has no filename and no path query parameter was given")
		}
		dst := s.resolvePath(target, u)
		if seen[dst] {
			part.Close()
			return nil, filesErr(http.StatusBadRequest, "cannot upload multiple files to the same path '%s'", dst)
		}
		seen[dst] = true
		res, ferr := s.writeUpload(dst, part, u, meta)
		part.Close()
		if ferr != nil {
			return nil, ferr
		}
		results = append(results, res)
	}
	if len(results) == 0 {
		return nil, filesErr(http.StatusBadRequest, "no file parts in the multipart body")
	}
	return results, nil
}

func isNoSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// writeUpload writes one uploaded file in place (keeping the inode, so hard links
// and open handles see the new content), owned by the user.
func (s *Server) writeUpload(dst string, r io.Reader, u *unixuser.User, meta map[string]string) (uploadResult, *filesError) {
	if fi, err := os.Stat(dst); err == nil && fi.IsDir() {
		return uploadResult{}, filesErr(http.StatusBadRequest, "path '%s' is a directory", dst)
	}
	if err := mkdirAllOwned(filepath.Dir(dst), u); err != nil {
		switch {
		case isNoSpace(err):
			return uploadResult{}, filesErr(http.StatusInsufficientStorage, "not enough disk space available")
		case errors.Is(err, syscall.ENOTDIR):
			return uploadResult{}, filesErr(http.StatusBadRequest, "cannot create '%s': a parent is not a directory", dst)
		}
		return uploadResult{}, filesErr(pathErrorStatus(err), "creating parent directories of '%s': %v", dst, err)
	}
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o666)
	if err != nil {
		switch {
		case isNoSpace(err):
			return uploadResult{}, filesErr(http.StatusInsufficientStorage, "not enough disk space available")
		case errors.Is(err, syscall.EISDIR):
			return uploadResult{}, filesErr(http.StatusBadRequest, "path '%s' is a directory", dst)
		case errors.Is(err, fs.ErrPermission):
			return uploadResult{}, filesErr(http.StatusForbidden, "cannot write '%s': permission denied", dst)
		}
		return uploadResult{}, filesErr(pathErrorStatus(err), "opening '%s': %v", dst, err)
	}
	if os.Geteuid() == 0 {
		_ = f.Chown(int(u.UID), int(u.GID))
	}
	fw := &fileWriter{f: f}
	_, copyErr := io.CopyBuffer(fw, r, make([]byte, 256<<10))
	metaErr := replaceMetadata(f, meta)
	closeErr := f.Close()
	writeErr := fw.err
	if writeErr == nil {
		writeErr = closeErr
	}
	switch {
	case writeErr != nil && isNoSpace(writeErr):
		return uploadResult{}, filesErr(http.StatusInsufficientStorage, "not enough disk space available")
	case writeErr != nil:
		return uploadResult{}, filesErr(http.StatusInternalServerError, "writing '%s': %v", dst, writeErr)
	case copyErr != nil:
		// The body broke off or was malformed (bad gzip, truncated multipart).
		return uploadResult{}, filesErr(http.StatusBadRequest, "reading upload of '%s': %v", dst, copyErr)
	}
	if metaErr != nil {
		if isNoSpace(metaErr) {
			return uploadResult{}, filesErr(http.StatusInsufficientStorage, "not enough disk space available")
		}
		return uploadResult{}, filesErr(http.StatusInternalServerError, "%v", metaErr)
	}
	return uploadResult{Name: filepath.Base(dst), Path: dst, Type: "file", Metadata: meta}, nil
}

// fileWriter remembers write errors so a failed disk write (507/500) is told
// apart from a broken request body (400).
type fileWriter struct {
	f   *os.File
	err error
}

func (w *fileWriter) Write(p []byte) (int, error) {
	n, err := w.f.Write(p)
	if err != nil && w.err == nil {
		w.err = err
	}
	return n, err
}

// pathErrorStatus tells a path the client got wrong (400) from envd's own failure.
func pathErrorStatus(err error) int {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return http.StatusNotFound
	case errors.Is(err, fs.ErrPermission):
		return http.StatusForbidden
	case isNoSpace(err):
		return http.StatusInsufficientStorage
	case errors.Is(err, syscall.EINVAL), errors.Is(err, syscall.ENAMETOOLONG), errors.Is(err, syscall.ENOTDIR),
		errors.Is(err, syscall.ELOOP), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.EROFS), errors.Is(err, syscall.ETXTBSY):
		return http.StatusBadRequest
	}
	return http.StatusInternalServerError
}
