package tplbuild

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// A COPY whose source is a symlink the SDK uploaded alone (copy of a link
// without resolveSymlinks) is a 400 that says what to do, not a build that
// fails on "no match"; the same link matched by a pattern is fine.
func TestCopyOfALinkSource(t *testing.T) {
	s, fb := newService(t, t.TempDir())
	defer s.Close()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	if err := tw.WriteHeader(&tar.Header{Name: "l/link.txt", Typeflag: tar.TypeSymlink, Linkname: "t.txt", Mode: 0o777}); err != nil {
		t.Fatal(err)
	}
	tw.Close()
	gz.Close()
	hashOf := func(src, dest string) string {
		h := sha256.New()
		fmt.Fprintf(h, "COPY %s %sl/link.txt%d%dt.txt", src, dest, sIFLNK|0o777, len("t.txt"))
		return hex.EncodeToString(h.Sum(nil))
	}

	tpl, id, _ := s.Request(Request{Name: "links"})
	plain := hashOf("l/link.txt", "/opt/x.txt")
	if err := s.PutFile("", plain, bytes.NewReader(buf.Bytes())); err != nil {
		t.Fatal(err)
	}
	err := s.Start("", tpl, id, Spec{FromTemplate: "base", Steps: []Step{{Type: "COPY", Args: []string{"l/link.txt", "/opt/x.txt"}, FilesHash: plain}}})
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "is a symlink (to t.txt)") || !strings.Contains(err.Error(), "resolveSymlinks") {
		t.Fatalf("copy of a link: %v", err)
	}

	// A refused start drops its build: the next one is a new request.
	tpl, id, _ = s.Request(Request{Name: "links"})
	pattern := hashOf("l/*", "/opt/l")
	if err := s.PutFile("", pattern, bytes.NewReader(buf.Bytes())); err != nil {
		t.Fatal(err)
	}
	if err := s.Start("", tpl, id, Spec{FromTemplate: "base", Steps: []Step{{Type: "COPY", Args: []string{"l/*", "/opt/l"}, FilesHash: pattern}}}); err != nil {
		t.Fatalf("a link matched by a pattern: %v", err)
	}
	req := <-fb.got
	if !strings.Contains(string(req.Dockerfile), `["`+pattern+`/l/","/opt/l/"]`) {
		t.Errorf("Dockerfile:\n%s", req.Dockerfile)
	}
	close(fb.release)
	waitStatus(t, s, tpl, id, "ready")
}
