package daemon

import (
	"context"
	"fmt"

	"github.com/airlock-sandbox/airlock/internal/secret"
)

// SecretConfig bounds secrets (serve --secrets-per-key). PerKey 0 means no
// limit.
type SecretConfig struct {
	PerKey int
}

// startSecrets opens the secret store over the database, with the key in
// the data dir (made on first start). It has nothing to stop: no closer.
func (d *Daemon) startSecrets(ctx context.Context) error {
	perKey := d.cfg.Secrets.PerKey
	if perKey == 0 {
		perKey = -1 // secret.Options reads 0 as its default, serve's flag as no limit
	}
	svc, err := secret.New(ctx, secret.Options{
		Store: d.Store, KeyFile: d.Layout.SecretsKey(), MaxPerOwner: perKey, Logger: d.log,
	})
	if err != nil {
		return fmt.Errorf("secrets: %w", err)
	}
	d.Secrets = svc
	return nil
}

// SecretResolver is what the egress proxy resolves secret placeholders with.
func (d *Daemon) SecretResolver() secret.Resolver { return d.Secrets }
