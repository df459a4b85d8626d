package proxy

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"net/http"
	"regexp"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/apikey"
	"github.com/airlock-sandbox/airlock/internal/e2bwire"
	"github.com/airlock-sandbox/airlock/internal/envdapi"
	"github.com/airlock-sandbox/airlock/internal/grant"
)

// SetGrants makes the proxy take, for envd and the code interpreter, only
// the per-key grants the API hands out (internal/grant) in place of a
// sandbox's access token, and URL signatures made with them: each request
// is then worth what the key that obtained its grant is worth now. Without
// it, tokens and signatures go to envd as they came. Call it before serving.
func (p *Proxy) SetGrants(c grant.Checker) { p.grants = &c }

// admit swaps the grant a request for envd or the interpreter presents (in
// X-Access-Token, or as the key of a /files URL signature) for the
// sandbox's own token, which is all envd knows; false when it answered the
// request itself. A request with neither goes on as it is: envd refuses
// it, as E2B's does.
func (p *Proxy) admit(w http.ResponseWriter, r *http.Request, id string) bool {
	if p.grants == nil {
		return true
	}
	secret, owner, err := p.sandboxes.Access(id)
	if err != nil {
		sandboxGone(w, r, id)
		return false
	}
	if secret == "" { // made with secure: false, envd takes anyone
		return true
	}
	if tok := r.Header.Get(e2bwire.HeaderAccessToken); tok != "" {
		if key, err := p.grants.Check(tok, owner, secret, apikey.SandboxesWrite); err != nil {
			p.refuse(w, r, id, key, err)
			return false
		}
		r.Header.Set(e2bwire.HeaderAccessToken, secret)
		return true
	}
	sig, ok := signatureOf(r)
	if !ok {
		return true
	}
	if key, err := p.grants.Signed(owner, secret, apikey.SandboxesWrite, sig.madeWith); err != nil {
		p.refuse(w, r, id, key, err)
		return false
	}
	q := r.URL.Query()
	q.Set("signature", sig.sign(secret))
	r.URL.RawQuery = q.Encode()
	return true
}

// fileSignature is a /files URL's signature and what it signs.
type fileSignature struct{ sig, path, op, user, exp string }

// signatureOf returns the signature of a signed /files URL.
func signatureOf(r *http.Request) (fileSignature, bool) {
	if r.URL.Path != "/files" {
		return fileSignature{}, false
	}
	q := r.URL.Query()
	s := fileSignature{sig: q.Get("signature"), path: q.Get("path"), op: "read", user: q.Get("username"), exp: q.Get("signature_expiration")}
	if r.Method == http.MethodPost || r.Method == http.MethodPut {
		s.op = "write"
	}
	return s, s.sig != ""
}

// sign is the signature the same URL has when made with token.
func (s fileSignature) sign(token string) string {
	return envdapi.QuerySignature(s.path, s.op, s.user, token, s.exp)
}

func (s fileSignature) madeWith(token string) bool { return tokenEqual(s.sig, s.sign(token)) }

// refuse answers a grant Check or Signed refused: another team's as a
// sandbox that does not exist, the rest in the protocol the client speaks;
// and reports it for the audit log when it names a key.
func (p *Proxy) refuse(w http.ResponseWriter, r *http.Request, id string, key apikey.Principal, err error) {
	var se *grant.ScopeError
	status := http.StatusUnauthorized
	switch {
	case errors.Is(err, grant.ErrForeign):
		status = http.StatusBadGateway
		sandboxGone(w, r, id)
	case errors.As(err, &se):
		status = http.StatusForbidden
		envdError(w, r, status, "permission_denied", se.Error())
	case errors.Is(err, grant.ErrRevoked):
		envdError(w, r, status, "unauthenticated", err.Error())
	default:
		msg := "unauthorized access, please provide a valid access token or method signing if supported"
		if r.Header.Get(e2bwire.HeaderAccessToken) == "" {
			msg = "invalid signature"
		}
		envdError(w, r, status, "unauthenticated", msg)
	}
	p.grants.Report(grant.Refusal{Key: key, Action: "sandbox proxy " + r.Method + " " + r.URL.Path,
		TargetKind: "sandbox", TargetID: id, Status: status, Reason: err})
}

// connectPath is a Connect RPC's path: /<package>.<Service>/<Method>.
var connectPath = regexp.MustCompile(`^/[A-Za-z_][A-Za-z0-9_.]*\.[A-Za-z_][A-Za-z0-9_]*/[A-Za-z_][A-Za-z0-9_]*$`)

// envdError is a refusal shaped as envd's own would be: a Connect error
// for an RPC (in the end-of-stream message for a streaming one, as the
// protocol wants), else E2B's JSON error body.
func envdError(w http.ResponseWriter, r *http.Request, status int, code, msg string) {
	ct := r.Header.Get("Content-Type")
	switch {
	case strings.HasPrefix(ct, "application/connect+"):
		end, _ := json.Marshal(map[string]any{"error": map[string]string{"code": code, "message": msg}})
		w.Header().Set("Content-Type", ct)
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(append(binary.BigEndian.AppendUint32([]byte{connectEndStream}, uint32(len(end))), end...))
	case connectPath.MatchString(r.URL.Path):
		writeJSON(w, status, map[string]string{"code": code, "message": msg})
	default:
		writeJSON(w, status, map[string]any{"code": status, "message": msg})
	}
}
