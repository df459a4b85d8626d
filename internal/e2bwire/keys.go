package e2bwire

import "time"

// KeyMask is upstream's IdentifierMaskingDetails: enough of a key to tell
// it apart, never the key.
type KeyMask struct {
	Prefix            string `json:"prefix"`
	ValueLength       int    `json:"valueLength"`
	MaskedValuePrefix string `json:"maskedValuePrefix"`
	MaskedValueSuffix string `json:"maskedValueSuffix"`
}

// KeyCreator is upstream's TeamUser, who made a key; Airlock has no user
// accounts, so it is always null.
type KeyCreator struct {
	ID    string  `json:"id"`
	Email *string `json:"email"`
}

// TeamAPIKey is upstream's TeamAPIKey (and, with Key, CreatedTeamAPIKey),
// plus Airlock's team, scopes and revocation.
type TeamAPIKey struct {
	ID        string      `json:"id"`
	Key       string      `json:"key,omitempty"`
	Name      string      `json:"name"`
	Mask      KeyMask     `json:"mask"`
	CreatedAt time.Time   `json:"createdAt"`
	CreatedBy *KeyCreator `json:"createdBy"`
	LastUsed  *time.Time  `json:"lastUsed"`
	TeamID    string      `json:"teamID"`
	Scopes    []string    `json:"scopes"`
	RevokedAt *time.Time  `json:"revokedAt,omitempty"`
}

// NewTeamAPIKey is the body of POST /api-keys (upstream's name; Airlock's
// scopes and team, by ID or name) and of PATCH /api-keys/{id} (name,
// scopes).
type NewTeamAPIKey struct {
	Name   *string  `json:"name,omitempty"`
	Scopes []string `json:"scopes,omitempty"`
	Team   string   `json:"team,omitempty"`
}

// Team is upstream's Team; APIKey is empty (Airlock keeps keys as hashes).
type Team struct {
	TeamID    string      `json:"teamID"`
	Name      string      `json:"name"`
	APIKey    string      `json:"apiKey"`
	IsDefault bool        `json:"isDefault"`
	Quotas    *TeamQuotas `json:"quotas,omitempty"`
}

// AuditEntry is one line of GET /airlock/v1/audit.
type AuditEntry struct {
	Seq        int64     `json:"seq"`
	At         time.Time `json:"at"`
	KeyID      string    `json:"keyID"`
	KeyName    string    `json:"keyName"`
	TeamID     string    `json:"teamID"`
	Action     string    `json:"action"`
	TargetKind string    `json:"targetKind"`
	TargetID   string    `json:"targetID"`
	Status     int       `json:"status"`
	Detail     string    `json:"detail"`
}

// AuditPath is where the audit log is read (an Airlock extension).
const AuditPath = "/airlock/v1/audit"

// TeamQuotas are a team's limits (an Airlock extension of Team); 0 is the
// server's default.
type TeamQuotas struct {
	Sandboxes         int     `json:"sandboxes"`
	VCPUs             int     `json:"vcpus"`
	MemoryMB          int     `json:"memoryMB"`
	PausedSandboxes   int     `json:"pausedSandboxes"`
	PausedDiskMB      int     `json:"pausedDiskMB"`
	RequestsPerSecond float64 `json:"requestsPerSecond"`
	Builds            int     `json:"builds"`
	VolumesMB         int     `json:"volumesMB"`
}

// TeamUpdate is the body of PATCH /teams/{teamID}.
type TeamUpdate struct {
	Quotas *TeamQuotas `json:"quotas"`
}

// TeamMetric is upstream's TeamMetric: one sample of GET
// /teams/{teamID}/metrics.
type TeamMetric struct {
	Timestamp           time.Time `json:"timestamp"`
	TimestampUnix       int64     `json:"timestampUnix"`
	ConcurrentSandboxes int       `json:"concurrentSandboxes"`
	SandboxStartRate    float64   `json:"sandboxStartRate"`
}
