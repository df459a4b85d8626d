package e2b

import (
	"time"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// Wire types, named after the upstream OpenAPI schemas. Field names and
// presence matter more than usual here: Python's generated models raise on a
// missing required key, and JS reads fields without checking them.

// sandboxJSON is the `Sandbox` schema (create, connect, resume).
type sandboxJSON struct {
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

// networkJSON is the network part of SandboxDetail, as the client set it.
type networkJSON struct {
	AllowOut           []string `json:"allowOut,omitempty"`
	DenyOut            []string `json:"denyOut,omitempty"`
	AllowPublicTraffic *bool    `json:"allowPublicTraffic,omitempty"`
}

// listedSandboxJSON is the `ListedSandbox` schema (both list endpoints).
type listedSandboxJSON struct {
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
}

// sandboxDetailJSON is the `SandboxDetail` schema (GET /sandboxes/{id}).
type sandboxDetailJSON struct {
	listedSandboxJSON
	EnvdAccessToken     string       `json:"envdAccessToken,omitempty"`
	TrafficAccessToken  string       `json:"trafficAccessToken,omitempty"`
	Domain              *string      `json:"domain"`
	AllowInternetAccess *bool        `json:"allowInternetAccess"`
	Network             *networkJSON `json:"network,omitempty"`
}

// sandboxMetricJSON is the `SandboxMetric` schema.
type sandboxMetricJSON struct {
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

func (h *Handler) domain() *string {
	if h.opts.Domain == "" {
		return nil
	}
	d := h.opts.Domain
	return &d
}

func (h *Handler) clientID(info sandbox.Info) string {
	if info.ClientID != "" {
		return info.ClientID
	}
	return DefaultClientID
}

func (h *Handler) envdVersion(info sandbox.Info) string {
	if info.EnvdVersion != "" {
		return info.EnvdVersion
	}
	return h.opts.EnvdVersion
}

func (h *Handler) sandboxJSON(info sandbox.Info) sandboxJSON {
	return sandboxJSON{
		SandboxID:          info.ID,
		TemplateID:         info.TemplateID,
		Alias:              info.Alias,
		ClientID:           h.clientID(info),
		EnvdVersion:        h.envdVersion(info),
		EnvdAccessToken:    info.AccessToken,
		TrafficAccessToken: info.TrafficAccessToken,
		Domain:             h.domain(),
	}
}

// wireState folds the manager's states onto the two the API knows. A sandbox
// still "creating" is reported as running: the SDK enum has no other value,
// and Create only returns once the sandbox runs anyway.
func wireState(s sandbox.State) string {
	if s == sandbox.StatePaused {
		return string(sandbox.StatePaused)
	}
	return string(sandbox.StateRunning)
}

func (h *Handler) listedJSON(info sandbox.Info) listedSandboxJSON {
	md := info.Metadata
	if md == nil {
		md = map[string]string{}
	}
	return listedSandboxJSON{
		SandboxID:   info.ID,
		TemplateID:  info.TemplateID,
		Alias:       info.Alias,
		ClientID:    h.clientID(info),
		StartedAt:   info.StartedAt.UTC(),
		EndAt:       info.EndAt.UTC(),
		CPUCount:    info.CPUCount,
		MemoryMB:    info.MemoryMB,
		DiskSizeMB:  info.DiskSizeMB,
		State:       wireState(info.State),
		EnvdVersion: h.envdVersion(info),
		Metadata:    md,
	}
}

func (h *Handler) detailJSON(info sandbox.Info) sandboxDetailJSON {
	return sandboxDetailJSON{
		listedSandboxJSON:   h.listedJSON(info),
		EnvdAccessToken:     info.AccessToken,
		TrafficAccessToken:  info.TrafficAccessToken,
		Domain:              h.domain(),
		AllowInternetAccess: info.AllowInternetAccess,
		Network:             networkOf(info.Network),
	}
}

func networkOf(n sandbox.NetworkConfig) *networkJSON {
	if len(n.AllowOut) == 0 && len(n.DenyOut) == 0 && n.AllowPublicTraffic == nil {
		return nil
	}
	return &networkJSON{AllowOut: n.AllowOut, DenyOut: n.DenyOut, AllowPublicTraffic: n.AllowPublicTraffic}
}

func metricJSON(m sandbox.Metric) sandboxMetricJSON {
	return sandboxMetricJSON{
		Timestamp:     m.Time.UTC(),
		TimestampUnix: m.Time.Unix(),
		CPUCount:      m.CPUCount,
		CPUUsedPct:    m.CPUUsedPct,
		MemUsed:       m.MemUsed,
		MemTotal:      m.MemTotal,
		MemCache:      m.MemCache,
		DiskUsed:      m.DiskUsed,
		DiskTotal:     m.DiskTotal,
	}
}
