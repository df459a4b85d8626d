// Package unixuser is the users and groups of a sandbox, read from its own
// /etc/passwd and /etc/group (never the host's), and what it takes to start a
// process as one of them: the credential and the lookup of a program in the
// PATH the process will get. envd, its sudo server and the build-step runner
// share it.
package unixuser

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// User is an account of the sandbox's own /etc/passwd, the identity a process or a
// file operation runs as.
type User struct {
	Name   string
	UID    uint32
	GID    uint32
	Groups []uint32 // supplementary groups, primary group included
	Home   string
	Shell  string
}

// UserDB resolves sandbox accounts. It is an interface so tests can describe users
// that do not exist on the host that runs them.
type UserDB interface {
	// LookupUser returns the named account or an error if there is none.
	LookupUser(name string) (*User, error)
	// UserName and GroupName map ids to names for EntryInfo; ok is false when unknown.
	UserName(uid uint32) (name string, ok bool)
	GroupName(gid uint32) (name string, ok bool)
}

// EtcUserDB reads <Root>/etc/passwd and <Root>/etc/group. envd parses them itself
// rather than using os/user because the binary is static (no NSS) and because tests
// point Root at a temporary directory. Parsed files are cached until their mtime or
// size changes, so users added at run time (useradd in a sandbox) are seen.
type EtcUserDB struct {
	Root string

	mu     sync.Mutex
	passwd cachedFile[passwdTable]
	group  cachedFile[groupTable]
}

type cachedFile[T any] struct {
	mtime time.Time
	size  int64
	ok    bool
	val   T
}

type passwdTable struct {
	byName map[string]*User
	byUID  map[uint32]string
}

type groupEntry struct {
	name    string
	gid     uint32
	members []string
}

type groupTable struct {
	byGID   map[uint32]string
	entries []groupEntry
}

// maxEtcFileSize bounds how much of /etc/passwd or /etc/group envd will read; a
// sandbox user could otherwise make envd allocate without limit.
const maxEtcFileSize = 16 << 20

func readSmallFile(path string) ([]byte, os.FileInfo, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	if fi.Size() > maxEtcFileSize {
		return nil, nil, fmt.Errorf("%s is larger than %d bytes", path, maxEtcFileSize)
	}
	buf := make([]byte, fi.Size())
	n, err := f.Read(buf)
	if err != nil && n == 0 && fi.Size() > 0 {
		return nil, nil, err
	}
	return buf[:n], fi, nil
}

func (db *EtcUserDB) loadPasswd() passwdTable {
	path := filepath.Join(db.Root, "/etc/passwd")
	fi, err := os.Stat(path)
	if err == nil && db.passwd.ok && fi.ModTime().Equal(db.passwd.mtime) && fi.Size() == db.passwd.size {
		return db.passwd.val
	}
	t := passwdTable{byName: map[string]*User{}, byUID: map[uint32]string{}}
	data, fi, err := readSmallFile(path)
	if err != nil {
		db.passwd = cachedFile[passwdTable]{}
		return t
	}
	forEachRecord(data, 7, func(f []string) {
		uid, err1 := strconv.ParseUint(f[2], 10, 32)
		gid, err2 := strconv.ParseUint(f[3], 10, 32)
		if err1 != nil || err2 != nil || f[0] == "" {
			return
		}
		if _, dup := t.byName[f[0]]; !dup {
			t.byName[f[0]] = &User{Name: f[0], UID: uint32(uid), GID: uint32(gid), Home: f[5], Shell: f[6]}
		}
		if _, dup := t.byUID[uint32(uid)]; !dup {
			t.byUID[uint32(uid)] = f[0]
		}
	})
	db.passwd = cachedFile[passwdTable]{mtime: fi.ModTime(), size: fi.Size(), ok: true, val: t}
	return t
}

