package mcp

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The volume tools: create_volume, list_volumes and delete_volume, E2B's
// Volume.create/list/destroy. A volume is persistent storage of the API key's
// that sandboxes mount by name (create_sandbox's volume_mounts).
//
// No tool shows a volume's token. It authorises the volume content API
// (reading and writing a volume's files without a sandbox), which no tool
// offers: an agent reaches the files through a sandbox that mounts the
// volume, so the token would only be a secret copied into the model's
// context and transcripts for nothing.

// VolumesBackend is a Backend that can manage volumes; HTTPBackend is one.
// The tools are offered only by backends that are, so that backends without
// volumes (tests' fakes) need not grow methods.
type VolumesBackend interface {
	// CreateVolume creates a volume; sizeMB 0 is the server's default size.
	CreateVolume(ctx context.Context, name string, sizeMB int64) (VolumeInfo, error)
	ListVolumes(ctx context.Context) ([]VolumeInfo, error)
	// GetVolume returns one volume with its size (which the list lacks).
	GetVolume(ctx context.Context, volumeID string) (VolumeInfo, error)
	// DeleteVolume destroys a volume and its files; force even while
	// sandboxes mount it.
	DeleteVolume(ctx context.Context, volumeID string, force bool) error
}

// VolumeInfo is one volume, without its token (see above). SizeMB is 0 when
// the answer did not say (the API's list does not).
type VolumeInfo struct {
	ID     string
	Name   string
	SizeMB int64
}

type createVolumeIn struct {
	Name   string `json:"name" jsonschema:"the volume's name, unique among your volumes: letters, digits, '_' and '-' only; create_sandbox mounts it by this name"`
	SizeMB int64  `json:"size_mb,omitempty" jsonschema:"the volume's size limit in MiB (default: the server's default; the server also has a maximum)"`
}

type volumeOut struct {
	VolumeID string `json:"volume_id" jsonschema:"pass this to delete_volume"`
	Name     string `json:"name" jsonschema:"pass this to create_sandbox's volume_mounts"`
	SizeMB   int64  `json:"size_mb,omitempty" jsonschema:"the volume's size limit in MiB"`
}

type listVolumesIn struct{}

type listVolumesOut struct {
	Volumes []volumeOut `json:"volumes"`
}

type getVolumeIn struct {
	VolumeID string `json:"volume_id" jsonschema:"id of the volume, from create_volume or list_volumes"`
}

type deleteVolumeIn struct {
	VolumeID string `json:"volume_id" jsonschema:"id of the volume, from create_volume or list_volumes"`
	Force    bool   `json:"force,omitempty" jsonschema:"delete it even while sandboxes mount it (they keep a mount of a deleted directory)"`
}

type deleteVolumeOut struct {
	VolumeID string `json:"volume_id"`
	Deleted  bool   `json:"deleted"`
}

