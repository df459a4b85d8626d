//go:build !(cgo && seccomp)

package linux

// This backend refuses to build without seccomp. libcontainer silently skips
// the seccomp profile when it is built without cgo or without the `seccomp`
// build tag, which would leave every sandbox with the full syscall surface.
// Build with cgo and `-tags seccomp` (make build, scripts/test.sh and the
// bench do; libseccomp-dev comes from scripts/setup.sh), for example:
//
//	CGO_ENABLED=1 go build -tags seccomp ./cmd/airlock
//	go test -tags seccomp ./internal/runtime/...
var _ = thisPackageNeedsCgoAndTheSeccompBuildTag_buildWithTagsSeccomp
