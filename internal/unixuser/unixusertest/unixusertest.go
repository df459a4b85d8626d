// Package unixusertest makes a fake sandbox root for tests that run processes
// as a sandbox's users without those accounts existing on the host: a temp
// dir with etc/passwd, etc/group and the users' homes.
package unixusertest

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// Root is a fake sandbox root: root (uid 0, home RootHome), user (uid 1000,
// home Home, in group sudo) and nobody; groups root, sudo (27), user (1000)
// and nogroup.
type Root struct {
	Dir      string // the root directory (what EtcUserDB.Root takes)
	Home     string // /home/user inside Dir, owned by uid 1000
	RootHome string // /root inside Dir
}

// New makes a Root in a temp dir of t. It needs root (it chowns), which the
// caller checks first.
func New(t testing.TB) Root {
	t.Helper()
	dir := t.TempDir()
	// uid 1000 must be able to reach its home through the temp dirs.
	for p := dir; p != os.TempDir() && p != "/"; p = filepath.Dir(p) {
		must(t, os.Chmod(p, 0o755))
	}
	r := Root{Dir: dir, Home: filepath.Join(dir, "home", "user"), RootHome: filepath.Join(dir, "root")}
	must(t, os.MkdirAll(filepath.Join(dir, "etc"), 0o755))
	must(t, os.MkdirAll(r.Home, 0o755))
	must(t, os.MkdirAll(r.RootHome, 0o700))
	must(t, os.Chown(r.Home, 1000, 1000))
	must(t, os.WriteFile(filepath.Join(dir, "etc/passwd"), []byte(fmt.Sprintf(
		"root:x:0:0:root:%s:/bin/bash\nuser:x:1000:1000::%s:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
		r.RootHome, r.Home)), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "etc/group"), []byte(
		"root:x:0:\nsudo:x:27:user\nuser:x:1000:\nnogroup:x:65534:\n"), 0o644))
	return r
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
