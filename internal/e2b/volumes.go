package e2b

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/e2bwire"
	"github.com/airlock-sandbox/airlock/internal/volume"
)

// VolumeService keeps the volumes API keys create (volume.Service). Every
// method is scoped to an owner: another owner's volume is
// volume.ErrNotFound.
type VolumeService interface {
	Create(ctx context.Context, owner, name string, size int64) (volume.Volume, error)
	List(ctx context.Context, owner string) ([]volume.Volume, error)
	Get(ctx context.Context, owner, id string) (volume.Volume, error)
	Destroy(ctx context.Context, owner, id string, force bool) error
}

func (h *Handler) routeVolumes() {
	h.handle("POST /volumes", h.createVolume)
	h.handle("GET /volumes", h.listVolumes)
	h.handle("GET /volumes/{volumeID}", h.getVolume)
	h.handle("DELETE /volumes/{volumeID}", h.deleteVolume)
}

var errNoVolumes = &apiError{status: http.StatusNotImplemented, message: "volumes are not available on this server: they live on the disk pool (serve --disk-quota, the default)"}

func (h *Handler) createVolume(w http.ResponseWriter, r *http.Request) error {
	if h.opts.Volumes == nil {
		return errNoVolumes
	}
	var body e2bwire.NewVolume
	present, err := h.decodeBody(w, r, &body)
	if err != nil {
		return err
	}
	if !present || body.Name == "" {
		return badRequest("name is required: the volume's name (letters, digits, '_' and '-')")
	}
	var size int64
	if body.SizeMB != nil {
		if *body.SizeMB <= 0 || *body.SizeMB > 1<<40 {
			return badRequest("sizeMB must be a positive number of MiB")
		}
		size = *body.SizeMB << 20
	}
	v, err := h.opts.Volumes.Create(r.Context(), ownerFrom(r.Context()), body.Name, size)
	if err != nil {
		return volumeError(err, "")
	}
	noteTarget(r.Context(), "volume", v.ID)
	writeJSON(w, http.StatusCreated, h.volumeAndToken(r, v))
	return nil
}

func (h *Handler) listVolumes(w http.ResponseWriter, r *http.Request) error {
	if h.opts.Volumes == nil {
		return errNoVolumes
	}
	vols, err := h.opts.Volumes.List(r.Context(), ownerFrom(r.Context()))
	if err != nil {
		return volumeError(err, "")
	}
	out := make([]e2bwire.Volume, 0, len(vols))
	for _, v := range vols {
		out = append(out, e2bwire.Volume{VolumeID: v.ID, Name: v.Name})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (h *Handler) getVolume(w http.ResponseWriter, r *http.Request) error {
	if h.opts.Volumes == nil {
		return errNoVolumes
	}
	id := r.PathValue("volumeID")
	v, err := h.opts.Volumes.Get(r.Context(), ownerFrom(r.Context()), id)
	if err != nil {
		return volumeError(err, id)
	}
	writeJSON(w, http.StatusOK, h.volumeAndToken(r, v))
	return nil
}

// deleteVolume answers 204, or 409 naming the sandboxes that mount the
// volume. ?force=true (Airlock's extension; upstream has no parameter)
// removes it even then.
func (h *Handler) deleteVolume(w http.ResponseWriter, r *http.Request) error {
	if h.opts.Volumes == nil {
		return errNoVolumes
	}
	id := r.PathValue("volumeID")
	force := false
	if s := r.URL.Query().Get("force"); s != "" {
		var err error
		if force, err = strconv.ParseBool(s); err != nil {
			return badRequest("force must be true or false, not %q", s)
		}
	}
	if err := h.opts.Volumes.Destroy(r.Context(), ownerFrom(r.Context()), id, force); err != nil {
		return volumeError(err, id)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (h *Handler) volumeAndToken(r *http.Request, v volume.Volume) e2bwire.VolumeAndToken {
	return e2bwire.VolumeAndToken{VolumeID: v.ID, Name: v.Name, Token: h.grant(r, v.Token), SizeMB: v.SizeBytes >> 20}
}

// volumeError maps the volume service's errors to statuses: upstream answers
// a taken name with 400 (not 409), and Airlock answers a used-up per-key
// allowance with 429 as it does the sandbox cap.
func volumeError(err error, id string) error {
	status := 0
	var sentinel error
	for _, m := range []struct {
		err    error
		status int
	}{
		{volume.ErrInvalid, http.StatusBadRequest},
		{volume.ErrExists, http.StatusBadRequest},
		{volume.ErrLimit, http.StatusTooManyRequests},
		{volume.ErrNoSpace, http.StatusInsufficientStorage},
		{volume.ErrInUse, http.StatusConflict},
		{volume.ErrNotFound, http.StatusNotFound},
		{volume.ErrClosed, http.StatusServiceUnavailable},
	} {
		if errors.Is(err, m.err) {
			status, sentinel = m.status, m.err
			break
		}
	}
	switch {
	case status == http.StatusNotFound && id != "":
		return &apiError{status: status, message: fmt.Sprintf("volume %q not found", id), err: err}
	case status == http.StatusConflict:
		return &apiError{status: status, message: err.Error(), err: err}
	case status != 0:
		// The service's detail without the sentinel's generic prefix.
		return &apiError{status: status, message: strings.TrimPrefix(err.Error(), sentinel.Error()+": "), err: err}
	}
	return managerError(err, "", "")
}
