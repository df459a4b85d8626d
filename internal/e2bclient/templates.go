package e2bclient

// The E2B template build flow as the SDKs speak it (Template.build in npm
// `e2b`): POST /v3/templates for the ids, for each COPY step GET
// /templates/{id}/files/{hash} and a PUT of a gzipped tar to the URL it
// answers when the files are not there yet, POST
// /v2/templates/{id}/builds/{buildID} with the steps, then GET …/status with
// logsOffset until the build is ready or failed.
//
// The wire shapes are written here rather than shared with the server: the
// server's are private to internal/e2b, and these follow the upstream
// schemas (e2b-dev/infra spec/openapi.yml), which is what a client must send.

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"time"

	"github.com/airlock-sandbox/airlock/internal/e2bwire"
)

// TemplateBuildRequest is POST /v3/templates' body (TemplateBuildRequestV3).
type TemplateBuildRequest struct {
	// Name is "name" or "name:tag".
	Name     string   `json:"name"`
	Tags     []string `json:"tags,omitempty"`
	CPUCount int      `json:"cpuCount,omitempty"`
	MemoryMB int      `json:"memoryMB,omitempty"`
}

// TemplateBuildIDs is POST /v3/templates' answer.
type TemplateBuildIDs = e2bwire.TemplateRequestResponseV3

// FileUpload says whether a COPY step's files are on the server already,
// and where to PUT them when not.
type FileUpload = e2bwire.TemplateBuildFileUpload

// TemplateStep is one instruction of a template (TemplateStep): RUN
// [cmd, user?], ENV [k, v, ...], WORKDIR [path], USER [name], COPY [src,
// dest, user?, mode?] with FilesHash.
type TemplateStep struct {
	Type      string   `json:"type"`
	Args      []string `json:"args"`
	FilesHash string   `json:"filesHash,omitempty"`
	Force     bool     `json:"force,omitempty"`
}

// TemplateSpec is the build's body (TemplateBuildStartV2).
type TemplateSpec struct {
	FromTemplate string         `json:"fromTemplate,omitempty"`
	FromImage    string         `json:"fromImage,omitempty"`
	Force        bool           `json:"force"`
	Steps        []TemplateStep `json:"steps"`
	StartCmd     string         `json:"startCmd,omitempty"`
	ReadyCmd     string         `json:"readyCmd,omitempty"`
}

// BuildLogEntry is one line of a build's log.
type BuildLogEntry = e2bwire.BuildLogEntry

// BuildReason says why a build failed.
type BuildReason = e2bwire.BuildStatusReason

// TemplateBuildStatus is GET …/status' answer. Status is "waiting",
// "building", "ready" or "error".
type TemplateBuildStatus = e2bwire.TemplateBuildInfo

func templatePath(id string) string { return "/templates/" + url.PathEscape(id) }

// RequestTemplateBuild is POST /v3/templates: it registers a build and
// returns the template's and the build's ids.
func (c *Client) RequestTemplateBuild(ctx context.Context, req TemplateBuildRequest) (TemplateBuildIDs, error) {
	var ids TemplateBuildIDs
	_, err := c.do(ctx, http.MethodPost, "/v3/templates", req, &ids)
	return ids, err
}

// TemplateFiles asks whether the files of hash are on the server, and
// where to upload them when not.
func (c *Client) TemplateFiles(ctx context.Context, templateID, hash string) (FileUpload, error) {
	var up FileUpload
	_, err := c.do(ctx, http.MethodGet, templatePath(templateID)+"/files/"+url.PathEscape(hash), nil, &up)
	return up, err
}

