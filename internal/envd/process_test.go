package envd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	pb "github.com/airlock-sandbox/airlock/api/gen/process"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

func TestStartOutputAndExit(t *testing.T) {
	e := newEnv(t)
	r := e.run(ctxTimeout(t, 20*time.Second), startReq(bash("echo hello; echo oops >&2")))
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.first != "start" || r.pid == 0 {
		t.Fatalf("first event %q pid %d, want start with a pid", r.first, r.pid)
	}
	if r.stdout != "hello\n" || r.stderr != "oops\n" {
		t.Fatalf("stdout %q stderr %q", r.stdout, r.stderr)
	}
	if r.end == nil || !r.end.GetExited() || r.end.GetExitCode() != 0 || r.end.GetStatus() != "exit status 0" || r.end.Error != nil {
		t.Fatalf("end = %v", r.end)
	}
}

func TestStartNonZeroExit(t *testing.T) {
	e := newEnv(t)
	r := e.run(ctxTimeout(t, 20*time.Second), startReq(bash("exit 3")))
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.end.GetExitCode() != 3 || !r.end.GetExited() || r.end.GetStatus() != "exit status 3" || r.end.GetError() != "exit status 3" {
		t.Fatalf("end = %v", r.end)
	}
}

func TestStartWireFormat(t *testing.T) {
	e := newEnv(t)
	out := e.rawStream(ctxTimeout(t, 20*time.Second), "/process.Process/Start",
		map[string]any{"process": map[string]any{"cmd": "/bin/bash", "args": []string{"-l", "-c", "printf hi"}}, "stdin": false}, nil)
	if out.status != 200 || len(out.msgs) < 3 {
		t.Fatalf("status %d msgs %v", out.status, out.msgs)
	}
	if _, ok := out.msgs[0]["event"].(map[string]any)["start"]; !ok {
		t.Fatalf("first message %v", out.msgs[0])
	}
	data := out.msgs[1]["event"].(map[string]any)["data"].(map[string]any)
	if data["stdout"] != "aGk=" {
		t.Fatalf("data %v", data)
	}
	end := out.msgs[len(out.msgs)-1]["event"].(map[string]any)["end"].(map[string]any)
	if end["exited"] != true || end["status"] != "exit status 0" {
		t.Fatalf("end %v", end)
	}
	if _, has := end["exitCode"]; has {
		t.Fatalf("exitCode 0 must be omitted: %v", end)
	}
	if out.endRaw != "{}" {
		t.Fatalf("end of stream %q", out.endRaw)
	}
}

