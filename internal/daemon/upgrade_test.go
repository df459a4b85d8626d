package daemon

// A checkpoint outlives an upgrade of Airlock: a sandbox paused with its
// memory, and a snapshot, taken by a server with one envd binary are restored
// by the next server, whose envd binary (at the same path, replaced in place
// as an upgrade does) is another build. CRIU refuses to restore a process
// whose mapped file changed build ID, so the restore must bind the envd the
// checkpoint was taken with (internal/sandbox/envdstore.go), while new
// sandboxes get the new one.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/e2bwire"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

func TestCheckpointSurvivesEnvdUpgrade(t *testing.T) {
	for _, rt := range []string{"linux", "gvisor"} {
		t.Run(rt, func(t *testing.T) { testEnvdUpgrade(t, rt) })
	}
}

func testEnvdUpgrade(t *testing.T, rt string) {
	h := newHost(t, rt)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	envd := filepath.Join(h.dir.Root, "envd-installed")
	old, err := os.ReadFile(testenv.EnvdBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(envd, old, 0o755); err != nil {
		t.Fatal(err)
	}
	h.start("AIRLOCK_ENVD=" + envd)
	s := h.newSandbox(ctx)
	snap, err := h.client().CreateSnapshot(ctx, s.id, "before-upgrade")
	if err != nil {
		t.Fatalf("snapshot %s: %v", s.id, err)
	}
	h.pause(ctx, s, true)
	if s.inRAM != nil {
		t.Fatalf("the pause left no checkpoint on disk: %v", s.inRAM)
	}
	h.stop()

	upgraded := withOtherBuildID(t, old)
	// In place, as `install` or a package manager's cp would: same path,
	// same inode, new content.
	f, err := os.OpenFile(envd, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(upgraded); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	h.start("AIRLOCK_ENVD=" + envd)
	h.expectPaused(ctx, s)
	h.resume(ctx, s)
	h.checkState(ctx, s, "after an upgrade of envd")
	if len(s.gaps) > 0 {
		t.Fatalf("%s", strings.Join(s.gaps, "\n"))
	}
	b := h.backend()
	envdDigest := func(id string) string {
		return strings.Fields(run(ctx, t, b, id, "sha256sum /usr/local/bin/envd /usr/bin/sudo"))[0]
	}
	if got, want := envdDigest(s.id), digest(old); got != want {
		t.Errorf("the sandbox restored after the upgrade runs envd %s, want the one it was paused with (%s)", got, want)
	}

	timeout := int64(300)
	fromSnap, err := h.client().Create(ctx, e2bwire.NewSandbox{TemplateID: snap.SnapshotID, Timeout: &timeout})
	if err != nil {
		t.Fatalf("create from the snapshot taken before the upgrade: %v\nserver log:\n%s", err, tail(h.srv.log, 40))
	}
	h.ids[fromSnap.SandboxID] = true
	if out := run(ctx, t, b, fromSnap.SandboxID, fmt.Sprintf("tr '\\0' ' ' </proc/%d/cmdline", s.pid)); !strings.Contains(out, bgMarker) {
		t.Errorf("the sandbox from the snapshot taken before the upgrade lost its background process: %q", out)
	}
	if got, want := envdDigest(fromSnap.SandboxID), digest(old); got != want {
		t.Errorf("the sandbox from the snapshot runs envd %s, want the one the snapshot was taken with (%s)", got, want)
	}

	fresh, err := h.client().Create(ctx, e2bwire.NewSandbox{TemplateID: "base", Timeout: &timeout})
	if err != nil {
		t.Fatalf("create after the upgrade: %v", err)
	}
	h.ids[fresh.SandboxID] = true
	if got, want := envdDigest(fresh.SandboxID), digest(upgraded); got != want {
		t.Errorf("a sandbox created after the upgrade runs envd %s, want the upgraded one (%s)", got, want)
	}

	// Once nothing was started from the old envd, its copy goes at the next
	// start; the snapshot and the sandboxes still hold it until then.
	for _, id := range []string{s.id, fromSnap.SandboxID} {
		if err := h.client().Kill(ctx, id); err != nil {
			t.Fatalf("kill %s: %v", id, err)
		}
	}
	if err := h.client().DeleteSnapshot(ctx, snap.SnapshotID); err != nil {
		t.Fatalf("delete snapshot: %v", err)
	}
	h.stop()
	h.start("AIRLOCK_ENVD=" + envd)
	kept, err := os.ReadDir(h.dir.Envd())
	if err != nil {
		t.Fatal(err)
	}
	if len(kept) != 1 || !strings.HasPrefix(digest(upgraded), kept[0].Name()) {
		var names []string
		for _, k := range kept {
			names = append(names, k.Name())
		}
		t.Errorf("stored envd copies after the old one's last user went: %v; want only the upgraded one (%s)", names, digest(upgraded))
	}
}

// withOtherBuildID returns the ELF binary bin with its GNU build ID changed:
// the same program, as another build of it would be to CRIU.
func withOtherBuildID(t *testing.T, bin []byte) []byte {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		t.Fatal(err)
	}
	sec := f.Section(".note.gnu.build-id")
	if sec == nil {
		t.Fatal("envd has no GNU build ID note")
	}
	// The note: namesz, descsz, type (4 bytes each), "GNU\0", then the ID.
	const descOff = 16
	if sec.Size <= descOff {
		t.Fatalf("GNU build ID note of %d bytes", sec.Size)
	}
	out := bytes.Clone(bin)
	for i := sec.Offset + descOff; i < sec.Offset+sec.Size; i++ {
		out[i] ^= 0xff
	}
	return out
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
