package e2b

// Template tags (upstream OpenAPI tag "tags"): a tag names one build of a
// template; "name" alone is "name:default".
//
//	POST   /templates/tags               {target: "name[:tag]", tags} → 201 {tags, buildID}
//	DELETE /templates/tags               {name, tags} → 204
//	GET    /templates/{templateID}/tags  → 200 [{tag, buildID, createdAt}]

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/template"
)

// assignTemplateTagsRequest is the `AssignTemplateTagsRequest` schema.
type assignTemplateTagsRequest struct {
	Target string   `json:"target"`
	Tags   []string `json:"tags"`
}

// deleteTemplateTagsRequest is the `DeleteTemplateTagsRequest` schema.
type deleteTemplateTagsRequest struct {
	Name string   `json:"name"`
	Tags []string `json:"tags"`
}

// assignedTemplateTagsJSON is the `AssignedTemplateTags` schema.
type assignedTemplateTagsJSON struct {
	Tags    []string `json:"tags"`
	BuildID string   `json:"buildID"`
}

// templateTagJSON is the `TemplateTag` schema.
type templateTagJSON struct {
	Tag       string    `json:"tag"`
	BuildID   string    `json:"buildID"`
	CreatedAt time.Time `json:"createdAt"`
}

// checkTags validates a request's tags and drops duplicates, keeping order.
func checkTags(tags []string) ([]string, error) {
	if len(tags) == 0 {
		return nil, badRequest("At least one tag is required")
	}
	var out []string
	for _, t := range tags {
		if template.ValidTag(t) != nil {
			return nil, badRequest("Invalid tag %q: use 1 to 128 lower-case letters, digits, '.', '_' or '-'", t)
		}
		if !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return out, nil
}

// assignTemplateTags is POST /templates/tags: the build target names gets
// tags (moved from the builds they named).
func (h *Handler) assignTemplateTags(w http.ResponseWriter, r *http.Request) error {
	var req assignTemplateTagsRequest
	if _, err := h.decodeBody(w, r, &req); err != nil {
		return err
	}
	if req.Target == "" {
		return badRequest("target is required: the template, as \"name\" or \"name:tag\", whose build gets the tags")
	}
	target, err := checkTemplateRef(req.Target, "target template")
	if err != nil {
		return err
	}
	tags, err := checkTags(req.Tags)
	if err != nil {
		return err
	}
	if h.opts.Templates == nil {
		return errNoTemplates
	}
	if err := h.mayChange(r.Context(), target, "assign tags to "+target); err != nil {
		return err
	}
	buildID, err := h.opts.Templates.AssignTags(r.Context(), target, tags)
	if err != nil {
		return templateError("assign tags to "+target, err, "")
	}
	writeJSON(w, http.StatusCreated, assignedTemplateTagsJSON{Tags: tags, BuildID: buildID})
	return nil
}

// removeTemplateTags is DELETE /templates/tags. As upstream: the name has no
// tag, and "default" cannot be removed (a name alone must start something;
// assign "default" to another build to move it).
func (h *Handler) removeTemplateTags(w http.ResponseWriter, r *http.Request) error {
	var req deleteTemplateTagsRequest
	if _, err := h.decodeBody(w, r, &req); err != nil {
		return err
	}
	if req.Name == "" {
		return badRequest("name is required: the template whose tags are removed")
	}
	name, err := checkTemplateRef(req.Name, "template name")
	if err != nil {
		return err
	}
	if strings.Contains(name, ":") {
		return badRequest("Invalid template name %q: name the template without a tag and list the tags to remove in \"tags\"", name)
	}
	tags, err := checkTags(req.Tags)
	if err != nil {
		return err
	}
	if slices.Contains(tags, template.DefaultTag) {
		return badRequest("The tag %q cannot be removed: it is what the name alone starts; assign it to another build instead, or delete the template", template.DefaultTag)
	}
	if h.opts.Templates == nil {
		return errNoTemplates
	}
	if err := h.mayChange(r.Context(), name, "remove tags of "+name); err != nil {
		return err
	}
	if err := h.opts.Templates.RemoveTags(r.Context(), name, tags); err != nil {
		return templateError("remove tags of "+name, err, "")
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// templateTags is GET /templates/{templateID}/tags. A tag in the reference
// is ignored, as upstream does: the template's tags are listed.
func (h *Handler) templateTags(w http.ResponseWriter, r *http.Request) error {
	ref, err := templateRef(r, "templateID")
	if err != nil {
		return err
	}
	name, _, _ := strings.Cut(ref, ":")
	if h.opts.Templates == nil {
		return errNoTemplates
	}
	if _, err := h.visibleTemplate(r.Context(), name); err != nil {
		return templateError(fmt.Sprintf("list tags of %s", name), err, "")
	}
	tags, err := h.opts.Templates.Tags(r.Context(), name)
	if err != nil {
		return templateError(fmt.Sprintf("list tags of %s", name), err, "")
	}
	out := make([]templateTagJSON, 0, len(tags))
	for _, t := range tags {
		out = append(out, templateTagJSON{Tag: t.Tag, BuildID: t.BuildID, CreatedAt: t.CreatedAt.UTC()})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// mayChange checks that the request's API key owns the template ref names:
// another key's private template is not there (404), anything else that is
// not the key's (another key's public template, the operator's, a
// built-in) is protected (403).
func (h *Handler) mayChange(ctx context.Context, ref, op string) error {
	t, err := h.visibleTemplate(ctx, ref)
	if err != nil {
		return templateError(op, err, "")
	}
	switch t.Owner {
	case ownerFrom(ctx):
		return nil
	case "":
		return templateError(op, fmt.Errorf("template %q is the server operator's (a built-in, or built with `airlock template build`); an API key cannot change it: %w", ref, ErrTemplateProtected), "")
	}
	return templateError(op, fmt.Errorf("template %q belongs to another API key: %w", ref, ErrTemplateProtected), "")
}
