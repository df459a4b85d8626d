package sandbox

import (
	"context"
	"fmt"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/netpolicy"
)

// TrustBundlePath is the trust store a sandbox's TLS clients read (OpenSSL,
// curl, Python's ssl; Node and Python requests through the variables of
// trustEnv). With an egress CA it is bound read-only to a copy that adds it.
const TrustBundlePath = "/etc/ssl/certs/ca-certificates.crt"

// TrustStore makes the trust-store file for a template's root filesystem
// (egress.CA implements it); "" means the rootfs has no trust store.
type TrustStore interface {
	Bundle(rootfs string) (string, error)
}

// SecretChecker checks the secret markers (${e2b.secrets.<name>}) in the
// header values of network rules against the owner's secrets.
type SecretChecker interface {
	// Missing returns the first secret named in values that owner does not
	// have, or "".
	Missing(ctx context.Context, owner string, values []string) (string, error)
}

// trustEnv points the TLS clients that ignore the system store at it. A
// variable the template or the client set wins.
func trustEnv(env map[string]string) map[string]string {
	for _, k := range []string{"NODE_EXTRA_CA_CERTS", "REQUESTS_CA_BUNDLE"} {
		if _, ok := env[k]; !ok {
			if env == nil {
				env = map[string]string{}
			}
			env[k] = TrustBundlePath
		}
	}
	return env
}

// checkEgress refuses, with ErrInvalid, network rules and egress proxies
// this server cannot honour: no egress proxy running, a rule naming a
// secret the owner does not have, an egress proxy at an address sandboxes
// may not reach.
func (m *Manager) checkEgress(ctx context.Context, p netpolicy.Policy) error {
	if len(p.Rules) == 0 && p.EgressProxy == nil {
		return nil
	}
	if m.opts.Network == nil || !m.opts.Network.Intercepts() {
		return fmt.Errorf("%w: network rules and egressProxy need Airlock's egress proxy, which this server does not run (serve --sandbox-network)", ErrInvalid)
	}
	var values []string
	for _, rules := range p.Rules {
		for _, r := range rules {
			if r.Transform == nil {
				continue
			}
			for _, v := range r.Transform.Headers {
				values = append(values, v)
			}
		}
	}
	if len(values) > 0 {
		if m.opts.Secrets == nil {
			for _, v := range values {
				if strings.Contains(v, "${e2b.secrets.") {
					return fmt.Errorf("%w: network rules with secrets need the secret store, which this server does not have", ErrInvalid)
				}
			}
		} else if missing, err := m.opts.Secrets.Missing(ctx, p.Owner, values); err != nil {
			return fmt.Errorf("check secrets of network rules: %w", err)
		} else if missing != "" {
			return fmt.Errorf("%w: network rules: secret %q does not exist", ErrInvalid, missing)
		}
	}
	if p.EgressProxy != nil {
		if err := m.opts.Network.CheckEgressProxy(ctx, *p.EgressProxy); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalid, err)
		}
	}
	return nil
}
