package testenv

import (
	"context"
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
	req := connect.NewRequest(&process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", cmd}},
	})
	req.Header().Set("X-Access-Token", accessToken)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := c.Start(ctx, req)
	if err != nil {
		t.Fatalf("start %q: %v", cmd, err)
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
			return out.String(), end.GetExitCode()
		}
	}
	t.Fatalf("%q: stream ended without an end event: %v", cmd, stream.Err())
	return "", 0
}
