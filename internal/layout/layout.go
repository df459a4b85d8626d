// Package layout names every path under Airlock's data directory, so that the
// server's subsystems, the CLI and the sweeps that clean up after a crash
// (Recover, GC) agree on one map instead of string literals in each package:
//
//	<data-dir>/
//	  serve.lock          flock of the one server using this data dir
//	  api-key             the generated API key (when AIRLOCK_API_KEY is unset)
//	  airlock.db          SQLite: the sandboxes' records
//	  secrets.key         the key secrets' values are sealed with in airlock.db
//	  sandboxes.img       btrfs image of the sandbox disk pool (--disk-quota)
//	  sandboxes/          one directory per sandbox (on the pool's mount), and
//	  sandboxes/<id>.log  its console log
//	  paused/<id>/        a paused sandbox's checkpoint image
//	  envd/<digest>       the envd binaries sandboxes run, by content
//	  network/            the sandbox network's state (address leases)
//	  runtime/<backend>/  each isolation backend's state (linux, gvisor)
//	  templates/          built templates' records and root filesystems
//	  layers/             the template builder's layer cache
//	  build/              build sandboxes' scratch space
//
// It only names paths; who creates, locks and removes each one is said where
// it is used. Paths inside a sandbox (envd's binary, /run/airlock) belong to
// the host↔envd contract, not here.
package layout

import "path/filepath"

// DefaultRoot is the data directory of `airlock serve` without --data-dir.
const DefaultRoot = "/var/lib/airlock"

// DataDir is one data directory. Root should be absolute: the paths derived
// from it are handed to runtimes and to processes with other working
// directories.
type DataDir struct{ Root string }

// ServeLock is the file a server holds an exclusive flock on while it runs.
func (d DataDir) ServeLock() string { return filepath.Join(d.Root, "serve.lock") }

// APIKey holds the key a server generated for itself.
func (d DataDir) APIKey() string { return filepath.Join(d.Root, "api-key") }

// DB is the SQLite database of sandbox records.
func (d DataDir) DB() string { return filepath.Join(d.Root, "airlock.db") }

// SecretsKey holds the AES-256 key the secrets' values in the database are
// sealed with (made once, 0600; internal/secret).
func (d DataDir) SecretsKey() string { return filepath.Join(d.Root, "secrets.key") }

// SandboxImage is the btrfs image file of the disk-quota pool.
func (d DataDir) SandboxImage() string { return filepath.Join(d.Root, "sandboxes.img") }

// Sandboxes holds every sandbox's directory (the disk pool is mounted here).
func (d DataDir) Sandboxes() string { return filepath.Join(d.Root, "sandboxes") }

// Sandbox is one sandbox's directory.
func (d DataDir) Sandbox(id string) string { return filepath.Join(d.Sandboxes(), id) }

// SandboxLog is one sandbox's console log, beside (not inside) its directory
// so it survives the directory's removal until the record goes.
func (d DataDir) SandboxLog(id string) string { return filepath.Join(d.Sandboxes(), id+".log") }

// Paused holds what a paused sandbox keeps outside its directory: the
// checkpoint of its processes (PausedMemory), when it was paused with them.
func (d DataDir) Paused(id string) string { return filepath.Join(d.AllPaused(), id) }

// AllPaused is the directory of every sandbox's Paused.
func (d DataDir) AllPaused() string { return filepath.Join(d.Root, "paused") }

// PausedMemory is the checkpoint image of a sandbox paused with its memory;
// it counts only once PausedComplete exists beside it.
func (d DataDir) PausedMemory(id string) string { return filepath.Join(d.Paused(id), "memory") }

// PausedComplete marks PausedMemory as whole: written after the checkpoint
// succeeded, so a crash during one leaves no image that looks usable.
func (d DataDir) PausedComplete(id string) string { return filepath.Join(d.Paused(id), "complete") }

// Envd holds the envd binaries sandboxes were booted with, each named by a
// digest of its content and never changed: a checkpoint maps the binary it
// was taken with, and is restored with that one, not with whatever envd the
// server runs by then (CRIU refuses a file whose build ID changed).
func (d DataDir) Envd() string { return filepath.Join(d.Root, "envd") }

// Network is the sandbox network's state directory.
func (d DataDir) Network() string { return filepath.Join(d.Root, "network") }

// Egress holds the egress CA (ca.pem with its key, 0600; ca.crt) and the
// sandbox trust stores that include it (bundles/).
func (d DataDir) Egress() string { return filepath.Join(d.Root, "egress") }

// DomainTLS holds serve --domain's own CA (ca.pem with its key, 0600;
// ca.crt), the certificate it issued for the domain (leaf.pem, 0600) and the
// system trust store with the CA added (bundle.crt), for clients. Never the
// egress CA: the two are separate keys.
func (d DataDir) DomainTLS() string { return filepath.Join(d.Root, "tls") }

// Runtime is the state directory of the isolation backend name.
func (d DataDir) Runtime(name string) string { return filepath.Join(d.Root, "runtime", name) }

// Templates holds the built templates (template.Store).
func (d DataDir) Templates() string { return filepath.Join(d.Root, "templates") }

// Layers is the template builder's layer cache.
func (d DataDir) Layers() string { return filepath.Join(d.Root, "layers") }

// TemplateBuilds holds the records of template builds asked for through the
// E2B API (<id>.json) and each running build's context (<id>/).
func (d DataDir) TemplateBuilds() string { return filepath.Join(d.Root, "template-builds") }

// TemplateFiles holds the files clients uploaded for those builds, by hash.
func (d DataDir) TemplateFiles() string { return filepath.Join(d.Root, "template-files") }

// Build is the build sandboxes' state (their runtime, network and scratch).
func (d DataDir) Build() string { return filepath.Join(d.Root, "build") }