func TestProcessEnvironmentAndUser(t *testing.T) {
	e := newEnv(t)
	req := startReq(&pb.ProcessConfig{
		Cmd:  "/bin/sh",
		Args: []string{"-c", `echo "$(id -u):$(id -g):$(id -G)"; echo "$HOME|$USER|$LOGNAME|$PWD"; echo "$E2B_SANDBOX|$E2B_SANDBOX_ID|$E2B_TEMPLATE_ID|$SANDBOX_LEVEL|$OVERRIDE_ME|$REQ"; test -n "$PATH" && echo path-ok`},
		Envs: map[string]string{"OVERRIDE_ME": "request", "REQ": "1"},
	})
	r := e.run(ctxTimeout(t, 20*time.Second), req)
	if r.err != nil {
		t.Fatal(r.err)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	want := []string{
		"1000:1000:1000 27",
		e.home + "|user|user|" + e.home,
		"true|sbxtest|base|yes|request|1",
		"path-ok",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got\n%s\nwant\n%s\nstderr %s", r.stdout, strings.Join(want, "\n"), r.stderr)
	}

	// Request envs are scoped to that one process.
	r = e.run(ctxTimeout(t, 20*time.Second), startReq(&pb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", `echo "[$REQ]"`}}))
	if r.stdout != "[]\n" {
		t.Fatalf("request env leaked: %q", r.stdout)
	}

	// An explicit user, and a relative cwd resolved against that user's home.
	must(t, mkdir(e.rhome+"/sub"))
	req = withUser(startReq(&pb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", `id -u; pwd`}, Cwd: proto.String("sub")}), "root")
	r = e.run(ctxTimeout(t, 20*time.Second), req)
	if r.stdout != "0\n"+e.rhome+"/sub\n" {
		t.Fatalf("root run: %q %q %v", r.stdout, r.stderr, r.err)
	}

	// PATH lookup of a bare command name.
	r = e.run(ctxTimeout(t, 20*time.Second), startReq(&pb.ProcessConfig{Cmd: "echo", Args: []string{"bare"}}))
	if r.stdout != "bare\n" {
		t.Fatalf("bare command: %q %v", r.stdout, r.err)
	}
}

func mkdir(p string) error { return syscallMkdir(p) }

func syscallMkdir(p string) error {
	if err := syscall.Mkdir(p, 0o755); err != nil && !errors.Is(err, syscall.EEXIST) {
		return err
	}
	return nil
}

func TestStartErrors(t *testing.T) {
	e := newEnv(t)
	ctx := ctxTimeout(t, 20*time.Second)

	r := e.run(ctx, startReq(&pb.ProcessConfig{Cmd: "/bin/true", Cwd: proto.String("/definitely/missing")}))
	if codeOf(r.err) != connect.CodeInvalidArgument || !contains(r.err.Error(), "cwd '/definitely/missing' does not exist") {
		t.Fatalf("bad cwd: %v", r.err)
	}
	r = e.run(ctx, withUser(startReq(bash("true")), "ghost"))
	if codeOf(r.err) != connect.CodeUnauthenticated {
		t.Fatalf("unknown user: %v", r.err)
	}
	r = e.run(ctx, startReq(&pb.ProcessConfig{Cmd: "/no/such/binary"}))
	if codeOf(r.err) != connect.CodeInvalidArgument {
		t.Fatalf("missing binary: %v", r.err)
	}
	r = e.run(ctx, startReq(&pb.ProcessConfig{Cmd: "no-such-command-anywhere"}))
	if codeOf(r.err) != connect.CodeInvalidArgument {
		t.Fatalf("missing command: %v", r.err)
	}
	r = e.run(ctx, startReq(nil))
	if codeOf(r.err) != connect.CodeInvalidArgument {
		t.Fatalf("no process: %v", r.err)
	}
}

func TestStartTimeoutKillsProcess(t *testing.T) {
	e := newEnv(t)
	// The header alone (no client deadline) must end the stream server-side.
	start := time.Now()
	out := e.rawStream(ctxTimeout(t, 20*time.Second), "/process.Process/Start",
		map[string]any{"process": map[string]any{"cmd": "/bin/sh", "args": []string{"-c", "sleep 30"}}, "stdin": false},
		map[string]string{"Connect-Timeout-Ms": "300"})
	if time.Since(start) > 10*time.Second {
		t.Fatalf("timeout took %v", time.Since(start))
	}
	if !contains(out.endRaw, `"deadline_exceeded"`) {
		t.Fatalf("end of stream %q", out.endRaw)
	}
	pid := uint32(out.msgs[0]["event"].(map[string]any)["start"].(map[string]any)["pid"].(float64))
	testenv.Eventually(t, 5*time.Second, "the timed-out process to die", func() bool {
		return processGone(int(pid))
	})

	// The generated client maps it to deadline_exceeded too.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	r := e.run(ctx, startReq(bash("sleep 30")))
	if codeOf(r.err) != connect.CodeDeadlineExceeded {
		t.Fatalf("client timeout: %v", r.err)
	}
}

func TestLifetimeLimitOutlivesDisconnect(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	req := startReq(bash("sleep 30"))
	req.Header().Set("Connect-Timeout-Ms", "700")
	stream, err := e.proc.Start(ctx, req)
	must(t, err)
	if !stream.Receive() {
		t.Fatal(stream.Err())
	}
	pid := stream.Msg().GetEvent().GetStart().GetPid()
	cancel()
	stream.Close()
	// Detaching does not kill the process...
	time.Sleep(200 * time.Millisecond)
	if processGone(int(pid)) {
		t.Fatal("process died when the client detached")
	}
	// ...but its lifetime limit still does.
	testenv.Eventually(t, 5*time.Second, "the lifetime limit to kill the process", func() bool {
		return processGone(int(pid))
	})
}

func TestKeepalive(t *testing.T) {
	e := newEnv(t)
	out := e.rawStream(ctxTimeout(t, 20*time.Second), "/process.Process/Start",
		map[string]any{"process": map[string]any{"cmd": "/bin/sh", "args": []string{"-c", "sleep 1.3"}}, "stdin": false},
		map[string]string{"Keepalive-Ping-Interval": "1"})
	found := false
	for _, m := range out.msgs {
		if _, ok := m["event"].(map[string]any)["keepalive"]; ok {
			found = true
		}
	}
	if !found || out.endRaw != "{}" {
		t.Fatalf("no keepalive in %v (end %q)", out.msgs, out.endRaw)
	}
}

func TestStdinSendInputCloseStdin(t *testing.T) {
	e := newEnv(t)
	ctx := ctxTimeout(t, 20*time.Second)
	yes := true
	stream, err := e.proc.Start(ctx, connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/cat"}, Stdin: &yes}))
	must(t, err)
	defer stream.Close()
	if !stream.Receive() {
		t.Fatal(stream.Err())
	}
	pid := stream.Msg().GetEvent().GetStart().GetPid()
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
	_, err = e.proc.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: sel, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("hello stdin\n")}}}))
	must(t, err)
	_, err = e.proc.CloseStdin(ctx, connect.NewRequest(&pb.CloseStdinRequest{Process: sel}))
	must(t, err)
	r := collect(stream)
	if r.stdout != "hello stdin\n" || r.end.GetExitCode() != 0 {
		t.Fatalf("stdout %q end %v err %v", r.stdout, r.end, r.err)
	}

	// stdin: false means /dev/null and no input.
	stream2, err := e.proc.Start(ctx, startReq(bash("sleep 5")))
	must(t, err)
	defer stream2.Close()
	if !stream2.Receive() {
		t.Fatal(stream2.Err())
	}
	sel2 := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: stream2.Msg().GetEvent().GetStart().GetPid()}}
	_, err = e.proc.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: sel2, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("x")}}}))
	if codeOf(err) != connect.CodeFailedPrecondition || !contains(err.Error(), "stdin not enabled or closed") {
		t.Fatalf("input without stdin: %v", err)
	}
	_, err = e.proc.Update(ctx, connect.NewRequest(&pb.UpdateRequest{Process: sel2, Pty: &pb.PTY{Size: &pb.PTY_Size{Cols: 10, Rows: 10}}}))
	if codeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("resize without pty: %v", err)
	}
	_, err = e.proc.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{Process: sel2, Signal: pb.Signal_SIGNAL_SIGKILL}))
	must(t, err)
}

