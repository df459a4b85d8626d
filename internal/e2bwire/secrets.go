package e2bwire

import "time"

// NewSecret is the body of POST /secrets (upstream's NewSecret). Value is a
// pointer so that an absent value is told from an empty one.
type NewSecret struct {
	Name     string            `json:"name"`
	Value    *string           `json:"value"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// SecretUpdate is the body of POST /secrets/{secretID} (upstream's
// SecretUpdate). Metadata, when present (even {}), replaces the secret's;
// absent or null keeps it.
type SecretUpdate struct {
	Value    *string           `json:"value"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// Secret is a secret as every answer of /secrets shows it (upstream's
// Secret): its metadata, never its value.
type Secret struct {
	SecretID       string            `json:"secretID"`
	Name           string            `json:"name"`
	CurrentVersion int64             `json:"currentVersion"`
	Metadata       map[string]string `json:"metadata"` // never null
	CreatedAt      time.Time         `json:"createdAt"`
	UpdatedAt      time.Time         `json:"updatedAt"`
}
