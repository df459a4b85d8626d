package e2b

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/e2bwire"
)

// Request bodies are e2bwire's (NewSandbox, ConnectSandbox, ...): pointers in
// them tell "absent" from zero, and unknown fields are accepted.

// allTraffic is what the SDKs' ALL_TRAFFIC constant expands to.
const allTraffic = "0.0.0.0/0"

// decodeBody reads an optional JSON body into v. An empty body (or JSON
// null) leaves v untouched: the SDKs send nothing, "{}" or a chunked body
// interchangeably for endpoints whose fields are all optional.
func (h *Handler) decodeBody(w http.ResponseWriter, r *http.Request, v any) (present bool, err error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.opts.MaxBodySize))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return false, &apiError{
				status:  http.StatusRequestEntityTooLarge,
				message: fmt.Sprintf("request body is larger than %d bytes", tooBig.Limit),
				err:     err,
			}
		}
		return false, &apiError{status: http.StatusBadRequest, message: fmt.Sprintf("reading request body: %v", err), err: err}
	}
	body = bytes.TrimSpace(body)
	if len(body) == 0 || bytes.Equal(body, []byte("null")) {
		return false, nil
	}
	if err := json.Unmarshal(body, v); err != nil {
		return false, &apiError{status: http.StatusBadRequest, message: describeJSONError(err), err: err}
	}
	return true, nil
}

// describeJSONError rewords decoder errors for API users: they should learn
// which field was wrong and how, not which Go type it was decoded into.
func describeJSONError(err error) string {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return fmt.Sprintf("malformed JSON body: %v (at byte %d)", syn, syn.Offset)
	case errors.As(err, &typ):
		if typ.Field == "" {
			return fmt.Sprintf("malformed JSON body: expected %s, got %s", jsonKind(typ.Type), typ.Value)
		}
		return fmt.Sprintf("malformed JSON body: field %q must be %s, got %s", typ.Field, jsonKind(typ.Type), typ.Value)
	default:
		return fmt.Sprintf("malformed JSON body: %v", err)
	}
}

func jsonKind(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "a boolean"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Map, reflect.Struct:
		return "an object"
	default:
		return "a JSON value"
	}
}

// stringMap checks that every value of a decoded JSON object is a string.
// Decoding into map[string]any (not map[string]string) is what lets a null or
// a number be refused with the key named, instead of silently becoming "".
func stringMap(field string, m map[string]any) (map[string]string, error) {
	if m == nil {
		return nil, nil
	}
	out := make(map[string]string, len(m))
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys) // deterministic message when several values are wrong
	for _, k := range keys {
		s, ok := m[k].(string)
		if !ok {
			return nil, badRequest("%s values must be strings: %q is %s", field, k, describeValue(m[k]))
		}
		out[k] = s
	}
	return out, nil
}

func describeValue(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case float64:
		return "a number"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	default:
		return fmt.Sprintf("%T", v)
	}
}

// timeoutRule says how one endpoint treats its timeout field.
type timeoutRule struct {
	field     string        // JSON field name, for messages
	def       time.Duration // used when the field is absent; 0 = required
	allowZero bool
}

// timeout validates a seconds field against the rule and MaxTimeout. The
// maximum is checked on the integer before converting, so absurd values
// cannot overflow time.Duration into something that passes.
func (h *Handler) timeout(seconds *int64, rule timeoutRule) (time.Duration, error) {
	if seconds == nil {
		if rule.def == 0 {
			return 0, badRequest("%s is required", rule.field)
		}
		return rule.def, nil
	}
	s := *seconds
	switch {
	case s < 0 || (s == 0 && !rule.allowZero):
		// Upstream's wording, kept because users search for it.
		if rule.field == "timeout" {
			return 0, badRequest("Timeout must be greater than 0")
		}
		return 0, badRequest("%s must be greater than 0", rule.field)
	case s > int64(h.opts.MaxTimeout/time.Second):
		return 0, badRequest("%s", h.maxTimeoutMessage())
	}
	return time.Duration(s) * time.Second, nil
}

func (h *Handler) maxTimeoutMessage() string {
	if h.opts.MaxTimeout%time.Hour == 0 {
		return fmt.Sprintf("Timeout cannot be greater than %d hours", h.opts.MaxTimeout/time.Hour)
	}
	return fmt.Sprintf("Timeout cannot be greater than %d seconds", h.opts.MaxTimeout/time.Second)
}