func TestPTY(t *testing.T) {
	e := newEnv(t)
	ctx := ctxTimeout(t, 20*time.Second)
	req := connect.NewRequest(&pb.StartRequest{
		Process: &pb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", `stty size; read a; stty size; echo "got:$a"; tty >/dev/null && echo is-tty`},
			Envs: map[string]string{"TERM": "xterm-256color"}},
		Pty: &pb.PTY{Size: &pb.PTY_Size{Cols: 100, Rows: 30}},
	})
	stream, err := e.proc.Start(ctx, req)
	must(t, err)
	defer stream.Close()
	if !stream.Receive() {
		t.Fatal(stream.Err())
	}
	pid := stream.Msg().GetEvent().GetStart().GetPid()
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
	var out strings.Builder
	waitFor := func(s string) {
		for !strings.Contains(out.String(), s) {
			if !stream.Receive() {
				t.Fatalf("stream ended before %q; output %q err %v", s, out.String(), stream.Err())
			}
			if d := stream.Msg().GetEvent().GetData(); d != nil {
				if len(d.GetStdout()) > 0 {
					t.Fatal("pty output must travel in the pty field")
				}
				out.Write(d.GetPty())
			}
		}
	}
	waitFor("30 100")
	_, err = e.proc.Update(ctx, connect.NewRequest(&pb.UpdateRequest{Process: sel, Pty: &pb.PTY{Size: &pb.PTY_Size{Cols: 120, Rows: 40}}}))
	must(t, err)
	_, err = e.proc.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: sel, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Pty{Pty: []byte("abc\n")}}}))
	must(t, err)
	waitFor("is-tty")
	if !strings.Contains(out.String(), "40 120") || !strings.Contains(out.String(), "got:abc") {
		t.Fatalf("pty output %q", out.String())
	}
	_, err = e.proc.CloseStdin(ctx, connect.NewRequest(&pb.CloseStdinRequest{Process: sel}))
	if err == nil {
		// The process may already have exited (not_found); either is an error.
		t.Fatal("CloseStdin on a pty must fail")
	}
	r := collect(stream)
	if r.end == nil || r.end.GetExitCode() != 0 {
		t.Fatalf("end %v err %v", r.end, r.err)
	}
}

