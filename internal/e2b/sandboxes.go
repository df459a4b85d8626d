package e2b

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/e2bwire"
	"github.com/airlock-sandbox/airlock/internal/netpolicy"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/timing"
)

// Defaults that differ from Options.DefaultTimeout because upstream's schema
// says so; the SDKs always send a value, so these only matter to raw clients.
const (
	// v1CreateDefaultTimeout is NewSandbox.timeout's schema default.
	v1CreateDefaultTimeout = 15 * time.Second
	// resumeDefaultTimeout is ResumedSandbox.timeout's schema default.
	resumeDefaultTimeout = 15 * time.Second
	// refreshDefaultDuration keeps a sandbox alive for a minute when a
	// refresh names no duration.
	refreshDefaultDuration = 60 * time.Second
	// refreshMaxDuration is SandboxRefreshRequest.duration's schema maximum.
	refreshMaxDuration = time.Hour
)

func (h *Handler) createV1(w http.ResponseWriter, r *http.Request) error {
	return h.create(w, r, false)
}

// createV2 serves JS 2.51+, which never sends "secure": v2 sandboxes always
// get an envd access token.
func (h *Handler) createV2(w http.ResponseWriter, r *http.Request) error {
	return h.create(w, r, true)
}

func (h *Handler) create(w http.ResponseWriter, r *http.Request, v2 bool) error {
	var body e2bwire.NewSandbox
	present, err := h.decodeBody(w, r, &body)
	if err != nil {
		return err
	}
	if !present {
		return badRequest("request body is required: {\"templateID\": ...}")
	}
	if strings.TrimSpace(body.TemplateID) == "" {
		return badRequest("templateID is required")
	}
	rule := timeoutRule{field: "timeout", def: v1CreateDefaultTimeout}
	if v2 {
		rule.def = h.opts.DefaultTimeout
	}
	timeout, err := h.timeout(body.Timeout, rule)
	if err != nil {
		return err
	}
	metadata, err := stringMap("metadata", body.Metadata)
	if err != nil {
		return err
	}
	envVars, err := stringMap("envVars", body.EnvVars)
	if err != nil {
		return err
	}
	req := sandbox.CreateRequest{
		Template:            body.TemplateID,
		Timeout:             timeout,
		Metadata:            metadata,
		EnvVars:             envVars,
		AllowInternetAccess: body.AllowInternetAccess,
		Secure:              v2 || (body.Secure != nil && *body.Secure),
		Owner:               ownerFrom(r.Context()),
	}
	for _, vm := range body.VolumeMounts {
		// The manager checks each (path, volume) and lists every bad one.
		req.VolumeMounts = append(req.VolumeMounts, sandbox.VolumeMount{Name: vm.Name, Path: vm.Path})
	}
	if body.DiskSizeMB != nil {
		if *body.DiskSizeMB <= 0 {
			return badRequest("diskSizeMB must be positive, got %d", *body.DiskSizeMB)
		}
		req.DiskSizeMB = *body.DiskSizeMB
	}
	if body.Network != nil {
		if err := validateNetwork(body.Network); err != nil {
			return err
		}
		req.AllowInternetAccess = h.egressFromNetwork(body.Network, req.AllowInternetAccess)
		req.Network = &sandbox.NetworkConfig{
			AllowOut:           body.Network.AllowOut,
			DenyOut:            body.Network.DenyOut,
			AllowPublicTraffic: body.Network.AllowPublicTraffic,
		}
		if body.Network.MaskRequestHost != nil {
			req.Network.MaskRequestHost = *body.Network.MaskRequestHost
		}
		req.Network.Rules = rulesFromWire(body.Network.Rules)
		req.Network.EgressProxy = egressProxyFromWire(body.Network.EgressProxy)
	}
	if req.Lifecycle, err = lifecycleOf(&body); err != nil {
		return err
	}

	// Where the create's time went goes back as Server-Timing (the bench's
	// breakdown reads it; browsers' devtools show it).
	spans := &timing.Recorder{}
	begin := time.Now()
	// Another key's private template is not there for this key, but the
	// team's own snapshot of that name is (snapshot names are per team),
	// which only the manager's lookup can tell without a race.
	if h.opts.Templates != nil {
		if a, err := h.opts.Templates.Access(r.Context(), body.TemplateID); err == nil && !a.visibleTo(req.Owner) {
			req.SnapshotOnly = true
		}
	}
	spans.Add("access", time.Since(begin))
	// Template may name a snapshot; the manager resolves it before templates.
	info, err := h.sbx(r.Context()).Create(timing.With(r.Context(), spans), req)
	if err != nil {
		return managerError(fmt.Errorf("create sandbox from %q: %w", body.TemplateID, err), "", body.TemplateID)
	}
	spans.Add("total", time.Since(begin))
	w.Header().Set("Server-Timing", timing.ServerTiming(spans.Spans()))
	noteTarget(r.Context(), "sandbox", info.ID)
	writeJSON(w, http.StatusCreated, h.sandboxJSON(r, info))
	return nil
}

