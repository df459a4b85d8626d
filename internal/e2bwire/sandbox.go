package e2bwire

import (
	"time"
)

// Control-plane bodies, named after the upstream OpenAPI schemas. Field names
// and presence matter more than usual here: Python's generated models raise on
// a missing required key, and JS reads fields without checking them.

// Error is components.schemas.Error: the body of every non-2xx answer of the
// API. The SDKs branch on Code (kill → false on 404, pause → false on 409), so
// a server keeps it equal to the HTTP status.
type Error struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// Request bodies. Pointers tell "absent" from zero, because several fields
// default differently by endpoint version. A server accepts unknown fields: the
// SDKs grow options (autoResume, mcp, iam, volumeMounts...) faster than any
// server, and refusing them would break creates for options it can ignore.
// Optional fields are omitted when unset, so a client sends what the JS SDK
// sends.

// NewSandbox is NewSandbox (POST /sandboxes) and NewSandboxV2 (POST
// /v2/sandboxes); v2 ignores Secure. Metadata and EnvVars hold any JSON value
// so that a server can refuse a non-string one naming its key rather than
// silently reading it as ""; clients put strings in them (Strings).
type NewSandbox struct {
	TemplateID          string         `json:"templateID"`
	Timeout             *int64         `json:"timeout,omitempty"`
	Metadata            map[string]any `json:"metadata,omitempty"`
	EnvVars             map[string]any `json:"envVars,omitempty"`
	Secure              *bool          `json:"secure,omitempty"`
	AllowInternetAccess *bool          `json:"allow_internet_access,omitempty"` // snake_case on the wire, unlike everything else
	AutoPause           *bool          `json:"autoPause,omitempty"`
	// AutoPauseMemory false makes the timeout's pause keep only the
	// filesystem; it means something only with AutoPause true.
	AutoPauseMemory *bool                    `json:"autoPauseMemory,omitempty"`
	AutoResume      *SandboxAutoResumeConfig `json:"autoResume,omitempty"`
	Network         *SandboxNetworkConfig    `json:"network,omitempty"`
	// DiskSizeMB is an Airlock extension: the size limit of the sandbox's
	// writable layer (the template's, by default).
	DiskSizeMB *int `json:"diskSizeMB,omitempty"`
	// VolumeMounts mount the key's volumes (by name) at absolute paths.
	VolumeMounts []SandboxVolumeMount `json:"volumeMounts,omitempty"`
}

