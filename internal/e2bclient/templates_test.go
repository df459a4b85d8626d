package e2bclient

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The expected hashes are what npm e2b 2.51.0 computed for the same files:
// Template({fileContextPath}).fromTemplate('base').copy('bench.txt',
// '/opt/bench.txt').copy('*.sh', '/opt/bin/') then toJSON(true), with
// bench.txt (0644) holding "bench file\n" and run.sh (0755)
// "#!/bin/sh\necho x\n". A server checks an upload against this hash, so a
// client that hashes otherwise cannot build.
func TestFilesHashMatchesTheSDK(t *testing.T) {
	cases := []struct {
		src, dest string
		files     []TemplateFile
		want      string
	}{
		{"bench.txt", "/opt/bench.txt", []TemplateFile{{Name: "bench.txt", Mode: 0o644, Content: []byte("bench file\n")}},
			"c4ccb1296ee8c2a1036e4ead2a76c73658a6d37de3ccfe7cdd7e470a446769a2"},
		{"*.sh", "/opt/bin/", []TemplateFile{{Name: "run.sh", Mode: 0o755, Content: []byte("#!/bin/sh\necho x\n")}},
			"63527ceac5a9df867c0be26b3735d9b6dd3ea544f4559781be1d96c62fff32bf"},
	}
	for _, c := range cases {
		if got := FilesHash(c.src, c.dest, c.files); got != c.want {
			t.Errorf("FilesHash(COPY %s %s) = %s, want the SDK's %s", c.src, c.dest, got, c.want)
		}
	}
	// Files are hashed in path order, whatever order they are given in.
	a := TemplateFile{Name: "a", Mode: 0o644, Content: []byte("1")}
	b := TemplateFile{Name: "b", Mode: 0o644, Content: []byte("2")}
	if FilesHash(".", "/x", []TemplateFile{a, b}) != FilesHash(".", "/x", []TemplateFile{b, a}) {
		t.Error("FilesHash depends on the order of its files")
	}
}