func TestConnectListAndTags(t *testing.T) {
	e := newEnv(t)
	ctx := ctxTimeout(t, 20*time.Second)
	yes := true
	startCtx, cancelStart := context.WithCancel(ctx)
	stream, err := e.proc.Start(startCtx, connect.NewRequest(&pb.StartRequest{
		Process: &pb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", `echo before; read x; echo "after:$x"; exit 7`}},
		Stdin:   &yes,
		Tag:     proto.String("worker"),
	}))
	must(t, err)
	if !stream.Receive() {
		t.Fatal(stream.Err())
	}
	pid := stream.Msg().GetEvent().GetStart().GetPid()
	// Wait for the first output so that Connect provably receives only new output.
	for stream.Receive() {
		if len(stream.Msg().GetEvent().GetData().GetStdout()) > 0 {
			break
		}
	}
	// Detach: the process must keep running.
	cancelStart()
	stream.Close()

	list, err := e.proc.List(ctx, connect.NewRequest(&pb.ListRequest{}))
	must(t, err)
	if len(list.Msg.GetProcesses()) != 1 {
		t.Fatalf("list = %v", list.Msg)
	}
	info := list.Msg.GetProcesses()[0]
	if info.GetPid() != pid || info.GetTag() != "worker" || info.GetConfig().GetCmd() != "/bin/sh" {
		t.Fatalf("list entry %v", info)
	}

	byTag := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Tag{Tag: "worker"}}
	cstream, err := e.proc.Connect(ctx, connect.NewRequest(&pb.ConnectRequest{Process: byTag}))
	must(t, err)
	defer cstream.Close()
	if !cstream.Receive() || cstream.Msg().GetEvent().GetStart().GetPid() != pid {
		t.Fatalf("connect start: %v %v", cstream.Msg(), cstream.Err())
	}
	// A second subscriber sees the same output.
	cstream2, err := e.proc.Connect(ctx, connect.NewRequest(&pb.ConnectRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}}))
	must(t, err)
	defer cstream2.Close()
	if !cstream2.Receive() {
		t.Fatal(cstream2.Err())
	}
	_, err = e.proc.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: byTag, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("42\n")}}}))
	must(t, err)
	for i, s := range []interface {
		Receive() bool
		Msg() *pb.ConnectResponse
		Err() error
	}{cstream, cstream2} {
		r := collect(s)
		if r.stdout != "after:42\n" || r.end.GetExitCode() != 7 || r.end.GetError() != "exit status 7" {
			t.Fatalf("connect %d: stdout %q end %v err %v", i, r.stdout, r.end, r.err)
		}
	}

	// Exited processes are not listed but stay connectable for a while.
	list, err = e.proc.List(ctx, connect.NewRequest(&pb.ListRequest{}))
	must(t, err)
	if len(list.Msg.GetProcesses()) != 0 {
		t.Fatalf("exited process still listed: %v", list.Msg)
	}
	late, err := e.proc.Connect(ctx, connect.NewRequest(&pb.ConnectRequest{Process: byTag}))
	must(t, err)
	r := collect(late)
	if r.first != "start" || r.pid != pid || r.end.GetExitCode() != 7 || r.stdout != "" {
		t.Fatalf("late connect %+v", r)
	}

	_, err = e.proc.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{Process: byTag, Signal: pb.Signal_SIGNAL_SIGKILL}))
	if codeOf(err) != connect.CodeNotFound {
		t.Fatalf("signal to exited process: %v", err)
	}
	missing, err := e.proc.Connect(ctx, connect.NewRequest(&pb.ConnectRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: 999999}}}))
	if err == nil {
		r = collect(missing)
		err = r.err
	}
	if codeOf(err) != connect.CodeNotFound || !contains(err.Error(), "process with pid 999999 not found") {
		t.Fatalf("connect to unknown pid: %v", err)
	}
}

