package sandbox

import (
	"github.com/airlock-sandbox/airlock/internal/netpolicy"

	"errors"
	"fmt"
	"net/netip"
	"time"
)

// State is where a sandbox is in its life. The manager is the only writer.
//
//	creating -> running <-> paused
//	    \          \          /
//	     `-----------> killed
type State string

const (
	StateCreating State = "creating"
	StateRunning  State = "running"
	StatePaused   State = "paused"
	StateKilled   State = "killed"
)

// Info is a snapshot of one sandbox, as the API layers report it.
type Info struct {
	ID         string
	TemplateID string
	Alias      string // the template name the sandbox was created from
	ClientID   string
	Metadata   map[string]string
	EnvVars    map[string]string
	StartedAt  time.Time
	EndAt      time.Time
	State      State
	CPUCount   int
	MemoryMB   int
	DiskSizeMB int
	// AccessToken secures envd (X-Access-Token and /files signatures).
	AccessToken         string
	EnvdVersion         string
	AllowInternetAccess *bool
	// Owner identifies who created the sandbox (a digest of the API key).
	Owner string
	// Network is the egress policy and public-traffic setting as the client
	// last set them (create or update).
	Network NetworkConfig
	// TrafficAccessToken guards the sandbox's user ports through the proxy
	// when Network.AllowPublicTraffic is false.
	TrafficAccessToken string
	// Addr is the sandbox's address on its veth (invalid without a network);
	// the proxy dials user ports there.
	Addr netip.Addr
	// Lifecycle is what happens at the timeout, as set at create.
	Lifecycle Lifecycle
	// PausedWithMemory tells, for a paused sandbox, whether its processes
	// were saved (resume restores them) or only its filesystem (resume
	// boots it afresh).
	PausedWithMemory bool
	// PausedAt is when a paused sandbox was paused (retention counts from it).
	PausedAt time.Time
	// PausedDiskBytes is what a paused sandbox holds on disk (its checkpoint
	// image and its directory), measured when it paused; the team's quota
	// of paused sandboxes' disk counts it.
	PausedDiskBytes int64
	// VolumeMounts are the volumes the sandbox mounts (volumes.go).
	VolumeMounts []VolumeMount
}

// unpause makes a paused sandbox's info a running one's: every field a
// pause set is cleared.
func (i *Info) unpause() {
	i.State = StateRunning
	i.PausedWithMemory, i.PausedAt, i.PausedDiskBytes = false, time.Time{}, 0
}

// Lifecycle is E2B's sandbox lifecycle: on the wire autoPause,
// autoPauseMemory and autoResume.enabled at create, and lifecycle
// {onTimeout, autoResume} in the sandbox's detail.
type Lifecycle struct {
	// OnTimeout is OnTimeoutKill (the default, also for "") or OnTimeoutPause.
	OnTimeout OnTimeout
	// DropMemory makes the timeout's pause keep only the filesystem (E2B's
	// autoPauseMemory=false); the zero value keeps memory, E2B's default.
	DropMemory bool
	// AutoResume lets any request for the paused sandbox (the proxy, envd
	// calls, connect) resume it. Only with OnTimeoutPause and memory kept.
	AutoResume bool
}

// OnTimeout is what a sandbox does when its timeout comes.
type OnTimeout string

const (
	OnTimeoutKill  OnTimeout = "kill"
	OnTimeoutPause OnTimeout = "pause"
)

// PauseOptions are POST /sandboxes/{id}/pause's body.
type PauseOptions struct {
	// DropMemory keeps only the filesystem (E2B's memory=false); resume
	// then boots the sandbox afresh from it.
	DropMemory bool
}

// ForkRequest is POST /sandboxes/{id}/fork's body.
type ForkRequest struct {
	// Count is how many forks, 1 to MaxForkCount.
	Count int
	// Timeout is the forks' time to live.
	Timeout time.Duration
	// Owner is who asks (as CreateRequest.Owner).
	Owner string
}

// MaxForkCount bounds ForkRequest.Count (E2B's bound).
const MaxForkCount = 100

// ForkResult is one fork's outcome: exactly one of Info (its ID set) and Err.
type ForkResult struct {
	Info Info
	Err  error
}

// SnapshotRequest is POST /sandboxes/{id}/snapshots's body.
type SnapshotRequest struct {
	// Name is optional; Owner's snapshot of that name already there is
	// replaced (E2B assigns the name to the newest build). Names are per
	// owner.
	Name string
	// Owner is who asks.
	Owner string
}

// Snapshot is a saved sandbox state (processes, memory and filesystem) that
// new sandboxes start from: Create with Template set to its ID or a name.
type Snapshot struct {
	// ID is what Create, DELETE /templates/{id} and the SDKs' snapshotId
	// take: "<name>:default" for a named snapshot, else "<raw id>:default".
	ID string
	// Names are its full names ("<name>:default"); empty when unnamed.
	Names []string
	// SandboxID is the sandbox it was taken from.
	SandboxID  string
	TemplateID string
	Owner      string
	CreatedAt  time.Time
}

// SnapshotFilter selects snapshots for ListSnapshots; zero values match all.
type SnapshotFilter struct {
	SandboxID string
	// Name matches a snapshot's ID or name, with or without its ":tag".
	Name  string
	Owner string
}

