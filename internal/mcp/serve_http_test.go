package mcp

import (
	"encoding/json"
	"net"
	"net/http/httptest"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/e2bwire"
)

// TestInfoHandler: the sandbox URL a client learns is the proxy's listen address,
// or, when the proxy listens on every address, the host the client used for the API
// with the proxy's port (never the API's port plus one).
func TestInfoHandler(t *testing.T) {
	for _, tt := range []struct {
		listen *net.TCPAddr
		host   string
		want   string
	}{
		{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 4011}, "127.0.0.1:4000", "http://127.0.0.1:4011"},
		{&net.TCPAddr{IP: net.IPv4zero, Port: 4011}, "sandbox.example:4000", "http://sandbox.example:4011"},
		{&net.TCPAddr{IP: net.IPv6unspecified, Port: 4011}, "[::1]:4000", "http://[::1]:4011"},
		{&net.TCPAddr{IP: net.IPv4zero, Port: 4011}, "10.1.2.3", "http://10.1.2.3:4011"},
	} {
		req := httptest.NewRequest("GET", e2bwire.InfoPath, nil)
		req.Host = tt.host
		rec := httptest.NewRecorder()
		InfoHandler(tt.listen).ServeHTTP(rec, req)
		var info e2bwire.ServerInfo
		if err := json.Unmarshal(rec.Body.Bytes(), &info); err != nil || info.SandboxURL != tt.want {
			t.Errorf("listen %v, Host %q: %s (%v), want sandboxUrl %s", tt.listen, tt.host, rec.Body, err, tt.want)
		}
	}
}
