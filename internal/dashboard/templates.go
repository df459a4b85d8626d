package dashboard

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/airlock-sandbox/airlock/internal/e2bwire"
	"github.com/airlock-sandbox/airlock/internal/template"
	"github.com/airlock-sandbox/airlock/internal/tplbuild"
)

type buildJSON struct {
	BuildID    string     `json:"buildID"`
	Status     string     `json:"status"`
	CreatedAt  time.Time  `json:"createdAt"`
	FinishedAt *time.Time `json:"finishedAt"`
}

type templateJSON struct {
	TemplateID string      `json:"templateID"`
	Aliases    []string    `json:"aliases"`
	Builtin    bool        `json:"builtin"`
	Public     bool        `json:"public"`
	Mine       bool        `json:"mine"`
	Ready      bool        `json:"ready"`
	SizeBytes  int64       `json:"sizeBytes"`
	Layers     int         `json:"layers"`
	CreatedAt  time.Time   `json:"createdAt"`
	BuiltAt    time.Time   `json:"builtAt"`
	BuildID    string      `json:"buildID"`
	CPUCount   int         `json:"cpuCount"`
	MemoryMB   int         `json:"memoryMB"`
	DiskSizeMB int         `json:"diskSizeMB"`
	Builds     []buildJSON `json:"builds"`
}

// listTemplates is the templates the key may use, each with its builds:
// those the store keeps (ready) and the API builds still waiting, building
// or failed.
func (d *Dashboard) listTemplates(w http.ResponseWriter, r *http.Request) {
	s := sessionFrom(r.Context())
	if d.o.Templates == nil {
		writeJSON(w, http.StatusOK, map[string]any{"templates": []any{}})
		return
	}
	all, err := d.o.Templates.List()
	if err != nil {
		writeError(w, http.StatusInternalServerError, "Listing the templates failed: "+err.Error())
		return
	}
	out := []templateJSON{}
	for _, t := range all {
		if !t.Access.VisibleTo(s.owner) {
			continue
		}
		tj := templateJSON{
			TemplateID: t.ID, Aliases: nonNil(t.Aliases), Builtin: t.Builtin,
			Public: t.Access.Owner == "" || t.Access.Public, Mine: t.Access.Owner == s.owner,
			Ready: t.Ready, SizeBytes: t.SizeBytes, Layers: len(t.Layers), CreatedAt: t.CreatedAt,
			BuiltAt: t.BuiltAt, BuildID: t.BuildID, CPUCount: t.Settings.CPUCount,
			MemoryMB: t.Settings.MemoryMB, DiskSizeMB: t.Settings.DiskSizeMB, Builds: []buildJSON{},
		}
		if t.Ready {
			kept, err := d.o.Templates.Builds(t.ID)
			if err != nil {
				writeError(w, http.StatusInternalServerError, "Listing the builds failed: "+err.Error())
				return
			}
			for _, k := range kept {
				at := k.BuiltAt
				tj.Builds = append(tj.Builds, buildJSON{BuildID: k.BuildID, Status: tplbuild.StatusReady, CreatedAt: k.BuiltAt, FinishedAt: &at})
			}
		}
		if d.o.Builds != nil {
			recs, err := d.o.Builds.Builds(t.ID)
			if err != nil {
				writeError(w, http.StatusInternalServerError, "Listing the builds failed: "+err.Error())
				return
			}
			for _, rec := range recs {
				if rec.Status == tplbuild.StatusReady {
					continue // listed above while the store keeps it
				}
				b := buildJSON{BuildID: rec.BuildID, Status: rec.Status, CreatedAt: rec.CreatedAt}
				if !rec.FinishedAt.IsZero() {
					at := rec.FinishedAt
					b.FinishedAt = &at
				}
				tj.Builds = append(tj.Builds, b)
			}
		}
		slices.SortStableFunc(tj.Builds, func(a, b buildJSON) int { return b.CreatedAt.Compare(a.CreatedAt) })
		out = append(out, tj)
	}
	// A template whose first build is under way (or failed) is not in the
	// store yet: the key's build records show it, so its log can be read
	// while it builds.
	if d.o.Builds != nil {
		known := map[string]bool{}
		for _, t := range all {
			known[t.ID] = true
		}
		recs, err := d.o.Builds.OwnedBy(s.owner)
		if err != nil {
			writeError(w, http.StatusInternalServerError, "Listing the builds failed: "+err.Error())
			return
		}
		first := map[string]int{} // template → its index in out
		for _, rec := range recs {
			if known[rec.TemplateID] || rec.Status == tplbuild.StatusReady {
				continue
			}
			i, ok := first[rec.TemplateID]
			if !ok {
				i = len(out)
				first[rec.TemplateID] = i
				out = append(out, templateJSON{TemplateID: rec.TemplateID, Aliases: []string{}, Mine: true,
					CreatedAt: rec.CreatedAt, CPUCount: rec.CPUCount, MemoryMB: rec.MemoryMB, Builds: []buildJSON{}})
			}
			b := buildJSON{BuildID: rec.BuildID, Status: rec.Status, CreatedAt: rec.CreatedAt}
			if !rec.FinishedAt.IsZero() {
				at := rec.FinishedAt
				b.FinishedAt = &at
			}
			out[i].Builds = append(out[i].Builds, b) // newest first, as recs
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"templates": out})
}

