package sandbox

import (
	"debug/elf"
	"os"
	"path/filepath"

	"github.com/airlock-sandbox/airlock/internal/unixuser"
)

// A warm sandbox's first command is a login shell (the SDKs run every command
// through `bash -l -c`), and a sandbox's overlay root makes an inode for each
// file the first time the file is looked up in it: about 1 ms of the first
// command, measured, that a sandbox taken from the pool would pay after its
// claim. prewarmLoginShell looks those files up once from the host, through
// the same mount, while the sandbox waits in the pool. It only looks (stat):
// nothing in the sandbox changes, and nothing runs in it, so its processes
// and its log stay the client's alone.
func prewarmLoginShell(root, home string) {
	files := []string{
		"bin/bash", "usr/bin/bash", "bin/sh",
		"etc/ld.so.cache", "etc/passwd", "etc/group", "etc/nsswitch.conf",
		"etc/profile", "etc/bash.bashrc", "etc/environment",
	}
	if home = filepath.Clean("/" + home); home != "/" {
		for _, f := range []string{".bash_profile", ".bash_login", ".profile", ".bashrc"} {
			files = append(files, filepath.Join(home[1:], f))
		}
	}
	if ents, err := os.ReadDir(filepath.Join(root, "etc/profile.d")); err == nil {
		for _, e := range ents {
			files = append(files, filepath.Join("etc/profile.d", e.Name()))
		}
	}
	for _, f := range append(files, sharedLibs(root, "bin/bash")...) {
		_, _ = os.Stat(filepath.Join(root, f))
	}
}

// homeOf is user's home directory in the rootfs at root ("" when unknown:
// the default user is root's, or the rootfs has no such user).
func homeOf(root, user string) string {
	if user == "" {
		user = "root"
	}
	u, err := (&unixuser.EtcUserDB{Root: root}).LookupUser(user)
	if err != nil {
		return ""
	}
	return u.Home
}

// libDirs are where the dynamic loader of a Debian-like rootfs finds
// libraries.
var libDirs = []string{"lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu",
	"usr/lib/aarch64-linux-gnu", "lib64", "usr/lib64", "lib", "usr/lib"}

// sharedLibs returns the rootfs-relative paths of the loader and the
// libraries bin (rootfs-relative) needs directly, as found in libDirs.
func sharedLibs(root, bin string) []string {
	f, err := elf.Open(filepath.Join(root, bin))
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			b := make([]byte, prog.Filesz)
			if _, err := prog.ReadAt(b, 0); err == nil && len(b) > 1 {
				out = append(out, filepath.Clean(string(b[:len(b)-1]))[1:])
			}
		}
	}
	needed, _ := f.DynString(elf.DT_NEEDED)
	for _, lib := range needed {
		for _, d := range libDirs {
			p := filepath.Join(d, filepath.Base(lib))
			if _, err := os.Stat(filepath.Join(root, p)); err == nil {
				out = append(out, p)
				break
			}
		}
	}
	return out
}