// UploadTemplateFiles PUTs an archive (TemplateArchive) to the URL
// TemplateFiles answered. The URL is signed, so no API key goes with it,
// as the SDK sends none to its presigned bucket URL.
func (c *Client) UploadTemplateFiles(ctx context.Context, uploadURL string, archive []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, uploadURL, bytes.NewReader(archive))
	if err != nil {
		return fmt.Errorf("build upload request: %w", err)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("upload template files: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return errorFrom(resp)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxAnswer))
	return nil
}

// StartTemplateBuild is POST /v2/templates/{id}/builds/{buildID}: the steps;
// the server queues the build and answers at once.
func (c *Client) StartTemplateBuild(ctx context.Context, templateID, buildID string, spec TemplateSpec) error {
	if spec.Steps == nil {
		spec.Steps = []TemplateStep{} // the schema requires the array
	}
	_, err := c.do(ctx, http.MethodPost, "/v2/templates/"+url.PathEscape(templateID)+"/builds/"+url.PathEscape(buildID), spec, nil)
	return err
}

// GetTemplateBuildStatus returns a build's status and its log entries from
// logsOffset on.
func (c *Client) GetTemplateBuildStatus(ctx context.Context, templateID, buildID string, logsOffset int) (TemplateBuildStatus, error) {
	var st TemplateBuildStatus
	p := templatePath(templateID) + "/builds/" + url.PathEscape(buildID) + "/status?logsOffset=" + strconv.Itoa(logsOffset)
	_, err := c.do(ctx, http.MethodGet, p, nil, &st)
	return st, err
}

// DeleteTemplate deletes a template (DELETE /templates/{id}); an unknown one
// is an *Error with status 404.
func (c *Client) DeleteTemplate(ctx context.Context, id string) error {
	_, err := c.do(ctx, http.MethodDelete, templatePath(id), nil, nil)
	return err
}

// TemplateFile is a regular file of a COPY step's source, named by its path
// relative to the build context, as the SDK names it in the hash and the
// archive.
type TemplateFile struct {
	Name    string
	Mode    fs.FileMode // permission bits
	Content []byte
}

const sIFREG = 0o100000

// FilesHash is the SDK's hash of a COPY step's files (calculateFilesHash in
// npm `e2b`): sha256 of "COPY <src> <dest>", then for every file in path
// order its name, st_mode and size as decimal text, and its content. Files
// only: a directory's entry would need its st_size on the client's
// filesystem, which is the SDK's business.
func FilesHash(src, dest string, files []TemplateFile) string {
	h := sha256.New()
	io.WriteString(h, "COPY "+src+" "+dest)
	for _, f := range sortedFiles(files) {
		io.WriteString(h, f.Name)
		io.WriteString(h, strconv.FormatInt(int64(sIFREG|f.Mode.Perm()), 10))
		io.WriteString(h, strconv.Itoa(len(f.Content)))
		h.Write(f.Content)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func sortedFiles(files []TemplateFile) []TemplateFile {
	s := append([]TemplateFile(nil), files...)
	sort.Slice(s, func(i, j int) bool { return s[i].Name < s[j].Name })
	return s
}

// TemplateArchive is the gzipped tar the SDK uploads for a COPY step.
func TemplateArchive(files []TemplateFile) ([]byte, error) {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, f := range sortedFiles(files) {
		hdr := &tar.Header{Name: f.Name, Mode: int64(f.Mode.Perm()), Size: int64(len(f.Content)), Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("archive %s: %w", f.Name, err)
		}
		if _, err := tw.Write(f.Content); err != nil {
			return nil, fmt.Errorf("archive %s: %w", f.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("archive: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("archive: %w", err)
	}
	return buf.Bytes(), nil
}

// TemplateBuild is a whole build as Template.build makes it.
type TemplateBuild struct {
	Request TemplateBuildRequest
	Spec    TemplateSpec
	// Files are the COPY steps' sources, by the step's src (Args[0]); a COPY
	// step without FilesHash gets the hash of its files.
	Files map[string][]TemplateFile
	// PollInterval is the wait between status polls; 0 is the SDK's 200 ms.
	PollInterval time.Duration
	// OnLog, when set, gets every log entry as the polls bring it.
	OnLog func(BuildLogEntry)
}

// BuildError is a build that ended in status "error".
type BuildError struct {
	TemplateID, BuildID string
	Reason              BuildReason
}

func (e *BuildError) Error() string {
	return fmt.Sprintf("template %s build %s failed: %s", e.TemplateID, e.BuildID, e.Reason.Message)
}

// BuildTemplate runs the SDK's Template.build flow: request the ids, upload
// each COPY step's files unless the server has them, start the build, and
// poll its status (right away, then every PollInterval) until it is ready,
// reading the log to its end as the SDK does. A failed build is a
// *BuildError. The uploads go one after another (the SDK starts them
// together), which is the same for the one-file templates this serves.
func (c *Client) BuildTemplate(ctx context.Context, b TemplateBuild) (TemplateBuildIDs, error) {
	ids, err := c.RequestTemplateBuild(ctx, b.Request)
	if err != nil {
		return ids, fmt.Errorf("request build of %s: %w", b.Request.Name, err)
	}
	spec := b.Spec
	spec.Steps = append([]TemplateStep(nil), b.Spec.Steps...)
	for i, st := range spec.Steps {
		if st.Type != "COPY" {
			continue
		}
		if len(st.Args) < 2 {
			return ids, fmt.Errorf("step %d: COPY needs [src, dest]", i+1)
		}
		files, ok := b.Files[st.Args[0]]
		if !ok || len(files) == 0 {
			return ids, fmt.Errorf("step %d: no files given for COPY %s", i+1, st.Args[0])
		}
		if st.FilesHash == "" {
			spec.Steps[i].FilesHash = FilesHash(st.Args[0], st.Args[1], files)
		}
		up, err := c.TemplateFiles(ctx, ids.TemplateID, spec.Steps[i].FilesHash)
		if err != nil {
			return ids, fmt.Errorf("step %d: files of COPY %s: %w", i+1, st.Args[0], err)
		}
		if up.Present {
			continue
		}
		if up.URL == "" {
			return ids, fmt.Errorf("step %d: the server has no files for COPY %s and gave no upload URL", i+1, st.Args[0])
		}
		archive, err := TemplateArchive(files)
		if err != nil {
			return ids, err
		}
		if err := c.UploadTemplateFiles(ctx, up.URL, archive); err != nil {
			return ids, fmt.Errorf("step %d: upload COPY %s: %w", i+1, st.Args[0], err)
		}
	}
	if err := c.StartTemplateBuild(ctx, ids.TemplateID, ids.BuildID, spec); err != nil {
		return ids, fmt.Errorf("start build %s: %w", ids.BuildID, err)
	}
	every := b.PollInterval
	if every <= 0 {
		every = 200 * time.Millisecond
	}
	offset := 0
	poll := func() (TemplateBuildStatus, error) {
		st, err := c.GetTemplateBuildStatus(ctx, ids.TemplateID, ids.BuildID, offset)
		if err != nil {
			return st, fmt.Errorf("status of build %s: %w", ids.BuildID, err)
		}
		offset += len(st.LogEntries)
		if b.OnLog != nil {
			for _, e := range st.LogEntries {
				b.OnLog(e)
			}
		}
		return st, nil
	}
	for {
		st, err := poll()
		if err != nil {
			return ids, err
		}
		switch st.Status {
		case "ready", "error":
			for tail := st; len(tail.LogEntries) > 0; {
				if tail, err = poll(); err != nil {
					return ids, err
				}
			}
			if st.Status == "ready" {
				return ids, nil
			}
			be := &BuildError{TemplateID: ids.TemplateID, BuildID: ids.BuildID}
			if st.Reason != nil {
				be.Reason = *st.Reason
			}
			return ids, be
		case "waiting", "building":
		default:
			return ids, fmt.Errorf("build %s: unknown status %q", ids.BuildID, st.Status)
		}
		select {
		case <-ctx.Done():
			return ids, fmt.Errorf("build %s: %w", ids.BuildID, ctx.Err())
		case <-time.After(every):
		}
	}
}
