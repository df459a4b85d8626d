package testenv

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/api/gen/process"
	"github.com/airlock-sandbox/airlock/api/gen/process/processconnect"
)

// RunCommand runs cmd in a sandbox through envd's process API, the way the SDK's
// commands.run does (`/bin/bash -l -c cmd` as the template's default user), and
// returns its combined output and exit code.
func RunCommand(t testing.TB, tr http.RoundTripper, accessToken, cmd string) (string, int32) {
	t.Helper()
	c := processconnect.NewProcessClient(&http.Client{Transport: tr}, "http://envd", connect.WithProtoJSON())
	out, code, err := Exec(c, accessToken, "", []string{"/bin/bash", "-l", "-c", cmd}, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return out, code
}

// Exec runs args through envd's process API with c, as user ("" is the
// sandbox's default user), within limit, and returns the combined output and
// the exit code, or what failed; it may be called from any goroutine.
func Exec(c processconnect.ProcessClient, accessToken, user string, args []string, limit time.Duration) (string, int32, error) {
	req := connect.NewRequest(&process.StartRequest{
		Process: &process.ProcessConfig{Cmd: args[0], Args: args[1:]},
	})
	req.Header().Set("X-Access-Token", accessToken)
	what := fmt.Sprintf("%q", args)
	if user != "" {
		req.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
		what += " as " + user
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	stream, err := c.Start(ctx, req)
	if err != nil {
		return "", 0, fmt.Errorf("start %s: %w", what, err)
	}
	defer stream.Close()
	var out strings.Builder
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if d := ev.GetData(); d != nil {
			out.Write(d.GetStdout())
			out.Write(d.GetStderr())
		}
		if end := ev.GetEnd(); end != nil {
			return out.String(), end.GetExitCode(), nil
		}
	}
	return "", 0, fmt.Errorf("%s: stream ended without an end event: %w; output: %s", what, stream.Err(), out.String())
}
