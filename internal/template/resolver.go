package template

import (
	"context"
	"errors"
	"fmt"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// Resolver is the store as the sandbox manager sees it: names and aliases resolve
// to a built template's rootfs, limits, image config and start/ready commands.
type Resolver struct{ Store *Store }

// Resolve implements sandbox.TemplateResolver.
func (r Resolver) Resolve(_ context.Context, name string) (sandbox.Template, error) {
	t, err := r.Store.Get(name)
	if errors.Is(err, ErrNotFound) {
		return sandbox.Template{}, fmt.Errorf("%w: %q", sandbox.ErrTemplateNotFound, name)
	}
	if errors.Is(err, ErrBuilding) {
		// Not the request's fault: it will work once the build is done, and the
		// error says when to retry (the API answers 503 with Retry-After).
		return sandbox.Template{}, err
	}
	if err != nil {
		return sandbox.Template{}, fmt.Errorf("%w: %w", sandbox.ErrInvalid, err)
	}
	return t.ForSandbox(), nil
}

// ForSandbox is what the sandbox manager needs of a template.
func (t Template) ForSandbox() sandbox.Template {
	st := t.Settings
	return sandbox.Template{
		ID:             t.ID,
		Alias:          t.Alias,
		Rootfs:         t.RootFS,
		CPUCount:       st.CPUCount,
		MemoryMB:       st.MemoryMB,
		DiskSizeMB:     st.DiskSizeMB,
		DefaultUser:    st.DefaultUser,
		DefaultWorkdir: st.DefaultWorkdir,
		Runtime:        st.Runtime,
		Env:            t.Config.Env,
		StartCmd:       st.StartCmd,
		ReadyCmd:       st.ReadyCmd,
		ReadyTimeout:   st.ReadyTimeout(),
		Kernels:        st.Kernels,
		BuildID:        t.BuildID,
	}
}