func TestSendSignal(t *testing.T) {
	e := newEnv(t)
	ctx := ctxTimeout(t, 20*time.Second)
	// The child sleep is in the shell's process group, so SIGKILL must reach it too.
	stream, err := e.proc.Start(ctx, startReq(bash(`sleep 30 & echo $!; wait`)))
	must(t, err)
	defer stream.Close()
	if !stream.Receive() {
		t.Fatal(stream.Err())
	}
	pid := stream.Msg().GetEvent().GetStart().GetPid()
	var childPid int
	for stream.Receive() {
		if out := stream.Msg().GetEvent().GetData().GetStdout(); len(out) > 0 {
			_, _ = fmt.Sscan(strings.TrimSpace(string(out)), &childPid)
			break
		}
	}
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
	_, err = e.proc.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{Process: sel, Signal: pb.Signal_SIGNAL_UNSPECIFIED}))
	if codeOf(err) != connect.CodeUnimplemented {
		t.Fatalf("unsupported signal: %v", err)
	}
	_, err = e.proc.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{Process: sel, Signal: pb.Signal_SIGNAL_SIGKILL}))
	must(t, err)
	r := collect(stream)
	if r.end == nil || r.end.GetExitCode() != -1 || r.end.GetExited() || r.end.GetStatus() != "signal: killed" || r.end.GetError() != "signal: killed" {
		t.Fatalf("end %v err %v", r.end, r.err)
	}
	if childPid > 0 {
		testenv.Eventually(t, 5*time.Second, "the background child to die", func() bool {
			return processGone(childPid)
		})
	}
	_, err = e.proc.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: 999999}}, Signal: pb.Signal_SIGNAL_SIGTERM}))
	if codeOf(err) != connect.CodeNotFound {
		t.Fatalf("unknown pid: %v", err)
	}
}

// A background grandchild that keeps stdout open must not hold back the end event.
func TestBackgroundChildDoesNotBlockEnd(t *testing.T) {
	e := newEnv(t)
	start := time.Now()
	r := e.run(ctxTimeout(t, 20*time.Second), startReq(bash("sleep 5 & echo started")))
	if r.err != nil || r.stdout != "started\n" || r.end.GetExitCode() != 0 {
		t.Fatalf("%+v", r)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("end waited for the background child: %v", d)
	}
}

func TestStreamInput(t *testing.T) {
	e := newEnv(t)
	ctx := ctxTimeout(t, 20*time.Second)
	// Client streaming works over HTTP/1.1 as long as the request body streams.
	yes := true
	stream, err := e.proc.Start(ctx, connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/cat"}, Stdin: &yes}))
	must(t, err)
	defer stream.Close()
	if !stream.Receive() {
		t.Fatal(stream.Err())
	}
	pid := stream.Msg().GetEvent().GetStart().GetPid()
	in := e.proc.StreamInput(ctx)
	must(t, in.Send(&pb.StreamInputRequest{Event: &pb.StreamInputRequest_Start{Start: &pb.StreamInputRequest_StartEvent{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}}}}))
	must(t, in.Send(&pb.StreamInputRequest{Event: &pb.StreamInputRequest_Keepalive{Keepalive: &pb.StreamInputRequest_KeepAlive{}}}))
	must(t, in.Send(&pb.StreamInputRequest{Event: &pb.StreamInputRequest_Data{Data: &pb.StreamInputRequest_DataEvent{Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("streamed\n")}}}}}))
	_, err = in.CloseAndReceive()
	must(t, err)
	_, err = e.proc.CloseStdin(ctx, connect.NewRequest(&pb.CloseStdinRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}}))
	must(t, err)
	r := collect(stream)
	if r.stdout != "streamed\n" {
		t.Fatalf("stdout %q err %v", r.stdout, r.err)
	}
}

// A process flooding stdout at a client that never reads must neither block nor
// make envd buffer without bound.
func TestOutputFloodDoesNotBlockOrBalloon(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const total = 128 << 20
	stream, err := e.proc.Start(ctx, startReq(&pb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "head -c 134217728 /dev/zero"}}))
	must(t, err)
	defer stream.Close()
	if !stream.Receive() {
		t.Fatal(stream.Err())
	}
	pid := stream.Msg().GetEvent().GetStart().GetPid()
	// Never read again. The process must still finish.
	var peak uint64
	deadline := time.Now().Add(30 * time.Second)
	for {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		peak = max(peak, ms.HeapInuse)
		p, err := e.srv.procs.find(&pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}, true)
		if err == nil && !p.running() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("flooding process blocked behind a client that does not read")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if peak > 96<<20 {
		t.Fatalf("heap in use peaked at %d MiB while %d MiB were written", peak>>20, total>>20)
	}
	t.Logf("peak heap in use %d MiB for %d MiB of output", peak>>20, total>>20)
}

