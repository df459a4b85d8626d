package sysservice

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// Install and Uninstall on a root directory of the test's own (systemctl
// --root), checked with systemd's own unit verifier. This machine kind runs
// no systemd as init, so starting the unit is not tested here.
func TestInstallUninstall(t *testing.T) {
	testenv.NeedRoot(t)
	for _, tool := range []string{"systemctl", "systemd-analyze"} {
		if _, err := exec.LookPath(tool); err != nil {
			testenv.Missing(t, "%s not found (Debian's systemd package)", tool)
		}
	}
	root := t.TempDir()
	bin, envd := "/bin/true", "/bin/false" // absolute, and there
	o := Options{Root: root, Binary: bin, Envd: envd, APIKey: "e2b_secret",
		ServeArgs: []string{"--data-dir", "/var/lib/air lock", "--domain", "ex%ample$HOME"}}
	did, err := Install(o)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(did, "enabled") || !strings.Contains(did, "next boot of the system under "+root) {
		t.Errorf("Install said %q", did)
	}
	unit, err := os.ReadFile(UnitPath(root))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`ExecStart=/bin/true serve --data-dir "/var/lib/air lock" --domain ex%%ample$$HOME`,
		"Environment=AIRLOCK_ENVD=/bin/false",
		"EnvironmentFile=-/etc/default/airlock",
		"KillMode=process", "Restart=on-failure", "WantedBy=multi-user.target",
	} {
		if !strings.Contains(string(unit), want) {
			t.Errorf("the unit lacks %q:\n%s", want, unit)
		}
	}
	if strings.Contains(string(unit), "e2b_secret") {
		t.Error("the API key is in the unit, which anyone may read")
	}
	st, err := os.Stat(EnvFile(root))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("the environment file's mode is %04o, want 0600", st.Mode().Perm())
	}
	if b, _ := os.ReadFile(EnvFile(root)); string(b) != "AIRLOCK_API_KEY=e2b_secret\n" {
		t.Errorf("environment file: %q", b)
	}
	wants := filepath.Join(root, "etc/systemd/system/multi-user.target.wants", Name)
	if _, err := os.Lstat(wants); err != nil {
		t.Errorf("not enabled: %v", err)
	}
	out, err := exec.Command("systemd-analyze", "verify", UnitPath(root)).CombinedOutput()
	if err != nil || strings.Contains(string(out), "Unknown") || strings.Contains(string(out), "nvalid") ||
		strings.Contains(string(out), "Failed") {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}

	// Installing again replaces the unit (new flags) and leaves no
	// temporary file behind.
	o.ServeArgs = []string{"--warm-pool", "0"}
	o.APIKey = ""
	if _, err := Install(o); err != nil {
		t.Fatal(err)
	}
	if unit, _ := os.ReadFile(UnitPath(root)); !strings.Contains(string(unit), "ExecStart=/bin/true serve --warm-pool 0\n") {
		t.Errorf("the reinstalled unit:\n%s", unit)
	}
	entries, _ := os.ReadDir(filepath.Dir(UnitPath(root)))
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("a temporary file was left: %s", e.Name())
		}
	}

	if _, err := Uninstall(o); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{UnitPath(root), EnvFile(root), wants} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s is still there after Uninstall (%v)", p, err)
		}
	}
	if _, err := Uninstall(o); err == nil || !strings.Contains(err.Error(), "not installed") {
		t.Errorf("a second Uninstall: %v", err)
	}
}

func TestInstallRefusesRelativeOrMissingBinaries(t *testing.T) {
	root := t.TempDir()
	for _, o := range []Options{
		{Root: root, Binary: "airlock", Envd: "/bin/true"},
		{Root: root, Binary: "/bin/true", Envd: "/nonexistent/envd"},
	} {
		if _, err := Install(o); err == nil {
			t.Errorf("Install(%+v) succeeded", o)
		}
		if _, err := os.Stat(UnitPath(root)); !os.IsNotExist(err) {
			t.Errorf("a refused Install wrote the unit (%v)", err)
		}
	}
}

func TestQuote(t *testing.T) {
	for in, want := range map[string]string{
		"plain": "plain", "a b": `"a b"`, `a"b`: `"a\"b"`, "100%": "100%%", "$X": "$$X", "": `""`,
	} {
		if got := quote(in); got != want {
			t.Errorf("quote(%q) = %q, want %q", in, got, want)
		}
	}
}