func registerVolumeTools(s *mcp.Server, b VolumesBackend) {
	addTool(s, &mcp.Tool{
		Name: "create_volume",
		Description: "Create a volume: persistent storage that outlives sandboxes. Mount it into a sandbox with create_sandbox's volume_mounts ({name, path}); " +
			"what a sandbox writes under that path stays in the volume after the sandbox is killed, for the next sandbox that mounts it. " +
			"Returns the volume's id and name.",
		InputSchema: schemaFor[createVolumeIn](func(p map[string]*jsonschema.Schema) {
			p["name"].MinLength = jsonschema.Ptr(1)
			p["size_mb"].Minimum = jsonschema.Ptr(1.0)
		}),
		Annotations: annotate("Create a volume", hints{}),
	}, func(ctx context.Context, _ *mcp.CallToolRequest, in createVolumeIn) (*mcp.CallToolResult, volumeOut, error) {
		v, err := b.CreateVolume(ctx, in.Name, in.SizeMB)
		if err != nil {
			return nil, volumeOut{}, fmt.Errorf("create volume %q: %w", in.Name, err)
		}
		out := toVolumeOut(v)
		var size string
		if out.SizeMB > 0 {
			size = fmt.Sprintf(" (%d MiB)", out.SizeMB)
		}
		return textResult("Created volume %s%s with id %s. Mount it with create_sandbox's volume_mounts: [{\"name\": %q, \"path\": \"/mnt/%s\"}].",
			out.Name, size, out.VolumeID, out.Name, out.Name), out, nil
	})
	addTool(s, &mcp.Tool{
		Name:        "list_volumes",
		Description: "List your volumes (persistent storage sandboxes mount by name) with their ids and names.",
		Annotations: annotate("List volumes", hints{readOnly: true}),
	}, func(ctx context.Context, _ *mcp.CallToolRequest, _ listVolumesIn) (*mcp.CallToolResult, listVolumesOut, error) {
		vs, err := b.ListVolumes(ctx)
		if err != nil {
			return nil, listVolumesOut{}, fmt.Errorf("list volumes: %w", err)
		}
		out := listVolumesOut{Volumes: make([]volumeOut, 0, len(vs))}
		for _, v := range vs {
			out.Volumes = append(out.Volumes, toVolumeOut(v))
		}
		return textResult("%s", volumeTable(out.Volumes)), out, nil
	})
	addTool(s, &mcp.Tool{
		Name:        "get_volume",
		Description: "Get one volume's name and size limit (list_volumes shows ids and names only).",
		Annotations: annotate("Get a volume", hints{readOnly: true}),
	}, func(ctx context.Context, _ *mcp.CallToolRequest, in getVolumeIn) (*mcp.CallToolResult, volumeOut, error) {
		v, err := b.GetVolume(ctx, in.VolumeID)
		if err != nil {
			return nil, volumeOut{}, fmt.Errorf("get volume %s: %w", in.VolumeID, err)
		}
		out := toVolumeOut(v)
		return textResult("Volume %s (%s): %d MiB. Mount it with create_sandbox's volume_mounts: [{\"name\": %q, \"path\": \"/mnt/%s\"}].",
			out.Name, out.VolumeID, out.SizeMB, out.Name, out.Name), out, nil
	})
	addTool(s, &mcp.Tool{
		Name: "delete_volume",
		Description: "Delete a volume and every file in it, for good. Refused while sandboxes mount it (the error names them) unless force is set; " +
			"kill those sandboxes first if you can.",
		Annotations: annotate("Delete a volume", hints{destructive: true, idempotent: true}),
	}, func(ctx context.Context, _ *mcp.CallToolRequest, in deleteVolumeIn) (*mcp.CallToolResult, deleteVolumeOut, error) {
		if err := b.DeleteVolume(ctx, in.VolumeID, in.Force); err != nil {
			return nil, deleteVolumeOut{}, fmt.Errorf("delete volume %s: %w", in.VolumeID, err)
		}
		return textResult("Deleted volume %s.", in.VolumeID), deleteVolumeOut{VolumeID: in.VolumeID, Deleted: true}, nil
	})
}

func toVolumeOut(v VolumeInfo) volumeOut {
	return volumeOut{VolumeID: v.ID, Name: v.Name, SizeMB: v.SizeMB}
}

// volumeTable renders volumes for a person reading the transcript; programs
// read the structured content.
func volumeTable(vs []volumeOut) string {
	if len(vs) == 0 {
		return "No volumes. Create one with create_volume."
	}
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "VOLUME ID\tNAME")
	for _, v := range vs {
		fmt.Fprintf(w, "%s\t%s\n", v.VolumeID, v.Name)
	}
	_ = w.Flush()
	return strings.TrimRight(b.String(), "\n")
}

// CreateVolume implements VolumesBackend through POST /volumes. The answer's
// token is dropped here (see the top of this file).
func (h *HTTPBackend) CreateVolume(ctx context.Context, name string, sizeMB int64) (VolumeInfo, error) {
	v, err := h.c.CreateVolume(ctx, name, sizeMB)
	if err != nil {
		return VolumeInfo{}, err
	}
	return VolumeInfo{ID: v.VolumeID, Name: v.Name, SizeMB: v.SizeMB}, nil
}

// ListVolumes implements VolumesBackend through GET /volumes, which says no
// sizes (upstream's Volume has none); asking each volume for its size would
// also fetch its token, for one line of a listing.
func (h *HTTPBackend) ListVolumes(ctx context.Context) ([]VolumeInfo, error) {
	vs, err := h.c.ListVolumes(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]VolumeInfo, 0, len(vs))
	for _, v := range vs {
		out = append(out, VolumeInfo{ID: v.VolumeID, Name: v.Name})
	}
	return out, nil
}

// GetVolume implements VolumesBackend through GET /volumes/{id}; the
// answer's token is dropped here (see the top of this file).
func (h *HTTPBackend) GetVolume(ctx context.Context, id string) (VolumeInfo, error) {
	v, err := h.c.GetVolume(ctx, id)
	if err != nil {
		return VolumeInfo{}, err
	}
	return VolumeInfo{ID: v.VolumeID, Name: v.Name, SizeMB: v.SizeMB}, nil
}

// DeleteVolume implements VolumesBackend through DELETE /volumes/{id}.
func (h *HTTPBackend) DeleteVolume(ctx context.Context, id string, force bool) error {
	return h.c.DeleteVolume(ctx, id, force)
}
