package envd

import (
	"context"
	"os/exec"
	"testing"

	"connectrpc.com/connect"

	fspb "github.com/airlock-sandbox/airlock/api/gen/filesystem"
	pb "github.com/airlock-sandbox/airlock/api/gen/process"
)

// envd's share of a command round trip (Start over Connect JSON and HTTP/1.1,
// process start, output, end), against plain fork+exec of the same command
// measured in the same run.

func BenchmarkForkExecEcho(b *testing.B) {
	for b.Loop() {
		if out, err := exec.Command("/bin/echo", "hi").Output(); err != nil || string(out) != "hi\n" {
			b.Fatal(err)
		}
	}
}

func BenchmarkStartEcho(b *testing.B) {
	e := newEnv(b)
	ctx := context.Background()
	for b.Loop() {
		r := e.run(ctx, withUser(startReq(&pb.ProcessConfig{Cmd: "/bin/echo", Args: []string{"hi"}}), "root"))
		if r.err != nil || r.stdout != "hi\n" {
			b.Fatalf("%+v", r)
		}
	}
}

func BenchmarkStatRPC(b *testing.B) {
	e := newEnv(b)
	ctx := context.Background()
	for b.Loop() {
		if _, err := e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "~"})); err != nil {
			b.Fatal(err)
		}
	}
}
