package daemon

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The E2B build API against a real server, for what only a real server
// shows: a build the server was killed during ends as an error after the
// restart (never stuck in "building"), its build sandbox does not outlive
// it, and its name is free again; a cancelled build stops at once and
// leaves no build sandbox; another API key neither sees nor cancels it.

const otherServeKey = "e2b_servetestother000000000000000000000000"

// apiCall sends one JSON request to the server's API as key and decodes
// the answer into out (when not nil); it returns the status code.
func (h *host) apiCall(key, method, path string, body, out any) int {
	h.t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			h.t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, h.srv.api+path, rd)
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("X-API-KEY", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode < 300 {
		if err := json.Unmarshal(data, out); err != nil {
			h.t.Fatalf("%s %s: %v: %s", method, path, err, data)
		}
	}
	return resp.StatusCode
}

type buildIDs struct{ TemplateID, BuildID string }

type buildStatus struct {
	Status string
	Logs   []string
	Reason *struct{ Message string }
}

// startSleepBuild asks for a build of name whose one RUN step sleeps until
// killed, and waits until that step runs; it returns the ids and the pid
// of the step's sleep (found by its unique argument).
func (h *host) startSleepBuild(name string) (buildIDs, int) {
	h.t.Helper()
	var ids buildIDs
	if code := h.apiCall(serveKey, "POST", "/v3/templates", map[string]any{"name": name}, &ids); code != http.StatusAccepted {
		h.t.Fatalf("request build: %d", code)
	}
	nonce := fmt.Sprintf("%d.%d", 3000+time.Now().UnixNano()%1000, time.Now().UnixNano()%997)
	spec := map[string]any{"fromTemplate": "base", "steps": []map[string]any{
		{"type": "RUN", "args": []string{"sleep " + nonce}},
	}}
	if code := h.apiCall(serveKey, "POST", "/v2/templates/"+ids.TemplateID+"/builds/"+ids.BuildID, spec, nil); code != http.StatusAccepted {
		h.t.Fatalf("start build: %d", code)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		if pid := findProcess("sleep " + nonce); pid > 0 {
			return ids, pid
		}
		time.Sleep(100 * time.Millisecond)
	}
	var st buildStatus
	h.apiCall(serveKey, "GET", "/templates/"+ids.TemplateID+"/builds/"+ids.BuildID+"/status", nil, &st)
	h.t.Fatalf("the build's step never ran: %+v", st)
	return ids, 0
}

// findProcess is the pid of a process whose command line is exactly cmd.
func findProcess(cmd string) int {
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		var pid int
		if _, err := fmt.Sscanf(filepath.Base(p), "%d", &pid); err != nil {
			continue
		}
		if strings.TrimSpace(cmdline(pid)) == cmd {
			return pid
		}
	}
	return 0
}

func processGone(pid int, within time.Duration) bool {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); os.IsNotExist(err) {
			return true
		}
		time.Sleep(100 * time.Millisecond)
	}
	return false
}

func (h *host) waitBuild(ids buildIDs, within time.Duration) buildStatus {
	h.t.Helper()
	deadline := time.Now().Add(within)
	var st buildStatus
	for time.Now().Before(deadline) {
		if code := h.apiCall(serveKey, "GET", "/templates/"+ids.TemplateID+"/builds/"+ids.BuildID+"/status", nil, &st); code != http.StatusOK {
			h.t.Fatalf("status: %d", code)
		}
		if st.Status == "ready" || st.Status == "error" {
			return st
		}
		time.Sleep(100 * time.Millisecond)
	}
	h.t.Fatalf("build still %s after %s", st.Status, within)
	return st
}

func TestTemplateBuildRestartAndCancel(t *testing.T) {
	h := newHost(t, "linux")
	keys := "AIRLOCK_API_KEY=" + serveKey + "," + otherServeKey
	h.start(keys)
	name := "restart-" + strings.ToLower(rand.Text()[:8])

	// kill -9 during a step; the next server reports the build failed.
	ids, pid := h.startSleepBuild(name)
	h.kill9()
	h.start(keys)
	st := h.waitBuild(ids, 30*time.Second)
	if st.Status != "error" || st.Reason == nil || !strings.Contains(st.Reason.Message, "restarted") {
		t.Errorf("after a restart: %+v", st)
	}
	if !processGone(pid, 30*time.Second) {
		t.Errorf("the build step (pid %d) outlived the server that ran it and the next server's start", pid)
	}
	// The failed first build left no template, and the name is free.
	if code := h.apiCall(serveKey, "GET", "/templates/aliases/"+name, nil, nil); code != http.StatusNotFound {
		t.Errorf("alias of a build that never finished: %d", code)
	}
	var other buildIDs
	if code := h.apiCall(otherServeKey, "POST", "/v3/templates", map[string]any{"name": name}, &other); code != http.StatusAccepted {
		t.Errorf("another key builds the freed name: %d", code)
	}

	// Cancel: another key cannot; the owner can, at once, leaving nothing.
	name2 := name + "-c"
	ids, pid = h.startSleepBuild(name2)
	path := "/templates/" + ids.TemplateID + "/builds/" + ids.BuildID
	if code := h.apiCall(otherServeKey, "GET", path+"/status", nil, nil); code != http.StatusNotFound {
		t.Errorf("another key reads the build: %d", code)
	}
	if code := h.apiCall(otherServeKey, "DELETE", path, nil, nil); code != http.StatusNotFound {
		t.Errorf("another key cancels the build: %d", code)
	}
	if code := h.apiCall(serveKey, "DELETE", path, nil, nil); code != http.StatusNoContent {
		t.Fatalf("cancel: %d", code)
	}
	st = h.waitBuild(ids, 30*time.Second)
	if st.Status != "error" || st.Reason == nil || !strings.Contains(st.Reason.Message, "cancelled") {
		t.Errorf("cancelled build: %+v", st)
	}
	if !processGone(pid, 10*time.Second) {
		t.Errorf("the cancelled build's step (pid %d) still runs", pid)
	}
	if v := h.metric(`airlock_template_builds_total{outcome="error"}`); v < 1 {
		t.Errorf("template builds ended in error, in the metrics: %v after a cancel", v)
	}
	if code := h.apiCall(serveKey, "DELETE", path, nil, nil); code != http.StatusConflict {
		t.Errorf("cancel a finished build: %d", code)
	}
	if code := h.apiCall(serveKey, "GET", "/templates/aliases/"+name2, nil, nil); code != http.StatusNotFound {
		t.Errorf("alias of a cancelled first build: %d", code)
	}
	h.stop()
}
