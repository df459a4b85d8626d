package template

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Who may use and change a template. Templates built through the E2B API
// belong to the API key that first built their name (its owner digest, see
// e2b.OwnerOf); other keys neither see nor use them unless they are public.
// Built-ins and templates the operator built with `airlock template build`
// have no owner: every key may use them, and none may change them.
//
// On disk, templates/<name>/access.json, beside template.json. It is written
// before the first build of a name starts (Claim), so two keys cannot race
// for a name, and outlives rebuilds; removing the template removes it.

// ErrOwned: the name belongs to another API key, or to the operator.
var ErrOwned = errors.New("template owned by another")

// Access is a template's owner and visibility.
type Access struct {
	// Owner is the owning API key's digest; empty for the operator's.
	Owner string `json:"owner,omitempty"`
	// Public lets every key use the template (not change it).
	Public bool `json:"public,omitempty"`
}

// VisibleTo reports whether owner may use a template with this access.
func (a Access) VisibleTo(owner string) bool {
	return a.Owner == "" || a.Public || a.Owner == owner
}

func (s *Store) accessPath(name string) string {
	return filepath.Join(s.dir, name, "access.json")
}

// readAccess returns a name's access; none on disk is the operator's.
func (s *Store) readAccess(name string) (Access, bool, error) {
	var a Access
	data, err := os.ReadFile(s.accessPath(name))
	if errors.Is(err, fs.ErrNotExist) {
		return a, false, nil
	}
	if err != nil {
		return a, false, fmt.Errorf("template %s: %w", name, err)
	}
	if err := json.Unmarshal(data, &a); err != nil {
		return a, false, fmt.Errorf("template %s: read %s: %w", name, s.accessPath(name), err)
	}
	return a, true, nil
}

func (s *Store) writeAccess(name string, a Access) error {
	data, err := json.Marshal(a)
	if err != nil {
		return err
	}
	return writeFileAtomic(s.accessPath(name), append(data, '\n'), 0o644)
}

// Claim makes owner the owner of name, unless someone else owns it: another
// key (ErrOwned), the operator (a template with no access.json, or a
// built-in: ErrOwned). Claiming a name one already owns is a no-op.
func (s *Store) Claim(name, owner string) error {
	if err := ValidName(name); err != nil {
		return err
	}
	if owner == "" {
		return fmt.Errorf("%w: claiming template %s needs an owner", ErrInvalid, name)
	}
	s.accessMu.Lock()
	defer s.accessMu.Unlock()
	if s.IsBuiltin(name) {
		return fmt.Errorf("%w: %s is a built-in template", ErrOwned, name)
	}
	a, claimed, err := s.readAccess(name)
	if err != nil {
		return err
	}
	if claimed {
		if a.Owner != owner {
			return fmt.Errorf("%w: template %s belongs to another API key", ErrOwned, name)
		}
		return nil
	}
	if _, err := os.Stat(s.recordPath(name)); err == nil {
		return fmt.Errorf("%w: template %s was built by the server's operator (`airlock template build`)", ErrOwned, name)
	}
	return s.writeAccess(name, Access{Owner: owner})
}

// Unclaim gives up owner's claim on a name that never got a build (its first
// build failed or was cancelled), so the name is free again. A built
// template keeps its owner.
func (s *Store) Unclaim(name, owner string) error {
	if ValidName(name) != nil {
		return nil
	}
	s.accessMu.Lock()
	defer s.accessMu.Unlock()
	a, claimed, err := s.readAccess(name)
	if err != nil || !claimed || a.Owner != owner {
		return err
	}
	if _, err := os.Stat(s.recordPath(name)); err == nil {
		return nil
	}
	if err := os.Remove(s.accessPath(name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("template %s: %w", name, err)
	}
	// The directory held only the claim (a build log may have joined it).
	_ = os.Remove(filepath.Join(s.dir, name))
	return nil
}

// SetPublic changes the visibility of owner's template.
func (s *Store) SetPublic(idOrAlias, owner string, public bool) error {
	name, err := s.resolveName(idOrAlias)
	if err != nil {
		return err
	}
	s.accessMu.Lock()
	defer s.accessMu.Unlock()
	a, claimed, err := s.readAccess(name)
	if err != nil {
		return err
	}
	if !claimed || a.Owner != owner {
		return fmt.Errorf("%w: template %s belongs to another API key or to the server's operator", ErrOwned, name)
	}
	a.Public = public
	return s.writeAccess(name, a)
}