// TestBuildTemplate runs the whole flow against a fake API: the ids, a
// present file skipped and an absent one uploaded (without the API key, to
// the URL the server gave), the steps with their hashes, then status polls
// from each offset until ready and the log drained.
func TestBuildTemplate(t *testing.T) {
	present := FilesHash("old.txt", "/old", []TemplateFile{{Name: "old.txt", Mode: 0o644, Content: []byte("old")}})
	fresh := FilesHash("new.txt", "/new", []TemplateFile{{Name: "new.txt", Mode: 0o600, Content: []byte("new")}})
	var uploaded, polls []string
	// The upload goes to a server of its own (the API's answer names it),
	// without the API key.
	upSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPut || r.URL.Path != "/upload/"+fresh || r.Header.Get("X-API-KEY") != "" || r.URL.Query().Get("token") != "x" {
			t.Errorf("upload: %s %s, key %q", r.Method, r.URL, r.Header.Get("X-API-KEY"))
		}
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			t.Error(err)
			return
		}
		tr := tar.NewReader(zr)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Error(err)
				return
			}
			b, _ := io.ReadAll(tr)
			uploaded = append(uploaded, h.Name+":"+string(b)+":"+h.FileInfo().Mode().Perm().String())
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(upSrv.Close)
	srv := apiServer(t, map[string]http.HandlerFunc{
		"POST /v3/templates": func(w http.ResponseWriter, r *http.Request) {
			if got := jsonText(body(t, r)); got != `{"cpuCount":1,"memoryMB":512,"name":"t"}` {
				t.Errorf("request body %s", got)
			}
			writeJSON(w, http.StatusAccepted, map[string]any{"templateID": "t", "buildID": "b1"})
		},
		"GET /templates/t/files/" + present: func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusCreated, map[string]any{"present": true})
		},
		"GET /templates/t/files/" + fresh: func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusCreated, map[string]any{"present": false, "url": upSrv.URL + "/upload/" + fresh + "?token=x"})
		},
		"POST /v2/templates/t/builds/b1": func(w http.ResponseWriter, r *http.Request) {
			want := `{"force":false,"fromTemplate":"base","steps":[{"args":["old.txt","/old"],"filesHash":"` + present +
				`","type":"COPY"},{"args":["new.txt","/new"],"filesHash":"` + fresh + `","type":"COPY"},{"args":["K","v"],"type":"ENV"}]}`
			if got := jsonText(body(t, r)); got != want {
				t.Errorf("start body\n%s, want\n%s", got, want)
			}
			w.WriteHeader(http.StatusAccepted)
		},
		"GET /templates/t/builds/b1/status": func(w http.ResponseWriter, r *http.Request) {
			off := r.URL.Query().Get("logsOffset")
			polls = append(polls, off)
			st := map[string]any{"templateID": "t", "buildID": "b1", "logEntries": []any{}}
			switch off {
			case "0":
				st["status"] = "building"
				st["logEntries"] = []any{map[string]any{"message": "one", "level": "info"}}
			case "1":
				st["status"] = "ready"
				st["logEntries"] = []any{map[string]any{"message": "two", "level": "info"}}
			default:
				st["status"] = "ready"
			}
			writeJSON(w, http.StatusOK, st)
		},
	})

	var logs []string
	c := New(Config{APIURL: srv.URL, APIKey: testKey, SandboxURL: "http://unused"})
	ids, err := c.BuildTemplate(context.Background(), TemplateBuild{
		Request: TemplateBuildRequest{Name: "t", CPUCount: 1, MemoryMB: 512},
		Spec: TemplateSpec{FromTemplate: "base", Steps: []TemplateStep{
			{Type: "COPY", Args: []string{"old.txt", "/old"}},
			{Type: "COPY", Args: []string{"new.txt", "/new"}},
			{Type: "ENV", Args: []string{"K", "v"}},
		}},
		Files: map[string][]TemplateFile{
			"old.txt": {{Name: "old.txt", Mode: 0o644, Content: []byte("old")}},
			"new.txt": {{Name: "new.txt", Mode: 0o600, Content: []byte("new")}},
		},
		PollInterval: 1,
		OnLog:        func(e BuildLogEntry) { logs = append(logs, e.Message) },
	})
	if err != nil || ids.BuildID != "b1" {
		t.Fatalf("BuildTemplate: %+v, %v", ids, err)
	}
	if strings.Join(uploaded, ",") != "new.txt:new:-rw-------" {
		t.Errorf("uploaded %v, want new.txt alone", uploaded)
	}
	if strings.Join(polls, ",") != "0,1,2" || strings.Join(logs, ",") != "one,two" {
		t.Errorf("polls at offsets %v, logs %v", polls, logs)
	}
}

func TestBuildTemplateFailure(t *testing.T) {
	srv := apiServer(t, map[string]http.HandlerFunc{
		"POST /v3/templates": func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusAccepted, map[string]any{"templateID": "t", "buildID": "b"})
		},
		"POST /v2/templates/t/builds/b": func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusAccepted) },
		"GET /templates/t/builds/b/status": func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusOK, map[string]any{"templateID": "t", "buildID": "b", "status": "error", "logEntries": []any{},
				"reason": map[string]any{"message": "step 1: exited with code 7", "step": "1"}})
		},
	})
	c := New(Config{APIURL: srv.URL, APIKey: testKey, SandboxURL: "http://unused"})
	_, err := c.BuildTemplate(context.Background(), TemplateBuild{
		Request: TemplateBuildRequest{Name: "t"},
		Spec:    TemplateSpec{FromTemplate: "base", Steps: []TemplateStep{{Type: "RUN", Args: []string{"exit 7"}}}},
	})
	var be *BuildError
	if !errors.As(err, &be) || be.Reason.Message != "step 1: exited with code 7" {
		t.Fatalf("err %v, want a BuildError with the reason", err)
	}
}
