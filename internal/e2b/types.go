package e2b

import (
	"github.com/airlock-sandbox/airlock/internal/apikey"
	"github.com/airlock-sandbox/airlock/internal/grant"
	"net/http"

	"github.com/airlock-sandbox/airlock/internal/e2bwire"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// Conversions from the manager's records to the wire types. The types live in
// e2bwire, which Airlock's own client (internal/e2bclient) reads them with.

// domain is the sandbox "domain" r's answer carries: the one the client used
// (Options.DomainFor), else Options.Domain; nil when there is none.
func (h *Handler) domain(r *http.Request) *string {
	d := h.opts.Domain
	if h.opts.DomainFor != nil {
		if v := h.opts.DomainFor(r); v != "" {
			d = v
		}
	}
	if d == "" {
		return nil
	}
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

// grant is what the request's key is given for a resource whose own
// token is secret: with Options.Grants the key's grant, else the token.
func (h *Handler) grant(r *http.Request, secret string) string {
	if !h.opts.Grants || secret == "" {
		return secret
	}
	return grant.Token(secret, principalFrom(r.Context()).KeyID)
}

func (h *Handler) sandboxJSON(r *http.Request, info sandbox.Info) e2bwire.Sandbox {
	return e2bwire.Sandbox{
		SandboxID:          info.ID,
		TemplateID:         info.TemplateID,
		Alias:              info.Alias,
		ClientID:           h.clientID(info),
		EnvdVersion:        h.envdVersion(info),
		EnvdAccessToken:    h.grant(r, info.AccessToken),
		TrafficAccessToken: info.TrafficAccessToken,
		Domain:             h.domain(r),
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

func (h *Handler) listedJSON(info sandbox.Info) e2bwire.ListedSandbox {
	md := info.Metadata
	if md == nil {
		md = map[string]string{}
	}
	return e2bwire.ListedSandbox{
		SandboxID:    info.ID,
		TemplateID:   info.TemplateID,
		Alias:        info.Alias,
		ClientID:     h.clientID(info),
		StartedAt:    info.StartedAt.UTC(),
		EndAt:        info.EndAt.UTC(),
		CPUCount:     info.CPUCount,
		MemoryMB:     info.MemoryMB,
		DiskSizeMB:   info.DiskSizeMB,
		State:        wireState(info.State),
		EnvdVersion:  h.envdVersion(info),
		Metadata:     md,
		VolumeMounts: volumeMountsJSON(info.VolumeMounts),
	}
}

// volumeMountsJSON is a sandbox's volumeMounts: never null.
func volumeMountsJSON(in []sandbox.VolumeMount) []e2bwire.SandboxVolumeMount {
	out := make([]e2bwire.SandboxVolumeMount, 0, len(in))
	for _, vm := range in {
		out = append(out, e2bwire.SandboxVolumeMount{Name: vm.Name, Path: vm.Path})
	}
	return out
}

// detailJSON is GET /sandboxes/{id}'s answer. Its tokens let their holder
// run commands and move files, so a key that may only read gets none.
func (h *Handler) detailJSON(r *http.Request, info sandbox.Info) e2bwire.SandboxDetail {
	envdToken, trafficToken := h.grant(r, info.AccessToken), info.TrafficAccessToken
	if !principalFrom(r.Context()).Has(apikey.SandboxesWrite) {
		envdToken, trafficToken = "", ""
	}
	return e2bwire.SandboxDetail{
		ListedSandbox:       h.listedJSON(info),
		EnvdAccessToken:     envdToken,
		TrafficAccessToken:  trafficToken,
		Domain:              h.domain(r),
		AllowInternetAccess: info.AllowInternetAccess,
		Network:             networkOf(info.Network),
		Lifecycle:           lifecycleJSON(info.Lifecycle),
	}
}

// lifecycleJSON is always sent, as upstream does: an empty OnTimeout is the
// manager's default, kill.
func lifecycleJSON(l sandbox.Lifecycle) *e2bwire.SandboxLifecycle {
	on := e2bwire.OnTimeoutKill
	if l.OnTimeout == sandbox.OnTimeoutPause {
		on = e2bwire.OnTimeoutPause
	}
	return &e2bwire.SandboxLifecycle{AutoResume: l.AutoResume, OnTimeout: on}
}

func networkOf(n sandbox.NetworkConfig) *e2bwire.SandboxNetworkConfig {
	if len(n.AllowOut) == 0 && len(n.DenyOut) == 0 && n.AllowPublicTraffic == nil && n.MaskRequestHost == "" &&
		len(n.Rules) == 0 && n.EgressProxy == nil {
		return nil
	}
	out := &e2bwire.SandboxNetworkConfig{AllowOut: n.AllowOut, DenyOut: n.DenyOut, AllowPublicTraffic: n.AllowPublicTraffic}
	if n.MaskRequestHost != "" {
		out.MaskRequestHost = &n.MaskRequestHost
	}
	if len(n.Rules) > 0 {
		out.Rules = make(map[string][]e2bwire.SandboxNetworkRule, len(n.Rules))
		for host, rules := range n.Rules {
			rs := make([]e2bwire.SandboxNetworkRule, 0, len(rules))
			for _, r := range rules {
				var wr e2bwire.SandboxNetworkRule
				if r.Transform != nil {
					wr.Transform = &e2bwire.SandboxNetworkTransform{Headers: r.Transform.Headers}
				}
				rs = append(rs, wr)
			}
			out.Rules[host] = rs
		}
	}
	if p := n.EgressProxy; p != nil {
		// The password is write-only, as upstream's info leaves it out.
		out.EgressProxy = &e2bwire.EgressProxy{Address: p.Address}
		if p.Username != "" {
			u := p.Username
			out.EgressProxy.Username = &u
		}
	}
	return out
}

func metricJSON(m sandbox.Metric) e2bwire.SandboxMetric {
	return e2bwire.SandboxMetric{
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
