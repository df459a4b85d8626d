package interp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// The stdlib-only Python driver (py/airlock_driver.py): requests as JSON lines on stdin, events
// as JSON lines on fd 3. The process's fd 1/2 (raw output of os.system, subprocesses, C code)
// are forwarded as stdout/stderr of the running execution; the driver ends each cell's raw
// output with a per-kernel random sentinel line on both, so nothing is attributed to the
// wrong execution.

const driverInterruptGrace = 5 * time.Second

type driverEvent struct {
	Type           string         `json:"type"`
	Name           string         `json:"name"`
	Text           string         `json:"text"`
	Data           map[string]any `json:"data"`
	Ename          string         `json:"ename"`
	Evalue         string         `json:"evalue"`
	Traceback      []string       `json:"traceback"`
	ExecutionCount int            `json:"execution_count"`
}

type rawChunk struct {
	stream   string // "stdout" or "stderr"
	text     string
	sentinel bool // the end-of-cell mark for this stream
}

type driverKernel struct {
	cmd      *exec.Cmd
	waitDone chan struct{}
	stdin    io.WriteCloser
	events   chan driverEvent
	raw      chan rawChunk
	active   atomic.Bool // an Execute is consuming raw output; otherwise it is dropped
	// stale counts cells abandoned after an interrupt that did not stop them: their output
	// and end marks are still to come and belong to no execution (used by Execute only).
	stale  int
	output *tailBuffer // stderr seen outside executions (start-up failures)

	dead      chan struct{}
	deadOnce  sync.Once
	deadErr   error
	closeOnce sync.Once
	closeErr  error
}

// StartPythonDriver starts the stdlib-only driver.
func StartPythonDriver(ctx context.Context, opts Options) (_ Kernel, err error) {
	python, err := findPython()
	if err != nil {
		return nil, err
	}
	if err := writePyAssets(opts, "airlock_charts.py", "airlock_results.py", "airlock_driver.py"); err != nil {
		return nil, err
	}
	sentinel := "\x1eairlock-done-" + randomHex(8) + "\x1e"
	cmd := kernelCmd(opts, []string{python, "-X", "frozen_modules=off", opts.RunDir + "/airlock_driver.py"},
		"AIRLOCK_DRIVER_SENTINEL="+sentinel)
	evR, evW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("events pipe: %w", err)
	}
	defer func() {
		if evR != nil {
			evR.Close()
		}
	}()
	defer evW.Close()
	cmd.ExtraFiles = []*os.File{evW}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("stdin pipe: %w", err)
	}
	// Plain pipes rather than cmd.StdoutPipe: cmd.Wait must not wait for (or close) them, so
	// the driver's exit is seen at once even if a grandchild keeps them open.
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("stdout pipe: %w", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, fmt.Errorf("stderr pipe: %w", err)
	}
	defer outW.Close()
	defer errW.Close()
	cmd.Stdout, cmd.Stderr = outW, errW
	k := &driverKernel{
		cmd: cmd, waitDone: make(chan struct{}), stdin: stdin,
		events: make(chan driverEvent, 256), raw: make(chan rawChunk, 256),
		output: &tailBuffer{max: 8 << 10}, dead: make(chan struct{}),
	}
	if err := startKernel(cmd); err != nil {
		outR.Close()
		errR.Close()
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("start python driver: %w: %w", ErrUnavailable, err)
		}
		return nil, fmt.Errorf("start python driver: %w", err)
	}
	evW.Close()
	outW.Close()
	errW.Close()
	events := evR
	evR = nil // owned by the reader now
	sent := []byte(sentinel + "\n")
	go func() { defer outR.Close(); k.readRaw(outR, "stdout", sent) }()
	go func() { defer errR.Close(); k.readRaw(errR, "stderr", sent) }()
	go k.readEvents(events)
	go func() {
		werr := cmd.Wait()
		close(k.waitDone)
		k.markDead(fmt.Errorf("driver process exited (%v)", werr))
	}()
	defer func() {
		if err != nil {
			k.Close()
		}
	}()
	select {
	case ev := <-k.events:
		if ev.Type != "ready" {
			return nil, fmt.Errorf("python driver: unexpected first event %q", ev.Type)
		}
	case <-k.dead:
		return nil, k.diedErr()
	case <-ctx.Done():
		return nil, fmt.Errorf("start python driver: %w", ctx.Err())
	}
	return k, nil
}

func (k *driverKernel) readEvents(f *os.File) {
	defer f.Close()
	r := bufio.NewReaderSize(f, 64<<10)
	for {
		line, err := r.ReadBytes('\n')
		if len(line) > 0 {
			var ev driverEvent
			if json.Unmarshal(line, &ev) == nil {
				k.events <- ev
			}
		}
		if err != nil {
			// EOF: the driver is gone (its fd 3 closes only when it exits).
			k.markDead(errors.New("driver event stream closed"))
			return
		}
	}
}

