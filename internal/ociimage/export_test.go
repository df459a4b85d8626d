package ociimage

import "net/netip"

// RestrictionAllows exposes Restriction.allows to the tests.
func RestrictionAllows(r *Restriction, a netip.Addr) bool { return r.allows(a) }