// lifecycleOf reads create's autoPause, autoPauseMemory and autoResume
// (docs/E2B-WIRE.md §2.4). It refuses the combinations the SDKs refuse
// client-side, so that a raw client learns why instead of getting a sandbox
// that silently does something else at its timeout.
func lifecycleOf(body *e2bwire.NewSandbox) (sandbox.Lifecycle, error) {
	lc := sandbox.Lifecycle{OnTimeout: sandbox.OnTimeoutKill}
	pause := body.AutoPause != nil && *body.AutoPause
	if pause {
		lc.OnTimeout = sandbox.OnTimeoutPause
	}
	if m := body.AutoPauseMemory; m != nil {
		if !pause {
			// Upstream refuses only false here; true is refused too, because
			// either value says the client expects a pause that will not come.
			return lc, badRequest("autoPauseMemory only applies when autoPause is true: it chooses what the pause at the timeout keeps, and without autoPause the sandbox is killed at its timeout")
		}
		lc.DropMemory = !*m
	}
	if ar := body.AutoResume; ar != nil {
		switch {
		case ar.Enabled == nil:
			return lc, badRequest("autoResume.enabled is required (true or false)")
		case !*ar.Enabled:
		case !pause:
			return lc, badRequest("autoResume.enabled=true requires autoPause=true: only a sandbox paused at its timeout can be resumed by a request")
		case lc.DropMemory:
			return lc, badRequest("autoPauseMemory=false cannot be combined with autoResume.enabled=true: a filesystem-only pause cannot be resumed by traffic and must be resumed explicitly with connect")
		default:
			lc.AutoResume = true
		}
	}
	return lc, nil
}

// egressFromNetwork derives the allowInternetAccess a sandbox reports: false
// when denyOut holds ALL_TRAFFIC, unless the client said otherwise. The rules
// themselves go to the manager, which enforces allowOut and denyOut (allowOut
// first) whatever this switch says.
func (h *Handler) egressFromNetwork(n *e2bwire.SandboxNetworkConfig, explicit *bool) *bool {
	if explicit != nil {
		return explicit
	}
	if !containsString(n.DenyOut, allTraffic) {
		return nil
	}
	deny := false
	return &deny
}

// rulesFromWire converts network.rules; the manager validates them.
func rulesFromWire(in map[string][]e2bwire.SandboxNetworkRule) map[string][]netpolicy.Rule {
	if len(in) == 0 {
		return nil
	}
	out := make(map[string][]netpolicy.Rule, len(in))
	for host, rules := range in {
		rs := make([]netpolicy.Rule, 0, len(rules))
		for _, r := range rules {
			var nr netpolicy.Rule
			if r.Transform != nil {
				nr.Transform = &netpolicy.Transform{Headers: r.Transform.Headers}
			}
			rs = append(rs, nr)
		}
		out[host] = rs
	}
	return out
}

func egressProxyFromWire(p *e2bwire.EgressProxy) *netpolicy.EgressProxy {
	if p == nil {
		return nil
	}
	out := &netpolicy.EgressProxy{Address: strings.TrimSpace(p.Address)}
	if p.Username != nil {
		out.Username = *p.Username
	}
	if p.Password != nil {
		out.Password = *p.Password
	}
	return out
}

func (h *Handler) get(w http.ResponseWriter, r *http.Request) error {
	id, err := sandboxIDParam(r)
	if err != nil {
		return err
	}
	info, err := h.sbx(r.Context()).Get(r.Context(), id)
	if err != nil {
		return managerError(fmt.Errorf("get sandbox: %w", err), id, "")
	}
	writeJSON(w, http.StatusOK, h.detailJSON(r, info))
	return nil
}

