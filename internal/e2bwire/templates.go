package e2bwire

import "time"

// The template build API's answers (docs/E2B-WIRE.md §2, upstream schema
// names): what the server writes for POST /v3/templates, the files check and
// build status, and what the client reads.

// TemplateRequestResponseV3 answers POST /v3/templates.
type TemplateRequestResponseV3 struct {
	TemplateID string   `json:"templateID"`
	BuildID    string   `json:"buildID"`
	Public     bool     `json:"public"`
	Aliases    []string `json:"aliases"`
	Names      []string `json:"names"`
	Tags       []string `json:"tags"`
}

// TemplateBuildFileUpload answers GET /templates/{id}/files/{hash}: whether a
// COPY step's files are on the server, and where to PUT them when not.
type TemplateBuildFileUpload struct {
	Present bool   `json:"present"`
	URL     string `json:"url,omitempty"`
}

// BuildLogEntry is one line of a build's log.
type BuildLogEntry struct {
	Timestamp time.Time `json:"timestamp"`
	Message   string    `json:"message"`
	Level     string    `json:"level"`
	Step      string    `json:"step,omitempty"`
}

// BuildStatusReason says why a build failed.
type BuildStatusReason struct {
	Message    string          `json:"message"`
	Step       string          `json:"step,omitempty"`
	LogEntries []BuildLogEntry `json:"logEntries"`
}

// TemplateBuildInfo answers GET …/builds/{buildID}/status.
type TemplateBuildInfo struct {
	Logs       []string           `json:"logs"`
	LogEntries []BuildLogEntry    `json:"logEntries"`
	TemplateID string             `json:"templateID"`
	BuildID    string             `json:"buildID"`
	Status     string             `json:"status"`
	Reason     *BuildStatusReason `json:"reason,omitempty"`
}

// TemplateBuildLogsResponse answers GET …/builds/{buildID}/logs.
type TemplateBuildLogsResponse struct {
	Logs []BuildLogEntry `json:"logs"`
}