func (db *EtcUserDB) loadGroup() groupTable {
	path := filepath.Join(db.Root, "/etc/group")
	fi, err := os.Stat(path)
	if err == nil && db.group.ok && fi.ModTime().Equal(db.group.mtime) && fi.Size() == db.group.size {
		return db.group.val
	}
	t := groupTable{byGID: map[uint32]string{}}
	data, fi, err := readSmallFile(path)
	if err != nil {
		db.group = cachedFile[groupTable]{}
		return t
	}
	forEachRecord(data, 4, func(f []string) {
		gid, err := strconv.ParseUint(f[2], 10, 32)
		if err != nil || f[0] == "" {
			return
		}
		var members []string
		for _, m := range strings.Split(f[3], ",") {
			if m = strings.TrimSpace(m); m != "" {
				members = append(members, m)
			}
		}
		t.entries = append(t.entries, groupEntry{name: f[0], gid: uint32(gid), members: members})
		if _, dup := t.byGID[uint32(gid)]; !dup {
			t.byGID[uint32(gid)] = f[0]
		}
	})
	db.group = cachedFile[groupTable]{mtime: fi.ModTime(), size: fi.Size(), ok: true, val: t}
	return t
}

// forEachRecord calls fn with the colon-separated fields of every non-empty,
// non-comment line of a passwd- or group-style file that has at least min
// fields.
func forEachRecord(data []byte, min int, fn func(fields []string)) {
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		if f := strings.Split(line, ":"); len(f) >= min {
			fn(f)
		}
	}
}

// LookupUser implements UserDB. root always resolves, even in a rootfs whose passwd
// lacks it, because envd's documented fallback user is root.
func (db *EtcUserDB) LookupUser(name string) (*User, error) {
	db.mu.Lock()
	defer db.mu.Unlock()
	pw := db.loadPasswd()
	u, ok := pw.byName[name]
	if !ok {
		if name != "root" {
			return nil, fmt.Errorf("user %q not found in /etc/passwd", name)
		}
		u = &User{Name: "root", Home: "/root", Shell: "/bin/sh"}
	}
	out := *u
	gr := db.loadGroup()
	out.Groups = []uint32{out.GID}
	for _, g := range gr.entries {
		if g.gid == out.GID {
			continue
		}
		for _, m := range g.members {
			if m == name {
				out.Groups = append(out.Groups, g.gid)
				break
			}
		}
	}
	if out.Home == "" {
		out.Home = "/"
	}
	return &out, nil
}

// UserName implements UserDB.
func (db *EtcUserDB) UserName(uid uint32) (string, bool) {
	db.mu.Lock()
	defer db.mu.Unlock()
	n, ok := db.loadPasswd().byUID[uid]
	if !ok && uid == 0 {
		return "root", true
	}
	return n, ok
}

// GroupName implements UserDB.
func (db *EtcUserDB) GroupName(gid uint32) (string, bool) {
	db.mu.Lock()
	defer db.mu.Unlock()
	n, ok := db.loadGroup().byGID[gid]
	if !ok && gid == 0 {
		return "root", true
	}
	return n, ok
}

// Credential is what a process started as u runs with. Only root can switch
// identity; envd always runs as root in a sandbox, and the nil fallback keeps
// it usable (as its own user) when run unprivileged, as in tests.
func Credential(u *User) *syscall.Credential {
	if os.Geteuid() != 0 {
		return nil
	}
	return &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: u.Groups}
}

// ErrNotInPath is the error of LookPath for a program in no PATH directory.
var ErrNotInPath = errors.New("executable file not found in $PATH")

// LookPath finds file in the PATH of env, the environment the process will
// get (not the caller's), so a request that changes PATH finds its own
// binaries; without PATH in env, fallbackPath. Relative PATH entries are
// relative to dir, the process's working directory. A file with a slash is
// returned as is.
func LookPath(file string, env []string, dir, fallbackPath string) (string, error) {
	if strings.Contains(file, "/") {
		return file, nil
	}
	path := fallbackPath
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, d := range filepath.SplitList(path) {
		if d == "" {
			d = "."
		}
		if !filepath.IsAbs(d) {
			d = filepath.Join(dir, d)
		}
		p := filepath.Join(d, file)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%q: %w", file, ErrNotInPath)
}

// LookupGroup returns the gid of the named group of /etc/group.
func (db *EtcUserDB) LookupGroup(name string) (uint32, bool) {
	db.mu.Lock()
	defer db.mu.Unlock()
	for _, g := range db.loadGroup().entries {
		if g.name == name {
			return g.gid, true
		}
	}
	return 0, false
}
