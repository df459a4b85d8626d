package template

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// Claims: a name is its first key's; the operator's templates and the
// built-ins are nobody's to claim; a claim without a build can be given up,
// one with a build cannot; only the owner changes visibility.
func TestAccessClaims(t *testing.T) {
	s, err := Open(Options{DataDir: t.TempDir(), Mirror: "http://127.0.0.1:9/debian"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Claim("agent", "alice"); err != nil {
		t.Fatal(err)
	}
	if err := s.Claim("agent", "alice"); err != nil {
		t.Errorf("claiming one's own name again: %v", err)
	}
	if err := s.Claim("agent", "bob"); !errors.Is(err, ErrOwned) {
		t.Errorf("bob claims alice's name: %v", err)
	}
	if err := s.Claim("base", "bob"); !errors.Is(err, ErrOwned) {
		t.Errorf("claiming a built-in: %v", err)
	}
	if err := s.Claim("Bad Name", "bob"); !errors.Is(err, ErrInvalid) {
		t.Errorf("claiming a malformed name: %v", err)
	}
	// The first build failed: the name is free again, and leaves no dir.
	if err := s.Unclaim("agent", "bob"); err != nil {
		t.Fatal(err)
	}
	if err := s.Claim("agent", "bob"); !errors.Is(err, ErrOwned) {
		t.Errorf("someone else's Unclaim freed the name: %v", err)
	}
	if err := s.Unclaim("agent", "alice"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(s.dir, "agent")); !os.IsNotExist(err) {
		t.Errorf("an unclaimed name left its dir: %v", err)
	}

	// bob builds it: the claim stays with the template.
	if err := s.Claim("agent", "bob"); err != nil {
		t.Fatal(err)
	}
	if err := s.writeRecord(&record{Name: "agent", buildRecord: buildRecord{Key: "k"}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Unclaim("agent", "bob"); err != nil {
		t.Fatal(err)
	}
	tpl, err := s.Get("agent")
	if err != nil {
		t.Fatal(err)
	}
	if tpl.Access != (Access{Owner: "bob"}) || tpl.Access.VisibleTo("alice") || !tpl.Access.VisibleTo("bob") {
		t.Errorf("access of a built template: %+v", tpl.Access)
	}
	if err := s.SetPublic("agent", "alice", true); !errors.Is(err, ErrOwned) {
		t.Errorf("alice makes bob's template public: %v", err)
	}
	if err := s.SetPublic("agent", "bob", true); err != nil {
		t.Fatal(err)
	}
	if tpl, _ := s.Get("agent"); !tpl.Access.Public || !tpl.Access.VisibleTo("alice") {
		t.Errorf("after SetPublic: %+v", tpl.Access)
	}

	// A template the operator built has no owner: every key uses it, none
	// claims it or changes it.
	if err := s.writeRecord(&record{Name: "ops", buildRecord: buildRecord{Key: "k"}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Claim("ops", "alice"); !errors.Is(err, ErrOwned) {
		t.Errorf("claiming the operator's template: %v", err)
	}
	if err := s.SetPublic("ops", "alice", false); !errors.Is(err, ErrOwned) {
		t.Errorf("changing the operator's template: %v", err)
	}
	if tpl, _ := s.Get("ops"); !tpl.Access.VisibleTo("anyone") {
		t.Errorf("the operator's template: %+v", tpl.Access)
	}
}