func TestOutputChunkLimit(t *testing.T) {
	e := newEnv(t)
	stream, err := e.proc.Start(ctxTimeout(t, 20*time.Second), startReq(&pb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "head -c 1000000 /dev/zero"}}))
	must(t, err)
	defer stream.Close()
	n := 0
	for stream.Receive() {
		d := stream.Msg().GetEvent().GetData()
		if len(d.GetStdout()) > maxPipeChunk {
			t.Fatalf("chunk of %d bytes", len(d.GetStdout()))
		}
		n += len(d.GetStdout())
	}
	if n != 1000000 {
		t.Fatalf("received %d bytes", n)
	}
}

// processGone treats zombies as gone: on the test host, orphans are reaped by
// whatever init the machine has, on its own schedule.
func processGone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	_, after, ok := strings.Cut(string(b), ") ")
	return ok && strings.HasPrefix(after, "Z")
}

// A client that reads more slowly than the process writes still receives every
// byte: the process is throttled, not truncated.
func TestSlowReaderGetsEverything(t *testing.T) {
	e := newEnv(t)
	const size = 12 << 20
	stream, err := e.proc.Start(ctxTimeout(t, 30*time.Second), startReq(&pb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "head -c 12582912 /dev/zero"}}))
	must(t, err)
	defer stream.Close()
	n, msgs := 0, 0
	var end *pb.ProcessEvent_EndEvent
	for stream.Receive() {
		if d := stream.Msg().GetEvent().GetData(); d != nil {
			n += len(d.GetStdout())
			msgs++
			if msgs%8 == 0 {
				time.Sleep(2 * time.Millisecond)
			}
		}
		if en := stream.Msg().GetEvent().GetEnd(); en != nil {
			end = en
		}
	}
	must(t, stream.Err())
	if n != size || end.GetExitCode() != 0 {
		t.Fatalf("received %d of %d bytes, end %v", n, size, end)
	}
}

// TestStalledClientIsToldOutputWasDropped stops reading a flood of output for
// longer than subscriberStall: the process must not be held up, and the end
// event must say that (and how much) output was lost, with the real exit code.
func TestStalledClientIsToldOutputWasDropped(t *testing.T) {
	e := newEnv(t)
	ctx := ctxTimeout(t, 60*time.Second)
	stream, err := e.proc.Start(ctx, startReq(bash("head -c 64M /dev/zero; echo done >&2")))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	if !stream.Receive() {
		t.Fatalf("no start event: %v", stream.Err())
	}
	time.Sleep(subscriberStall + 2*time.Second)
	r := collect(stream)
	if r.err != nil {
		t.Fatalf("stream: %v", r.err)
	}
	if r.end == nil || r.end.GetExitCode() != 0 {
		t.Fatalf("end = %v, want exit 0", r.end)
	}
	if len(r.stdout) >= 64<<20 {
		t.Fatalf("all %d bytes arrived although the client stalled; the test did not stall it", len(r.stdout))
	}
	if !strings.Contains(r.end.GetError(), "output incomplete:") || !strings.Contains(r.end.GetError(), "stopped reading for more than 2s") {
		t.Fatalf("end error = %q, want a notice that output was dropped", r.end.GetError())
	}
}

// TestUnread: the bytes waiting in a pipe for its reader are counted (what
// keeps a process's end event waiting for output its readers have not
// taken yet), and reading them empties the count.
func TestUnread(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if n := unread([]*os.File{r}); n != 0 {
		t.Fatalf("an empty pipe: %d", n)
	}
	if _, err := w.Write([]byte("err-line\n")); err != nil {
		t.Fatal(err)
	}
	if n := unread([]*os.File{r, r}); n != 18 {
		t.Fatalf("9 bytes in a pipe, counted twice: %d", n)
	}
	buf := make([]byte, 64)
	if n, err := r.Read(buf); err != nil || string(buf[:n]) != "err-line\n" {
		t.Fatalf("read after counting: %q %v", buf[:n], err)
	}
	if n := unread([]*os.File{r}); n != 0 {
		t.Fatalf("after reading: %d", n)
	}
}