// NetworkConfig is E2B's SandboxNetworkConfig, as far as Airlock enforces it.
// allowInternetAccess=false adds ALL_TRAFFIC (0.0.0.0/0) to DenyOut; AllowOut
// takes precedence over DenyOut (see netpolicy.Policy).
type NetworkConfig struct {
	AllowOut []string
	DenyOut  []string
	// AllowPublicTraffic false makes user ports require the traffic access
	// token (header E2B-Traffic-Access-Token); nil means true.
	AllowPublicTraffic *bool
	// MaskRequestHost is the Host header requests to the sandbox's user
	// ports carry instead of the client's ("${PORT}" stands for the port);
	// "" keeps the client's.
	MaskRequestHost string
	// Rules are per-host request transforms applied by Airlock's egress
	// (headers, with secret markers filled in on the host).
	Rules map[string][]netpolicy.Rule
	// EgressProxy carries every TCP connection through a SOCKS5 proxy.
	EgressProxy *netpolicy.EgressProxy
}

// NetworkUpdate is E2B's SandboxNetworkUpdateConfig: it replaces the egress
// rules of a running sandbox (omitted fields are cleared).
type NetworkUpdate struct {
	AllowOut            []string
	DenyOut             []string
	AllowInternetAccess *bool
	Rules               map[string][]netpolicy.Rule
	EgressProxy         *netpolicy.EgressProxy
}

// ApplyTo makes info's egress policy the update's: its lists, rules and
// egress proxy replaced (copied), allowInternetAccess changed if given.
func (u NetworkUpdate) ApplyTo(info *Info) {
	info.Network.AllowOut = append([]string(nil), u.AllowOut...)
	info.Network.DenyOut = append([]string(nil), u.DenyOut...)
	info.Network.Rules = copyRules(u.Rules)
	info.Network.EgressProxy = nil
	if u.EgressProxy != nil {
		ep := *u.EgressProxy
		info.Network.EgressProxy = &ep
	}
	if u.AllowInternetAccess != nil {
		v := *u.AllowInternetAccess
		info.AllowInternetAccess = &v
	}
}

// CreateRequest is what a client asks for.
type CreateRequest struct {
	Template            string // template id or alias
	Timeout             time.Duration
	Metadata            map[string]string
	EnvVars             map[string]string
	AllowInternetAccess *bool
	// Network is optional; nil means no rules beyond AllowInternetAccess.
	Network *NetworkConfig
	// Secure asks for an envd access token. The v2 create path always sets it.
	Secure bool
	// Owner is who asks (a digest of the API key); Options.MaxPerOwner counts by it.
	Owner string
	// DiskSizeMB bounds the sandbox's writable layer; 0 takes the template's
	// (or DefaultDiskSizeMB).
	DiskSizeMB int
	// Lifecycle is what happens at the timeout (E2B's autoPause,
	// autoPauseMemory and autoResume); the zero value kills.
	Lifecycle Lifecycle
	// VolumeMounts are the Owner's volumes to mount, by Name (or ID), each
	// at its Path.
	VolumeMounts []VolumeMount
	// SnapshotOnly is set when Template names a template Owner may not use
	// (another team's private one): Owner's own snapshot of that name still
	// starts, since snapshot names are per team; else the answer is
	// ErrTemplateNotFound, as for a template that never existed.
	SnapshotOnly bool
}

// ListFilter selects sandboxes for List. Zero values match everything.
type ListFilter struct {
	// Owner keeps the sandboxes of one owner (a team); "" keeps all.
	Owner        string
	States       []State
	Metadata     map[string]string
	Template     string // id or alias
	StartedAfter time.Time
}

// Metric is one sample of a sandbox's resource use.
type Metric struct {
	Time       time.Time
	CPUCount   int
	CPUUsedPct float64
	MemUsed    int64
	MemTotal   int64
	MemCache   int64
	DiskUsed   int64
	DiskTotal  int64
}

// Errors the manager returns; API layers map them to status codes with errors.Is.
var (
	ErrNotFound         = errors.New("sandbox not found")
	ErrTemplateNotFound = errors.New("template not found")
	ErrInvalid          = errors.New("invalid request")
	ErrConflict         = errors.New("conflict")
	// ErrNotSupported is an operation the backend serving the sandboxes
	// cannot do (the kubernetes backend's pause); the message names it.
	ErrNotSupported = errors.New("not supported")
	// ErrLimit means a per-owner quota (concurrent sandboxes) is used up.
	ErrLimit = errors.New("limit reached")
	// ErrStorageLimit is the ErrLimit of a quota on disk (the paused
	// sandboxes'), which the E2B API answers with 507 rather than 429, as
	// it does a volume's size.
	ErrStorageLimit = fmt.Errorf("%w (storage)", ErrLimit)
	// ErrTemplateStart means the template's start command exited (or could
	// not be started) before the sandbox was ready; the error is a
	// *StartError carrying the message for the client.
	ErrTemplateStart = errors.New("template start command failed")
	// ErrTemplateNotReady means the template's ready command did not succeed
	// within the template's ready timeout; the error is a *StartError and
	// also matches ErrTemplateStart.
	ErrTemplateNotReady = errors.New("template ready command did not succeed in time")
)
