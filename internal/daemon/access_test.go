package daemon_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/internal/daemon"
	"github.com/airlock-sandbox/airlock/internal/daemon/daemontest"
	"github.com/airlock-sandbox/airlock/internal/e2bclient"
	"github.com/airlock-sandbox/airlock/internal/e2bwire"
	"github.com/airlock-sandbox/airlock/internal/envdapi"
)

// TestAccessMatrix is issue 23's matrix over the routes that do not take
// an API key themselves — the sandbox proxy (envd's /files, a Connect RPC,
// a signed URL), the volume content API — and /mcp, for each kind of
// caller: no credential, a revoked key's, another team's, a read-only
// key's, a full key's. The REST routes' matrix is internal/e2b's
// TestKeyMatrix. The tokens each row presents are the ones its key was
// handed by the API (grants), obtained before the key was revoked or made
// read-only, as a client holding them would present them.
func TestAccessMatrix(t *testing.T) {
	d := daemontest.Start(t, func(c *daemon.Config) {
		c.DiskQuota, c.DiskImageMB = true, 512
		c.Volumes = daemon.VolumeConfig{DefaultMB: 16, MaxMB: 32, PerKey: 4}
	})
	ctx := context.Background()
	admin := daemontest.Client(d, daemontest.Key)
	newKey := func(team, name string, scopes ...string) (e2bwire.TeamAPIKey, *e2bclient.Client) {
		t.Helper()
		return daemontest.TeamKey(t, d, team, name, scopes...)
	}
	all := []string{"sandboxes:read", "sandboxes:write", "volumes:read", "volumes:write"}
	fullKey, full := newKey("blue", "full", all...)
	revokedKey, revoked := newKey("blue", "revoked", all...)
	readerKey, reader := newKey("blue", "reader", all...) // made read-only below
	otherKey, other := newKey("green", "other", all...)

	sb, err := full.Create(ctx, e2bwire.NewSandbox{TemplateID: "base"})
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := other.Create(ctx, e2bwire.NewSandbox{TemplateID: "base"})
	if err != nil {
		t.Fatal(err)
	}
	if err := full.Sandbox(sb.SandboxID, sb.EnvdAccessToken).WriteFile(ctx, "/home/user/f", strings.NewReader("blue's file")); err != nil {
		t.Fatal(err)
	}
	vol, err := full.CreateVolume(ctx, "blue-vol", 0)
	if err != nil {
		t.Fatal(err)
	}
	theirVol, err := other.CreateVolume(ctx, "green-vol", 0)
	if err != nil {
		t.Fatal(err)
	}
	if code, body := volCall(t, "PUT", d.APIURL+"/volumecontent/"+vol.VolumeID+"/file?path=f", "Bearer "+vol.Token, strings.NewReader("blue's volume")); code != http.StatusCreated {
		t.Fatalf("volume write: %d %s", code, body)
	}

	// What each row holds: the grants the API handed its key.
	type holder struct{ envd, volume string }
	grants := func(c *e2bclient.Client, sandboxID, volumeID string) holder {
		t.Helper()
		s, err := c.Get(ctx, sandboxID)
		if err != nil {
			t.Fatal(err)
		}
		v, err := c.GetVolume(ctx, volumeID)
		if err != nil {
			t.Fatal(err)
		}
		return holder{s.EnvdAccessToken, v.Token}
	}
	rows := []struct {
		name string
		h    holder
	}{
		{"no credential", holder{}},
		{"revoked", grants(revoked, sb.SandboxID, vol.VolumeID)},
		{"another team", grants(other, theirs.SandboxID, theirVol.VolumeID)},
		{"read-only", grants(reader, sb.SandboxID, vol.VolumeID)},
		{"full", grants(full, sb.SandboxID, vol.VolumeID)},
	}
	if rows[4].h.envd == sb.EnvdAccessToken && rows[3].h.envd == sb.EnvdAccessToken {
		t.Fatal("two keys were handed the same envd token: tokens are not per key")
	}
	if err := admin.RevokeKey(ctx, revokedKey.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.UpdateKey(ctx, readerKey.ID, e2bwire.NewTeamAPIKey{Scopes: []string{"sandboxes:read", "volumes:read"}}); err != nil {
		t.Fatal(err)
	}
	if s, err := reader.Get(ctx, sb.SandboxID); err != nil || s.EnvdAccessToken != "" {
		t.Fatalf("a read-only key is handed an envd token: %q %v", s.EnvdAccessToken, err)
	}

	// The proxy's answer for a sandbox that does not exist: another
	// team's must be the same.
	const ghost = "nosuchsandbox0000000"
	notFound := func(id string) string {
		return fmt.Sprintf(`{"code":502,"message":"The sandbox was not found","sandboxId":%q}`, id)
	}
	if code, body := proxyCall(t, d.SandboxURL, ghost, "GET", "/files?path=/home/user/f", rows[4].h.envd, "", nil); code != 502 || body != notFound(ghost) {
		t.Fatalf("an unknown sandbox: %d %s", code, body)
	}

	signed := func(token string) string {
		if token == "" {
			return "/files?path=/home/user/f&username=user"
		}
		exp := fmt.Sprint(time.Now().Add(time.Hour).Unix())
		return "/files?" + url.Values{"path": {"/home/user/f"}, "username": {"user"}, "signature_expiration": {exp},
			"signature": {envdapi.QuerySignature("/home/user/f", "read", "user", token, exp)}}.Encode()
	}
	type cell struct {
		status int
		body   string // in the answer
	}
	surfaces := []struct {
		name string
		call func(h holder) (int, string)
		want [5]cell
	}{
		{"envd /files", func(h holder) (int, string) {
			return proxyCall(t, d.SandboxURL, sb.SandboxID, "GET", "/files?path=/home/user/f", h.envd, "", nil)
		}, [5]cell{{401, "missing signature"}, {401, "revoked"}, {502, notFound(sb.SandboxID)}, {403, "lacks the scope sandboxes:write"}, {200, "blue's file"}}},
		{"envd Connect RPC", func(h holder) (int, string) {
			return proxyCall(t, d.SandboxURL, sb.SandboxID, "POST", "/filesystem.Filesystem/Stat", h.envd, "application/json", strings.NewReader(`{"path":"/home/user/f"}`))
		}, [5]cell{{401, "unauthenticated"}, {401, "revoked"}, {502, notFound(sb.SandboxID)}, {403, "permission_denied"}, {200, `"name":"f"`}}},
		{"signed URL", func(h holder) (int, string) {
			return proxyCall(t, d.SandboxURL, sb.SandboxID, "GET", signed(h.envd), "", "", nil)
		}, [5]cell{{401, "missing signature"}, {401, "invalid signature"}, {401, "invalid signature"}, {403, "lacks the scope sandboxes:write"}, {200, "blue's file"}}},
		{"volume content read", func(h holder) (int, string) {
			return volumeCall(t, d.APIURL, "GET", vol.VolumeID, h.volume, nil)
		}, [5]cell{{401, "missing volume token"}, {401, "revoked"}, {403, "does not open volume"}, {200, "blue's volume"}, {200, "blue's volume"}}},
		{"volume content write", func(h holder) (int, string) {
			return volumeCall(t, d.APIURL, "PUT", vol.VolumeID, h.volume, strings.NewReader("overwritten"))
		}, [5]cell{{401, "missing volume token"}, {401, "revoked"}, {403, "does not open volume"}, {403, "lacks the scope volumes:write"}, {201, ""}}},
	}
	for _, s := range surfaces {
		for i, row := range rows {
			code, body := s.call(row.h)
			want := s.want[i]
			if code != want.status || !strings.Contains(body, want.body) {
				t.Errorf("%s, %s: %d %s; want %d with %q", s.name, row.name, code, body, want.status, want.body)
			}
			if code >= 400 && (strings.Contains(body, "blue's") || strings.Contains(body, sb.EnvdAccessToken)) {
				t.Errorf("%s, %s: the refusal shows content or a token: %s", s.name, row.name, body)
			}
		}
	}
	// Another team's volume answers as one that never existed.
	_, theirs403 := volumeCall(t, d.APIURL, "GET", vol.VolumeID, rows[2].h.volume, nil)
	_, ghost403 := volumeCall(t, d.APIURL, "GET", "vol-nosuch", rows[2].h.volume, nil)
	if strings.ReplaceAll(ghost403, "vol-nosuch", vol.VolumeID) != theirs403 {
		t.Errorf("another team's volume: %s; an unknown one: %s", theirs403, ghost403)
	}

	// The refusals of known keys are in the audit log: who, what, which
	// sandbox or volume, the status; another team's says no more than its
	// answer did.
	entries, err := admin.Audit(ctx, "", 1000, 0)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, e := range entries {
		if strings.HasPrefix(e.Action, "sandbox proxy ") || strings.HasPrefix(e.Action, "volume content ") {
			seen[fmt.Sprintf("%s %s %s %d %s", e.KeyName, strings.Fields(e.Action)[0], e.TargetID, e.Status, e.Detail)] = true
		}
	}
	for _, want := range []string{
		"revoked sandbox " + sb.SandboxID + " 401 the API key that obtained this access token was revoked",
		"other sandbox " + sb.SandboxID + " 502 not found",
		"reader sandbox " + sb.SandboxID + " 403 the API key that obtained this access token (reader) lacks the scope sandboxes:write",
		"revoked volume " + vol.VolumeID + " 401 volume " + vol.VolumeID + ": the API key that obtained this access token was revoked",
		"other volume " + vol.VolumeID + " 403 not found",
	} {
		if !seen[want] {
			t.Errorf("audit log lacks %q; has %v", want, seen)
		}
	}

	t.Run("mcp", func(t *testing.T) {
		// No key and a revoked key: the endpoint refuses the request.
		for name, key := range map[string]string{"no key": "", "revoked": revokedKey.Key} {
			req, _ := http.NewRequest("POST", d.APIURL+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			if key != "" {
				req.Header.Set("Authorization", "Bearer "+key)
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode != http.StatusUnauthorized {
				t.Errorf("%s: %d, want 401", name, res.StatusCode)
			}
		}
		session := func(key string) *mcp.ClientSession {
			t.Helper()
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "matrix", Version: "0"}, nil).Connect(ctx,
				&mcp.StreamableClientTransport{Endpoint: d.APIURL + "/mcp", HTTPClient: daemontest.BearerClient(key)}, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cs.Close() })
			return cs
		}
		run := func(cs *mcp.ClientSession, id string) (*mcp.CallToolResult, error) {
			return cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_command", Arguments: map[string]any{"sandbox_id": id, "command": "cat /home/user/f"}})
		}
		text := func(res *mcp.CallToolResult) string {
			var b strings.Builder
			for _, c := range res.Content {
				if tc, ok := c.(*mcp.TextContent); ok {
					b.WriteString(tc.Text)
				}
			}
			return b.String()
		}
		// Another team: the sandbox is not found, as one that never existed.
		greenSession := session(otherKey.Key)
		res, err := run(greenSession, sb.SandboxID)
		if err != nil || !res.IsError {
			t.Fatalf("another team's run_command: %v %+v", err, res)
		}
		ghostRes, err := run(greenSession, ghost)
		if err != nil || strings.ReplaceAll(text(ghostRes), ghost, sb.SandboxID) != text(res) {
			t.Errorf("another team's sandbox: %q; one that never existed: %q (%v)", text(res), text(ghostRes), err)
		}
		// Read-only: no tool that writes, and calling one fails.
		ro := session(readerKey.Key)
		tools, err := ro.ListTools(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, tl := range tools.Tools {
			if tl.Name == "run_command" || tl.Name == "create_sandbox" {
				t.Errorf("a read-only key is offered %s", tl.Name)
			}
		}
		if res, err := run(ro, sb.SandboxID); err == nil && !res.IsError {
			t.Errorf("a read-only key ran a command: %s", text(res))
		}
		// Full: the command runs.
		res, err = run(session(fullKey.Key), sb.SandboxID)
		if err != nil || res.IsError || !strings.Contains(text(res), "blue's file") {
			t.Fatalf("full key's run_command: %v %s", err, text(res))
		}
	})

	t.Run("revocation reaches an open MCP session and the tokens it learnt", func(t *testing.T) {
		k, c := newKey("blue", "soon-revoked", all...)
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "matrix", Version: "0"}, nil).Connect(ctx,
			&mcp.StreamableClientTransport{Endpoint: d.APIURL + "/mcp", HTTPClient: daemontest.BearerClient(k.Key)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		args := map[string]any{"sandbox_id": sb.SandboxID, "command": "true"}
		if res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_command", Arguments: args}); err != nil || res.IsError {
			t.Fatalf("before revocation: %v %+v", err, res)
		}
		g, err := c.Get(ctx, sb.SandboxID)
		if err != nil {
			t.Fatal(err)
		}
		if err := admin.RevokeKey(ctx, k.ID); err != nil {
			t.Fatal(err)
		}
		if res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_command", Arguments: args}); err == nil && !res.IsError {
			t.Fatal("a revoked key's open MCP session still runs commands")
		}
		if code, body := proxyCall(t, d.SandboxURL, sb.SandboxID, "GET", "/files?path=/home/user/f", g.EnvdAccessToken, "", nil); code != 401 {
			t.Fatalf("the revoked key's grant after revocation: %d %s", code, body)
		}
	})
}

