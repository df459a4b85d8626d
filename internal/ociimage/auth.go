package ociimage

import (
	"fmt"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
)

// BasicAuthFor is a keychain that answers username and password for the
// registry that ref names, and the default keychain (the docker config
// file, else anonymous) for any other registry: credentials given for one
// image (the E2B SDK's fromImage(image, {username, password})) are not sent
// to another registry, a registry mirror included.
func BasicAuthFor(ref, username, password string) (authn.Keychain, error) {
	if username == "" || password == "" {
		return nil, fmt.Errorf("%w: registry credentials need a username and a password", ErrBadRef)
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrBadRef, ref, err)
	}
	return basicFor{registry: r.Context().RegistryStr(), auth: &authn.Basic{Username: username, Password: password}}, nil
}

type basicFor struct {
	registry string
	auth     authn.Authenticator
}

func (k basicFor) Resolve(res authn.Resource) (authn.Authenticator, error) {
	if res.RegistryStr() == k.registry {
		return k.auth, nil
	}
	return authn.DefaultKeychain.Resolve(res)
}
