package e2bwire

import "time"

// NewVolume is the body of POST /volumes (upstream's NewVolume).
type NewVolume struct {
	Name string `json:"name"`
	// SizeMB is Airlock's extension: the volume's quota in MiB (absent: the
	// server's default). Upstream has no size field; its SDKs never send it.
	SizeMB *int64 `json:"sizeMB,omitempty"`
}

// Volume is an entry of GET /volumes (upstream's Volume).
type Volume struct {
	VolumeID string `json:"volumeID"`
	Name     string `json:"name"`
}

// VolumeAndToken answers POST /volumes and GET /volumes/{volumeID}
// (upstream's VolumeAndToken). Domain is upstream's BYOC content host,
// absent here: the SDKs then use E2B_VOLUME_API_URL.
type VolumeAndToken struct {
	VolumeID string `json:"volumeID"`
	Name     string `json:"name"`
	Token    string `json:"token"`
	Domain   string `json:"domain,omitempty"`
	// SizeMB is Airlock's extension: the volume's quota.
	SizeMB int64 `json:"sizeMB,omitempty"`
}

// VolumeContentPrefix starts every path of the volume content API
// (spec/openapi-volumecontent.yml upstream): /volumecontent/{volumeID}/path,
// /dir and /file, authorised by "Authorization: Bearer <volume token>".
const VolumeContentPrefix = "/volumecontent/"

// The types of a VolumeEntryStat.
const (
	VolumeEntryUnknown   = "unknown"
	VolumeEntryFile      = "file"
	VolumeEntryDirectory = "directory"
	VolumeEntrySymlink   = "symlink"
)

// VolumeEntryStat is a file or directory of a volume as the content API shows
// it. Path is the entry's path inside the volume, absolute ("/" is the
// volume's root); Target is a symlink's target as stored.
type VolumeEntryStat struct {
	Name   string    `json:"name"`
	Type   string    `json:"type"`
	Path   string    `json:"path"`
	Size   int64     `json:"size"`
	Mode   uint32    `json:"mode"`
	UID    uint32    `json:"uid"`
	GID    uint32    `json:"gid"`
	Atime  time.Time `json:"atime"`
	Mtime  time.Time `json:"mtime"`
	Ctime  time.Time `json:"ctime"`
	Target string    `json:"target,omitempty"`
}

// VolumeMetadata is the body of PATCH /volumecontent/{volumeID}/path: the
// fields to change (absent: unchanged).
type VolumeMetadata struct {
	UID  *uint32 `json:"uid,omitempty"`
	GID  *uint32 `json:"gid,omitempty"`
	Mode *uint32 `json:"mode,omitempty"`
}

// VolumeContentError is the content API's error body. Unlike the control
// plane's Error, upstream's volume content spec makes code a string (the
// HTTP status in decimal); the SDKs read only message.
type VolumeContentError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}