// validate checks a network config the way upstream does, so that a body
// that would be refused there is refused here too, even though Airlock does
// not apply most of it yet (see the create and update handlers).
func validateNetwork(n *e2bwire.SandboxNetworkConfig) error {
	for _, d := range n.DenyOut {
		if !isIPOrCIDR(d) {
			return badRequest("network: denyOut entry %q is not an IP address or CIDR", d)
		}
	}
	hasDomain := false
	for _, a := range n.AllowOut {
		switch {
		case isIPOrCIDR(a):
		case isDomainPattern(a):
			hasDomain = true
		default:
			return badRequest("network: allowOut entry %q is not an IP address, CIDR or domain", a)
		}
	}
	if hasDomain && !containsString(n.DenyOut, allTraffic) {
		return badRequest("network: allowing domains in allowOut requires %q (ALL_TRAFFIC) in denyOut", allTraffic)
	}
	if n.EgressProxy != nil && strings.TrimSpace(n.EgressProxy.Address) == "" {
		return badRequest("network: egressProxy.address is required")
	}
	for host := range n.Rules {
		if !isDomainPattern(host) && !isIPOrCIDR(host) {
			return badRequest("network: rules key %q is not a domain, IP address or CIDR", host)
		}
	}
	if n.MaskRequestHost != nil {
		if err := checkMaskHost(*n.MaskRequestHost); err != nil {
			return err
		}
	}
	return nil
}

// maskHostName is what the host part of a maskRequestHost may hold: a DNS
// name or an IPv4 address, in ASCII (upstream refuses what IDNA would
// change).
var maskHostName = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9.-]{0,252})$`)

// checkMaskHost checks a maskRequestHost: host or host:port, where
// e2bwire.MaskPortPlaceholder may stand for the port (or in the host).
func checkMaskHost(mask string) error {
	probe := strings.ReplaceAll(mask, e2bwire.MaskPortPlaceholder, "1")
	for _, r := range probe {
		if r > 0x7e || r < 0x21 {
			return badRequest("network: mask request host '%s' is not ASCII (or holds spaces). Please use ASCII characters only.", mask)
		}
	}
	host := probe
	if h, port, err := net.SplitHostPort(probe); err == nil {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return badRequest("network: mask request host is not valid: %s (port %q)", mask, port)
		}
		host = h
	}
	if ip, err := netip.ParseAddr(host); err == nil && ip.Is6() {
		return nil // [::1]:port
	}
	if !maskHostName.MatchString(host) {
		return badRequest("network: mask request host is not valid: %s", mask)
	}
	return nil
}

func containsString(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// isIPOrCIDR accepts IPv4 and IPv6 addresses and CIDRs (sandboxes have IPv6
// egress under the same policy), but no zone ("fe80::1%eth0"): a zone names
// an interface of the host, which means nothing in a sandbox's policy.
func isIPOrCIDR(s string) bool {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Zone() == ""
	}
	_, err := netip.ParsePrefix(s)
	return err == nil
}

// isDomainPattern accepts host names and a leading "*." wildcard, which the
// SDK documents for allowOut.
func isDomainPattern(s string) bool {
	s = strings.TrimPrefix(s, "*.")
	s = strings.TrimSuffix(s, ".")
	if s == "" || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// sandboxIDParam reads and validates the {sandboxID} path segment. Old SDKs
// address sandboxes as "<sandboxID>-<clientID>"; upstream strips the suffix,
// and so do we. Ids are DNS labels (^[a-z0-9]+$), so anything else is a 400,
// while a well-formed id that does not exist stays a 404 from the manager.
// sandboxRequest reads what most per-sandbox endpoints take: the sandbox id
// from the path and an optional JSON body into v.
func (h *Handler) sandboxRequest(w http.ResponseWriter, r *http.Request, v any) (string, error) {
	id, err := sandboxIDParam(r)
	if err != nil {
		return "", err
	}
	if _, err := h.decodeBody(w, r, v); err != nil {
		return "", err
	}
	return id, nil
}

func sandboxIDParam(r *http.Request) (string, error) {
	raw := r.PathValue("sandboxID")
	id := raw
	if before, after, ok := strings.Cut(raw, "-"); ok && !strings.Contains(after, "-") {
		id = before
	}
	if !validSandboxID(id) {
		return "", badRequest("Invalid sandbox ID %q: must match ^[a-z0-9]+$", raw)
	}
	return id, nil
}

func validSandboxID(id string) bool {
	if id == "" {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}
