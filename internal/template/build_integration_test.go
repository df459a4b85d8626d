package template

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestBuildBase runs the real debootstrap and chroot steps of the built-in base template.
// It needs root, debootstrap and a reachable Debian mirror, and takes a minute or two,
// so it only runs with AIRLOCK_TEST_BUILD=1. A second run reuses the cached build.
func TestBuildBase(t *testing.T) {
	if os.Getenv("AIRLOCK_TEST_BUILD") != "1" {
		t.Skip("set AIRLOCK_TEST_BUILD=1 to build the real base template (root, network, ~2 min)")
	}
	if os.Geteuid() != 0 {
		t.Skip("building templates needs root")
	}
	dataDir := os.Getenv("AIRLOCK_TEST_DATA_DIR")
	if dataDir == "" {
		dataDir = "/var/lib/airlock-test"
	}
	s, err := Open(Options{DataDir: dataDir})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	start := time.Now()
	tmpl, err := s.Ensure(ctx, "base", os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Ensure(base) took %s: %s (%d MB, mirror %s)", time.Since(start).Round(time.Second), tmpl.RootFS, tmpl.SizeBytes/1e6, s.Mirror())

	if tmpl.ID != "base" || !tmpl.Ready || tmpl.Settings.DefaultUser != "user" || tmpl.Settings.CPUCount != 2 ||
		tmpl.Settings.MemoryMB != 512 || tmpl.Settings.DiskSizeMB != 1024 {
		t.Errorf("unexpected template: %+v", tmpl)
	}
	for _, p := range []string{"usr/bin/python3", "usr/bin/node", "usr/bin/git", "usr/bin/curl", "usr/bin/sudo", "bin/bash", "usr/bin/ps"} {
		st, err := os.Stat(filepath.Join(tmpl.RootFS, p))
		if err != nil || st.Mode()&0o111 == 0 {
			t.Errorf("/%s missing or not executable: %v", p, err)
		}
	}
	if !hasPasswdEntry(t, filepath.Join(tmpl.RootFS, "etc/passwd"), "user:x:1000:1000:", ":/home/user:/bin/bash") {
		t.Error("etc/passwd has no user with uid 1000, home /home/user and shell /bin/bash")
	}
	sudoers, err := os.ReadFile(filepath.Join(tmpl.RootFS, "etc/sudoers.d/user"))
	if err != nil || !strings.Contains(string(sudoers), "NOPASSWD: ALL") {
		t.Errorf("etc/sudoers.d/user: %q, %v", sudoers, err)
	}
	if st, err := os.Stat(filepath.Join(tmpl.RootFS, "home/user")); err != nil || st.Sys().(*syscall.Stat_t).Uid != 1000 {
		t.Errorf("home/user missing or not owned by uid 1000: %v", err)
	}
	if st, err := os.Stat(filepath.Join(tmpl.RootFS, "run/airlock")); err != nil || !st.IsDir() {
		t.Errorf("run/airlock is not a directory: %v", err)
	}
	if st, err := os.Stat(filepath.Join(tmpl.RootFS, "usr/local/bin/envd")); err != nil || !st.Mode().IsRegular() {
		t.Errorf("usr/local/bin/envd is not a file (mount point): %v", err)
	}
	if lists, _ := filepath.Glob(filepath.Join(tmpl.RootFS, "var/lib/apt/lists/*Packages*")); len(lists) > 0 {
		t.Errorf("apt lists left in the image: %v", lists)
	}
	if hosts, err := os.ReadFile(filepath.Join(tmpl.RootFS, "etc/hosts")); err != nil || !strings.Contains(string(hosts), "127.0.0.1 localhost") {
		t.Errorf("etc/hosts: %q, %v", hosts, err)
	}
	// The tools must run, not just exist: a missing shared library shows only here.
	for _, argv := range [][]string{{"/usr/bin/python3", "-c", "print(6*7)"}, {"/usr/bin/node", "-e", "console.log(6*7)"}} {
		out, err := exec.Command("chroot", append([]string{tmpl.RootFS}, argv...)...).CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "42" {
			t.Errorf("%s in the rootfs: %q, %v", argv[0], out, err)
		}
	}
	// The runtime gives each sandbox its own hostname; sudo must not complain that it
	// can't resolve it, nor wait on DNS for it.
	script := "hostname sbx-integration-test && exec chroot --userspec=1000:1000 " + tmpl.RootFS + " /usr/bin/sudo -n id -u"
	out, err := exec.Command("unshare", "--uts", "sh", "-c", script).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "0" {
		t.Errorf("sudo as user under another hostname: %q, %v", out, err)
	}
	if _, err := os.Stat(tmpl.BuildLog); err != nil {
		t.Errorf("build.log: %v", err)
	}

	got, err := s.Get("base")
	if err != nil || got.RootFS != tmpl.RootFS {
		t.Errorf("Get(base) = %+v, %v; want rootfs %s", got, err, tmpl.RootFS)
	}
}

func hasPasswdEntry(t *testing.T, path, prefix, suffix string) bool {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), prefix) && strings.HasSuffix(sc.Text(), suffix) {
			return true
		}
	}
	return false
}