// maxLogLines bounds one answer of buildLog.
const maxLogLines = 1000

// buildLog is one page of a build's log: an API build's from its record
// (live while it runs; the status route holds the answer up to a second
// for news), a kept build's from the log the store keeps with it.
func (d *Dashboard) buildLog(w http.ResponseWriter, r *http.Request) {
	s := sessionFrom(r.Context())
	id, buildID := r.PathValue("id"), r.PathValue("buildID")
	offset, err := intParam(r.URL.Query(), "offset", 0, 0, 1<<30)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	type logJSON struct {
		Status     string   `json:"status"`
		Lines      []string `json:"lines"`
		NextOffset int      `json:"nextOffset"`
		Reason     string   `json:"reason,omitempty"`
	}
	st, body := d.callAPI(r.Context(), s.key, http.MethodGet,
		"/templates/"+url.PathEscape(id)+"/builds/"+url.PathEscape(buildID)+"/status?logsOffset="+strconv.Itoa(offset), nil)
	if st == http.StatusOK {
		var info e2bwire.TemplateBuildInfo
		if err := json.Unmarshal(body, &info); err != nil {
			writeError(w, http.StatusBadGateway, "The build's status was unreadable: "+err.Error())
			return
		}
		out := logJSON{Status: info.Status, Lines: nonNil(info.Logs), NextOffset: offset + len(info.Logs)}
		if info.Reason != nil {
			out.Reason = info.Reason.Message
		}
		writeJSON(w, http.StatusOK, out)
		return
	}
	if st != http.StatusNotFound && st != http.StatusNotImplemented {
		relay(w, st, body, true)
		return
	}
	t, ok := d.keptBuild(s.owner, id, buildID)
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("Build %s of template %s not found", buildID, id))
		return
	}
	lines, err := readLines(t.BuildLog, offset, maxLogLines)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			writeJSON(w, http.StatusOK, logJSON{Status: tplbuild.StatusReady, Lines: []string{"(this build kept no log)"}, NextOffset: offset})
			return
		}
		writeError(w, http.StatusInternalServerError, "Reading the build's log failed: "+err.Error())
		return
	}
	writeJSON(w, http.StatusOK, logJSON{Status: tplbuild.StatusReady, Lines: lines, NextOffset: offset + len(lines)})
}

// keptBuild finds a build the store keeps of a template the owner may use.
func (d *Dashboard) keptBuild(owner, id, buildID string) (template.Template, bool) {
	if d.o.Templates == nil {
		return template.Template{}, false
	}
	kept, err := d.o.Templates.Builds(id)
	if err != nil {
		return template.Template{}, false
	}
	for _, k := range kept {
		if k.BuildID == buildID && k.Access.VisibleTo(owner) {
			return k, true
		}
	}
	return template.Template{}, false
}

// readLines returns up to limit lines of a file from line offset.
func readLines(name string, offset, limit int) ([]string, error) {
	if name == "" {
		return nil, os.ErrNotExist
	}
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	lines := []string{}
	for n := 0; sc.Scan() && len(lines) < limit; n++ {
		if n >= offset {
			lines = append(lines, sc.Text())
		}
	}
	return lines, sc.Err()
}

// deleteTemplate deletes through the API, which refuses built-ins, others'
// templates and templates in use with its own message.
func (d *Dashboard) deleteTemplate(w http.ResponseWriter, r *http.Request) {
	s := sessionFrom(r.Context())
	st, body := d.callAPI(r.Context(), s.key, http.MethodDelete, "/templates/"+url.PathEscape(r.PathValue("id")), nil)
	relay(w, st, body, false)
}
