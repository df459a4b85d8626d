package acmecert

import (
	"fmt"
	"slices"
	"strings"

	"github.com/go-acme/lego/v4/challenge"
	"github.com/go-acme/lego/v4/providers/dns/acmedns"
	"github.com/go-acme/lego/v4/providers/dns/cloudflare"
	"github.com/go-acme/lego/v4/providers/dns/desec"
	"github.com/go-acme/lego/v4/providers/dns/digitalocean"
	"github.com/go-acme/lego/v4/providers/dns/duckdns"
	"github.com/go-acme/lego/v4/providers/dns/exec"
	"github.com/go-acme/lego/v4/providers/dns/gandiv5"
	"github.com/go-acme/lego/v4/providers/dns/hetzner"
	"github.com/go-acme/lego/v4/providers/dns/httpreq"
	"github.com/go-acme/lego/v4/providers/dns/linode"
	"github.com/go-acme/lego/v4/providers/dns/ovh"
	"github.com/go-acme/lego/v4/providers/dns/pdns"
	"github.com/go-acme/lego/v4/providers/dns/porkbun"
	"github.com/go-acme/lego/v4/providers/dns/rfc2136"
	"github.com/go-acme/lego/v4/providers/dns/route53"
)

// providers is the set of lego DNS providers Airlock is built with, by
// lego's own name. Each one reads its documented environment variables
// (https://go-acme.github.io/lego/dns/<name>/).
//
// lego's registry package (providers/dns) would link all of its ~190
// providers and their cloud SDKs into the airlock binary; this curated set
// covers the common public DNS hosts, the standard protocol (rfc2136 with
// TSIG, for BIND, Knot, PowerDNS, Windows DNS), acme-dns delegation, and two
// hooks (exec: run a script; httpreq: call a web hook) through which any
// other DNS host can be driven. Adding one is one line here; mind its
// weight: gcloud alone would add ~17 MB (Google API, gRPC, OpenTelemetry)
// to the binary, so Google Cloud DNS goes through exec with the gcloud CLI.
var providers = map[string]func() (challenge.Provider, error){
	"acme-dns":     func() (challenge.Provider, error) { return acmedns.NewDNSProvider() },
	"cloudflare":   func() (challenge.Provider, error) { return cloudflare.NewDNSProvider() },
	"desec":        func() (challenge.Provider, error) { return desec.NewDNSProvider() },
	"dnsupdate":    func() (challenge.Provider, error) { return rfc2136.NewDNSProvider() }, // lego's newer name for rfc2136
	"digitalocean": func() (challenge.Provider, error) { return digitalocean.NewDNSProvider() },
	"duckdns":      func() (challenge.Provider, error) { return duckdns.NewDNSProvider() },
	"exec":         func() (challenge.Provider, error) { return exec.NewDNSProvider() },
	"gandiv5":      func() (challenge.Provider, error) { return gandiv5.NewDNSProvider() },
	"hetzner":      func() (challenge.Provider, error) { return hetzner.NewDNSProvider() },
	"httpreq":      func() (challenge.Provider, error) { return httpreq.NewDNSProvider() },
	"linode":       func() (challenge.Provider, error) { return linode.NewDNSProvider() },
	"ovh":          func() (challenge.Provider, error) { return ovh.NewDNSProvider() },
	"pdns":         func() (challenge.Provider, error) { return pdns.NewDNSProvider() },
	"porkbun":      func() (challenge.Provider, error) { return porkbun.NewDNSProvider() },
	"rfc2136":      func() (challenge.Provider, error) { return rfc2136.NewDNSProvider() },
	"route53":      func() (challenge.Provider, error) { return route53.NewDNSProvider() },
}

// DNSProviders lists the names accepted in Config.DNSProvider, sorted.
func DNSProviders() []string {
	names := make([]string, 0, len(providers))
	for n := range providers {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// newProvider builds the named provider from its environment variables.
func newProvider(name string) (challenge.Provider, error) {
	name = strings.ToLower(strings.TrimSpace(name))
	mk, ok := providers[name]
	if !ok {
		return nil, fmt.Errorf("acmecert: unknown DNS provider %q: use one of %s (exec and httpreq drive any other DNS host through a script or a web hook)",
			name, strings.Join(DNSProviders(), ", "))
	}
	p, err := mk()
	if err != nil {
		if name == "dnsupdate" {
			name = "rfc2136" // its page in lego's documentation
		}
		return nil, fmt.Errorf("acmecert: DNS provider %q is not configured: set the environment variables listed at https://go-acme.github.io/lego/dns/%s/ : %w",
			name, name, err)
	}
	return p, nil
}