// proxyCall sends one request to a sandbox's envd through the proxy,
// routed by the E2b-Sandbox-* headers as the SDKs do without a domain.
func proxyCall(t *testing.T, sandboxURL, id, method, path, token, contentType string, body io.Reader) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, sandboxURL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", "49983")
	if token != "" {
		req.Header.Set(e2bwire.HeaderAccessToken, token)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
		req.Header.Set("Connect-Protocol-Version", "1")
	}
	return doCall(t, req)
}

// volumeCall reads or writes (over) the file f of a volume through the
// content API.
func volumeCall(t *testing.T, apiURL, method, volumeID, token string, body io.Reader) (int, string) {
	t.Helper()
	u := apiURL + "/volumecontent/" + volumeID + "/file?path=f"
	if method == "PUT" {
		u += "&force=true"
	}
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return doCall(t, req)
}

func doCall(t *testing.T, req *http.Request) (int, string) {
	t.Helper()
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(bytes.TrimSpace(b))
}

// TestTeamVolumesQuota: a team's volumesMB quota bounds its volumes' total
// size with 507, naming the limit and the use, and holds no other team back.
func TestTeamVolumesQuota(t *testing.T) {
	d := daemontest.Start(t, func(c *daemon.Config) {
		c.DiskQuota, c.DiskImageMB = true, 512
		c.Volumes = daemon.VolumeConfig{DefaultMB: 16, MaxMB: 32, PerKey: 8}
	})
	ctx := context.Background()
	admin := daemontest.Client(d, daemontest.Key)
	_, small := daemontest.TeamKey(t, d, "small", "vols")
	if _, err := admin.UpdateTeam(ctx, "small", e2bwire.TeamQuotas{VolumesMB: 20}); err != nil {
		t.Fatal(err)
	}
	if _, err := small.CreateVolume(ctx, "first", 16); err != nil {
		t.Fatal(err)
	}
	_, err := small.CreateVolume(ctx, "second", 16)
	var e *e2bclient.Error
	if !errors.As(err, &e) || e.Status != http.StatusInsufficientStorage || !strings.Contains(e.Message, "at most 20 MiB (16 MiB in use, 16 MiB asked)") {
		t.Fatalf("past the team's volumes quota: %v", err)
	}
	if _, err := small.CreateVolume(ctx, "small-one", 4); err != nil {
		t.Fatalf("within the quota: %v", err)
	}
	if _, err := admin.CreateVolume(ctx, "elsewhere", 32); err != nil {
		t.Fatalf("another team held back by small's quota: %v", err)
	}
}
