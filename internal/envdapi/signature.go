package envdapi

import (
	"crypto/sha256"
	"encoding/base64"
	"strconv"
)

// FileSignature is the signature a signed /files URL carries, as the SDKs
// compute it client-side from the sandbox's access token. Checks work on the
// query's own bytes (QuerySignature).
// op is "read" (GET) or "write" (POST); username is "" when the URL names no user;
// expiration is unix seconds, 0 meaning the signature never expires.
func FileSignature(path, op, username, token string, expiration int64) string {
	exp := ""
	if expiration != 0 {
		exp = strconv.FormatInt(expiration, 10)
	}
	return QuerySignature(path, op, username, token, exp)
}

// QuerySignature works on the expiration exactly as it appears in the query
// string, so a URL is verified against the bytes the client signed.
func QuerySignature(path, op, username, token, expiration string) string {
	raw := path + ":" + op + ":" + username + ":" + token
	if expiration != "" {
		raw += ":" + expiration
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}
