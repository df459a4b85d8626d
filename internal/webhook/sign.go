package webhook

import (
	"crypto/sha256"
	"encoding/base64"
	"strings"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// The headers of a delivery.
const (
	HeaderWebhookID        = "e2b-webhook-id"
	HeaderDeliveryID       = "e2b-delivery-id"
	HeaderSignatureVersion = "e2b-signature-version"
	HeaderSignature        = "e2b-signature"
	// Standard Webhooks (standardwebhooks.com), so that its verifier
	// libraries work as they are.
	HeaderSWID        = "webhook-id"
	HeaderSWTimestamp = "webhook-timestamp"
	HeaderSWSignature = "webhook-signature"
)

// SignatureVersion is what e2b-signature-version says.
const SignatureVersion = "v1"

// E2BSignature is E2B's v1 signature of a body: SHA-256 over the secret
// followed by the raw body, base64url without padding. (It is a plain
// hash, not an HMAC: what E2B documents and its receivers check.)
func E2BSignature(secret string, body []byte) string {
	h := sha256.New()
	h.Write([]byte(secret))
	h.Write(body)
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil))
}

// swSecretPrefix marks a Standard Webhooks secret: the rest is the base64
// of the key.
const swSecretPrefix = "whsec_"

// SWKey is the HMAC key of the Standard Webhooks signature for a webhook's
// secret: a "whsec_<base64>" secret is decoded as the spec defines (what a
// verifier library given that secret does); any other secret is used as its
// raw bytes (what the libraries' raw-secret option does), since E2B's
// secrets are free-form.
func SWKey(secret string) []byte {
	if rest, ok := strings.CutPrefix(secret, swSecretPrefix); ok {
		if key, err := base64.StdEncoding.DecodeString(rest); err == nil && len(key) > 0 {
			return key
		}
	}
	return []byte(secret)
}

// SWSignature is the Standard Webhooks v1 signature header value: "v1,"
// and the base64 HMAC-SHA256, keyed with key, of "<id>.<timestamp>.<body>",
// made by the specification's own Go library.
func SWSignature(key []byte, id string, ts time.Time, body []byte) string {
	wh, _ := standardwebhooks.NewWebhookRaw(key) // never fails
	sig, _ := wh.Sign(id, ts, body)              // never fails
	return sig
}