func (h *Handler) kill(w http.ResponseWriter, r *http.Request) error {
	id, err := sandboxIDParam(r)
	if err != nil {
		return err
	}
	if err := h.sbx(r.Context()).Kill(r.Context(), id); err != nil {
		return managerError(fmt.Errorf("kill sandbox: %w", err), id, "")
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// connect serves ConnectSandbox (v1) and ConnectSandboxV2 alike. v1's schema
// marks timeout required, but a missing one gets the default rather than a
// 400: connect exists to bring a sandbox back, and refusing over a field the
// v2 schema made optional helps nobody.
func (h *Handler) connect(w http.ResponseWriter, r *http.Request) error {
	var body e2bwire.ConnectSandbox
	id, err := h.sandboxRequest(w, r, &body)
	if err != nil {
		return err
	}
	if err := checkResumeMemory(body.Memory); err != nil {
		return err
	}
	timeout, err := h.timeout(body.Timeout, timeoutRule{field: "timeout", def: h.opts.DefaultTimeout})
	if err != nil {
		return err
	}
	info, resumed, err := h.sbx(r.Context()).Connect(r.Context(), id, timeout)
	if err != nil {
		return managerError(fmt.Errorf("connect sandbox: %w", err), id, "")
	}
	status := http.StatusOK
	if resumed {
		status = http.StatusCreated
	}
	writeJSON(w, status, h.sandboxJSON(r, info))
	return nil
}

// checkResumeMemory refuses connect's and resume's memory=false (the JS
// SDK's onResume: "reboot"), which asks to boot a sandbox paused with its
// memory afresh from its filesystem. Airlock resumes a sandbox the way it
// was paused (docs/E2B-WIRE.md §2.7); upstream's schema requires a refusal,
// never a silent memory restore, where the choice is not offered.
func checkResumeMemory(memory *bool) error {
	if memory != nil && !*memory {
		return badRequest("memory=false is not supported: Airlock resumes a sandbox the way it was paused (with its memory, or from its filesystem alone when paused with memory=false); omit memory or send true")
	}
	return nil
}

// resume serves the deprecated POST /sandboxes/{id}/resume (JS 2.0–2.3),
// which unlike connect refuses a sandbox that is not paused.
func (h *Handler) resume(w http.ResponseWriter, r *http.Request) error {
	var body e2bwire.ConnectSandbox
	id, err := h.sandboxRequest(w, r, &body)
	if err != nil {
		return err
	}
	if err := checkResumeMemory(body.Memory); err != nil {
		return err
	}
	timeout, err := h.timeout(body.Timeout, timeoutRule{field: "timeout", def: resumeDefaultTimeout})
	if err != nil {
		return err
	}
	info, err := h.sbx(r.Context()).Get(r.Context(), id)
	if err != nil {
		return managerError(fmt.Errorf("resume sandbox: %w", err), id, "")
	}
	if info.State != sandbox.StatePaused {
		return &apiError{status: http.StatusConflict, message: fmt.Sprintf("sandbox %q is already running", id)}
	}
	// Between Get and Connect another client may resume it first; the
	// sandbox is then running as asked, so that is still a success.
	info, _, err = h.sbx(r.Context()).Connect(r.Context(), id, timeout)
	if err != nil {
		return managerError(fmt.Errorf("resume sandbox: %w", err), id, "")
	}
	noteTarget(r.Context(), "sandbox", info.ID)
	writeJSON(w, http.StatusCreated, h.sandboxJSON(r, info))
	return nil
}

// setTimeout overwrites the sandbox's end. Zero is allowed, unlike on
// create: it means "end now", and the upstream Python suite relies on
// set_timeout(0) to expire a sandbox on purpose.
func (h *Handler) setTimeout(w http.ResponseWriter, r *http.Request) error {
	var body e2bwire.TimeoutRequest
	id, err := h.sandboxRequest(w, r, &body)
	if err != nil {
		return err
	}
	d, err := h.timeout(body.Timeout, timeoutRule{field: "timeout", allowZero: true})
	if err != nil {
		return err
	}
	if err := h.sbx(r.Context()).SetTimeout(r.Context(), id, d); err != nil {
		return managerError(fmt.Errorf("set sandbox timeout: %w", err), id, "")
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// refresh keeps a running sandbox alive for at least duration from now,
// never shortening it — upstream's keep-alive semantics. It is built from
// Get + SetTimeout rather than Connect because a refresh must not resume a
// paused sandbox.
func (h *Handler) refresh(w http.ResponseWriter, r *http.Request) error {
	var body e2bwire.RefreshRequest
	id, err := h.sandboxRequest(w, r, &body)
	if err != nil {
		return err
	}
	d := refreshDefaultDuration
	if body.Duration != nil {
		s := *body.Duration
		if s < 0 || s > int64(refreshMaxDuration/time.Second) {
			return badRequest("duration must be between 0 and %d seconds", int64(refreshMaxDuration/time.Second))
		}
		d = time.Duration(s) * time.Second
	}
	if d > h.opts.MaxTimeout {
		d = h.opts.MaxTimeout
	}
	info, err := h.sbx(r.Context()).Get(r.Context(), id)
	if err != nil {
		return managerError(fmt.Errorf("refresh sandbox: %w", err), id, "")
	}
	if info.State == sandbox.StatePaused {
		return &apiError{status: http.StatusConflict, message: fmt.Sprintf("sandbox %q is paused; connect to resume it", id)}
	}
	if time.Now().Add(d).After(info.EndAt) {
		if err := h.sbx(r.Context()).SetTimeout(r.Context(), id, d); err != nil {
			return managerError(fmt.Errorf("refresh sandbox: %w", err), id, "")
		}
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// pause saves a running sandbox to disk (docs/E2B-WIRE.md §2.7): with its
// memory by default, its filesystem alone with {"memory": false}. 409 when
// already paused, which the SDKs' pause() reads as false.
func (h *Handler) pause(w http.ResponseWriter, r *http.Request) error {
	var body e2bwire.PauseRequest
	id, err := h.sandboxRequest(w, r, &body)
	if err != nil {
		return err
	}
	opts := sandbox.PauseOptions{DropMemory: body.Memory != nil && !*body.Memory}
	if err := h.sbx(r.Context()).Pause(r.Context(), id, opts); err != nil {
		return managerError(fmt.Errorf("pause sandbox: %w", err), id, "")
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// metrics returns the samples between start and end (unix seconds, both
// optional). With neither, every retained sample comes back, which is what
// the SDK's getMetrics() without arguments expects.
func (h *Handler) metrics(w http.ResponseWriter, r *http.Request) error {
	id, err := sandboxIDParam(r)
	if err != nil {
		return err
	}
	q := r.URL.Query()
	start, err := unixParam(q.Get("start"), "start", time.Time{})
	if err != nil {
		return err
	}
	end, err := unixParam(q.Get("end"), "end", time.Now())
	if err != nil {
		return err
	}
	if end.Before(start) {
		return badRequest("end (%d) is before start (%d)", end.Unix(), start.Unix())
	}
	samples, err := h.sbx(r.Context()).Metrics(r.Context(), id, start, end)
	if err != nil {
		return managerError(fmt.Errorf("sandbox metrics: %w", err), id, "")
	}
	out := make([]e2bwire.SandboxMetric, 0, len(samples))
	for _, m := range samples {
		out = append(out, metricJSON(m))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// unixBound keeps parsed times inside what RFC 3339 (and so JSON) can carry.
const unixBound = 253402300799 // 9999-12-31T23:59:59Z

func unixParam(v, name string, def time.Time) (time.Time, error) {
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return time.Time{}, badRequest("%s must be a unix timestamp in seconds, got %q", name, v)
	}
	if n < 0 {
		n = 0
	}
	if n > unixBound {
		n = unixBound
	}
	return time.Unix(n, 0), nil
}

// updateNetwork replaces a running sandbox's egress rules
// (SandboxNetworkUpdateConfig) and answers 204; the firewall changes
// atomically before the answer.
func (h *Handler) updateNetwork(w http.ResponseWriter, r *http.Request) error {
	var body e2bwire.SandboxNetworkConfig
	id, err := h.sandboxRequest(w, r, &body)
	if err != nil {
		return err
	}
	if err := validateNetwork(&body); err != nil {
		return err
	}
	upd := sandbox.NetworkUpdate{
		AllowOut: body.AllowOut, DenyOut: body.DenyOut, AllowInternetAccess: body.AllowInternetAccess,
		Rules: rulesFromWire(body.Rules), EgressProxy: egressProxyFromWire(body.EgressProxy),
	}
	if err := h.sbx(r.Context()).UpdateNetwork(r.Context(), id, upd); err != nil {
		return managerError(fmt.Errorf("update sandbox network: %w", err), id, "")
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