// readRaw forwards a raw output pipe, splitting it at sentinels.
func (k *driverKernel) readRaw(r io.Reader, stream string, sentinel []byte) {
	buf := make([]byte, 32<<10)
	var pending []byte
	for {
		n, err := r.Read(buf)
		pending = append(pending, buf[:n]...)
		for {
			i := bytes.Index(pending, sentinel)
			if i < 0 {
				break
			}
			k.deliverRaw(rawChunk{stream: stream, text: string(pending[:i])})
			k.deliverRaw(rawChunk{stream: stream, sentinel: true})
			pending = pending[i+len(sentinel):]
		}
		// Keep a tail that might be the start of a sentinel split across reads.
		keep := 0
		for l := min(len(sentinel)-1, len(pending)); l > 0; l-- {
			if bytes.HasSuffix(pending, sentinel[:l]) {
				keep = l
				break
			}
		}
		if len(pending) > keep {
			k.deliverRaw(rawChunk{stream: stream, text: string(pending[:len(pending)-keep])})
			pending = append([]byte(nil), pending[len(pending)-keep:]...)
		}
		if err != nil {
			return
		}
	}
}

func (k *driverKernel) deliverRaw(c rawChunk) {
	if c.text == "" && !c.sentinel {
		return
	}
	if !k.active.Load() && !c.sentinel { // sentinels are never dropped: Execute counts them
		if c.stream == "stderr" {
			k.output.Write([]byte(c.text)) // start-up errors, output of background processes
		}
		return
	}
	select {
	case k.raw <- c:
	case <-k.dead:
	}
}

func (k *driverKernel) markDead(err error) {
	k.deadOnce.Do(func() {
		k.deadErr = err
		close(k.dead)
	})
}

func (k *driverKernel) diedErr() error {
	out := strings.TrimSpace(k.output.String())
	if out != "" {
		return fmt.Errorf("python driver %w: %v; output: %s", ErrKernelDied, k.deadErr, out)
	}
	return fmt.Errorf("python driver %w: %v", ErrKernelDied, k.deadErr)
}

func (k *driverKernel) Execute(ctx context.Context, code string, env map[string]string, emit func(Event)) (int, error) {
	select {
	case <-k.dead:
		return 0, k.diedErr()
	default:
	}
	req, err := json.Marshal(map[string]any{"code": code, "env": env})
	if err != nil {
		return 0, fmt.Errorf("encode request: %w", err)
	}
	k.active.Store(true)
	defer k.active.Store(false)
	if _, err := k.stdin.Write(append(req, '\n')); err != nil {
		return 0, fmt.Errorf("python driver %w: write request: %w", ErrKernelDied, err)
	}
	var (
		done, outEnd, errEnd bool
		count                int
		ctxDone              = ctx.Done()
		interruptErr         error
		grace                <-chan time.Time
		resignal             *time.Ticker
		resignalC            <-chan time.Time
	)
	defer func() {
		if resignal != nil {
			resignal.Stop()
		}
	}()
	out := func(ev Event) {
		if interruptErr == nil { // after ctx ended the client is gone: drain, don't emit
			emit(ev)
		}
	}
	skipDone, skipOut, skipErr := k.stale, k.stale, k.stale
	k.stale = 0
	for !done || !outEnd || !errEnd {
		select {
		case ev := <-k.events:
			if skipDone > 0 {
				if ev.Type == "done" {
					skipDone--
				}
				continue
			}
			switch ev.Type {
			case "stream":
				name := "stdout"
				if ev.Name == "stderr" {
					name = "stderr"
				}
				out(Event{Type: name, Text: ev.Text})
			case "display_data", "execute_result":
				out(Event{Type: "result", Data: ev.Data, IsMainResult: ev.Type == "execute_result"})
			case "error":
				out(Event{Type: "error", Error: &ExecError{Name: ev.Ename, Value: ev.Evalue, Traceback: strings.Join(ev.Traceback, "\n")}})
			case "done":
				done, count = true, ev.ExecutionCount
			}
		case c := <-k.raw:
			switch {
			case c.sentinel && c.stream == "stdout" && skipOut > 0:
				skipOut--
			case c.sentinel && c.stream == "stderr" && skipErr > 0:
				skipErr--
			case skipOut > 0 && c.stream == "stdout", skipErr > 0 && c.stream == "stderr":
				// output of an abandoned cell
			case c.sentinel && c.stream == "stdout":
				outEnd = true
			case c.sentinel:
				errEnd = true
			default:
				out(Event{Type: c.stream, Text: c.text})
			}
		case <-ctxDone:
			interruptErr = ctx.Err()
			ctxDone = nil
			k.interrupt()
			grace = time.After(driverInterruptGrace)
			resignal = time.NewTicker(time.Second)
			resignalC = resignal.C
		case <-resignalC:
			k.interrupt()
		case <-grace:
			// The cell ignores interrupts: give up waiting, and have the next Execute skip
			// this cell's remaining output (the driver runs it first anyway).
			k.stale = 1 + max(skipDone, skipOut, skipErr)
			return 0, fmt.Errorf("python driver did not stop after interrupt: %w", interruptErr)
		case <-k.dead:
			return 0, k.diedErr()
		}
	}
	if interruptErr != nil {
		return count, interruptErr
	}
	return count, nil
}

// interrupt sends SIGINT to the driver's process group: KeyboardInterrupt in the cell, and
// the cell's child processes get it as they would from a terminal's ^C.
func (k *driverKernel) interrupt() {
	_ = syscall.Kill(-k.cmd.Process.Pid, syscall.SIGINT)
}

func (k *driverKernel) Close() error {
	k.closeOnce.Do(func() {
		k.markDead(errors.New("kernel closed"))
		k.stdin.Close()
		k.closeErr = killGroup(k.cmd, k.waitDone)
	})
	return k.closeErr
}