// SandboxVolumeMount is the `SandboxVolumeMount` schema: the volume's name
// and where in the sandbox it is mounted.
type SandboxVolumeMount struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// Strings is m as NewSandbox's Metadata and EnvVars hold it; nil when m is
// empty, so that the field is left out.
func Strings(m map[string]string) map[string]any {
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// SandboxAutoResumeConfig is NewSandbox's autoResume. Enabled is required
// by the schema; a pointer lets a server tell a missing one from false.
type SandboxAutoResumeConfig struct {
	Enabled *bool `json:"enabled,omitempty"`
}

// ConnectSandbox is ConnectSandbox, ConnectSandboxV2 and ResumedSandbox.
// Memory false asks to resume from the filesystem only (the JS SDK's
// onResume: "reboot").
type ConnectSandbox struct {
	Timeout *int64 `json:"timeout,omitempty"`
	Memory  *bool  `json:"memory,omitempty"`
}

// TimeoutRequest is the body of POST /sandboxes/{id}/timeout (seconds from now).
type TimeoutRequest struct {
	Timeout *int64 `json:"timeout,omitempty"`
}

// RefreshRequest is the body of POST /sandboxes/{id}/refreshes (seconds).
type RefreshRequest struct {
	Duration *int64 `json:"duration,omitempty"`
}

// PauseRequest is SandboxPauseRequest, the body of POST
// /sandboxes/{id}/pause. Memory defaults to true; false keeps only the
// filesystem.
type PauseRequest struct {
	Memory *bool `json:"memory,omitempty"`
}

// ForkRequest is SandboxForkRequest, the body of POST /sandboxes/{id}/fork:
// Timeout is the forks' time to live in seconds (default 15), Count how many
// (default 1, at most 100).
type ForkRequest struct {
	Timeout *int64 `json:"timeout,omitempty"`
	Count   *int64 `json:"count,omitempty"`
}

// SnapshotRequest is SandboxSnapshotRequest, the body of POST
// /sandboxes/{id}/snapshots.
type SnapshotRequest struct {
	Name *string `json:"name,omitempty"`
}

// SandboxNetworkConfig is SandboxNetworkConfig (create's network, and the
// network part of SandboxDetail) and SandboxNetworkUpdateConfig (PUT
// /sandboxes/{id}/network). Every field is omitted when unset, so a detail
// shows only what the client set.
type SandboxNetworkConfig struct {
	AllowOut           []string                        `json:"allowOut,omitempty"`
	DenyOut            []string                        `json:"denyOut,omitempty"`
	AllowPublicTraffic *bool                           `json:"allowPublicTraffic,omitempty"`
	MaskRequestHost    *string                         `json:"maskRequestHost,omitempty"`
	EgressProxy        *EgressProxy                    `json:"egressProxy,omitempty"`
	Rules              map[string][]SandboxNetworkRule `json:"rules,omitempty"`
	// AllowInternetAccess is only in SandboxNetworkUpdateConfig.
	AllowInternetAccess *bool `json:"allow_internet_access,omitempty"`
}

// MaskPortPlaceholder in SandboxNetworkConfig.MaskRequestHost stands for
// the port each request to the sandbox is for ("localhost:${PORT}").
const MaskPortPlaceholder = "${PORT}"

// SandboxNetworkRule is a transform applied to egress requests to one host.
type SandboxNetworkRule struct {
	Transform *SandboxNetworkTransform `json:"transform,omitempty"`
}

// SandboxNetworkTransform sets headers on matching egress requests.
type SandboxNetworkTransform struct {
	Headers map[string]string `json:"headers,omitempty"`
}

// EgressProxy is SandboxNetworkConfig's egressProxy.
type EgressProxy struct {
	Address  string  `json:"address"`
	Username *string `json:"username,omitempty"`
	Password *string `json:"password,omitempty"`
}

// Answers.

// Sandbox is the `Sandbox` schema: the answer of create, connect and resume.
type Sandbox struct {
	SandboxID       string `json:"sandboxID"`
	TemplateID      string `json:"templateID"`
	Alias           string `json:"alias"`
	ClientID        string `json:"clientID"`
	EnvdVersion     string `json:"envdVersion"`
	EnvdAccessToken string `json:"envdAccessToken,omitempty"`
	// TrafficAccessToken is set when network.allowPublicTraffic is false; the
	// SDKs send it as E2B-Traffic-Access-Token to reach user ports.
	TrafficAccessToken string  `json:"trafficAccessToken,omitempty"`
	Domain             *string `json:"domain"`
}

// ListedSandbox is the `ListedSandbox` schema (both list endpoints).
type ListedSandbox struct {
	SandboxID   string            `json:"sandboxID"`
	TemplateID  string            `json:"templateID"`
	Alias       string            `json:"alias"`
	ClientID    string            `json:"clientID"`
	StartedAt   time.Time         `json:"startedAt"`
	EndAt       time.Time         `json:"endAt"`
	CPUCount    int               `json:"cpuCount"`
	MemoryMB    int               `json:"memoryMB"`
	DiskSizeMB  int               `json:"diskSizeMB"`
	State       string            `json:"state"`
	EnvdVersion string            `json:"envdVersion"`
	Metadata    map[string]string `json:"metadata"`
	// VolumeMounts is never null (the SDKs iterate it).
	VolumeMounts []SandboxVolumeMount `json:"volumeMounts"`
}

// SandboxDetail is the `SandboxDetail` schema (GET /sandboxes/{id}).
type SandboxDetail struct {
	ListedSandbox
	EnvdAccessToken     string                `json:"envdAccessToken,omitempty"`
	TrafficAccessToken  string                `json:"trafficAccessToken,omitempty"`
	Domain              *string               `json:"domain"`
	AllowInternetAccess *bool                 `json:"allowInternetAccess"`
	Network             *SandboxNetworkConfig `json:"network,omitempty"`
	// Lifecycle is always sent by Airlock, as upstream does.
	Lifecycle *SandboxLifecycle `json:"lifecycle,omitempty"`
}

// SandboxLifecycle is the `SandboxLifecycle` schema: what the sandbox does at
// its timeout (OnTimeout*) and whether requests for it resume it once paused.
type SandboxLifecycle struct {
	AutoResume bool   `json:"autoResume"`
	OnTimeout  string `json:"onTimeout"`
}

// SandboxLifecycle.OnTimeout values (the `SandboxOnTimeout` enum).
const (
	OnTimeoutKill  = "kill"
	OnTimeoutPause = "pause"
)

// SandboxForkResult is one entry of the fork answer: exactly one of Sandbox
// (the fork started) and Error (it did not; Code is the status the same
// failure would have on its own).
type SandboxForkResult struct {
	Sandbox *Sandbox `json:"sandbox,omitempty"`
	Error   *Error   `json:"error,omitempty"`
}

// SnapshotInfo is the `SnapshotInfo` schema: the answer of POST
// /sandboxes/{id}/snapshots and the items of GET /snapshots. SnapshotID is
// what create's templateID and DELETE /templates/{id} take; Names is never
// null (Python's model requires the key).
type SnapshotInfo struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

// Sandbox states in ListedSandbox.State (and the list's state filter).
const (
	StateRunning = "running"
	StatePaused  = "paused"
)

// SandboxMetric is the `SandboxMetric` schema (GET /sandboxes/{id}/metrics).
type SandboxMetric struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	MemCache      int64     `json:"memCache"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}
