package envd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"connectrpc.com/connect"

	fspb "github.com/airlock-sandbox/airlock/api/gen/filesystem"
	"github.com/airlock-sandbox/airlock/api/gen/filesystem/filesystemconnect"
)

// maxListEntries bounds one ListDir answer; a deep listing of / would otherwise
// build an unbounded response in memory.
const maxListEntries = 200_000

type filesystemService struct {
	srv *Server
}

var _ filesystemconnect.FilesystemHandler = (*filesystemService)(nil)

// fsError maps an OS error to the Connect code the SDKs turn into their own error
// types (docs/E2B-WIRE.md §3.8).
func fsError(err error) error {
	var code connect.Code
	switch {
	case errors.Is(err, fs.ErrNotExist):
		code = connect.CodeNotFound
	case errors.Is(err, fs.ErrPermission):
		code = connect.CodePermissionDenied
	case errors.Is(err, fs.ErrExist), errors.Is(err, syscall.ENOTEMPTY):
		code = connect.CodeAlreadyExists
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.EINVAL),
		errors.Is(err, syscall.ENAMETOOLONG), errors.Is(err, syscall.ELOOP):
		code = connect.CodeInvalidArgument
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		code = connect.CodeResourceExhausted
	default:
		code = connect.CodeInternal
	}
	return connect.NewError(code, err)
}

func (fsv *filesystemService) Stat(ctx context.Context, req *connect.Request[fspb.StatRequest]) (*connect.Response[fspb.StatResponse], error) {
	s := fsv.srv
	u, err := s.requestUser(req.Header())
	if err != nil {
		return nil, err
	}
	p := s.resolvePath(req.Msg.GetPath(), u)
	e, err := s.entryInfo(p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("path '%s' does not exist", p))
		}
		return nil, fsError(err)
	}
	return connect.NewResponse(&fspb.StatResponse{Entry: e}), nil
}

func (fsv *filesystemService) MakeDir(ctx context.Context, req *connect.Request[fspb.MakeDirRequest]) (*connect.Response[fspb.MakeDirResponse], error) {
	s := fsv.srv
	u, err := s.requestUser(req.Header())
	if err != nil {
		return nil, err
	}
	p := s.resolvePath(req.Msg.GetPath(), u)
	if fi, err := os.Stat(p); err == nil {
		if fi.IsDir() {
			return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("directory '%s' already exists", p))
		}
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path '%s' already exists and is not a directory", p))
	}
	if err := mkdirAllOwned(p, u); err != nil {
		if errors.Is(err, syscall.ENOTDIR) {
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("cannot create directory '%s': a parent is not a directory", p))
		}
		return nil, fsError(err)
	}
	e, err := s.entryInfo(p)
	if err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(&fspb.MakeDirResponse{Entry: e}), nil
}

func (fsv *filesystemService) Move(ctx context.Context, req *connect.Request[fspb.MoveRequest]) (*connect.Response[fspb.MoveResponse], error) {
	s := fsv.srv
	u, err := s.requestUser(req.Header())
	if err != nil {
		return nil, err
	}
	src := s.resolvePath(req.Msg.GetSource(), u)
	dst := s.resolvePath(req.Msg.GetDestination(), u)
	if _, err := os.Lstat(src); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("path '%s' does not exist", src))
		}
		return nil, fsError(err)
	}
	if err := mkdirAllOwned(filepath.Dir(dst), u); err != nil {
		return nil, fsError(err)
	}
	if err := os.Rename(src, dst); err != nil {
		// overlayfs refuses to rename directories that live in a lower layer (and
		// any rename across mounts fails the same way): fall back to copy + delete,
		// as mv does.
		if !errors.Is(err, syscall.EXDEV) {
			return nil, fsError(err)
		}
		if err := copyTree(ctx, src, dst); err != nil {
			_ = os.RemoveAll(dst)
			return nil, fsError(err)
		}
		if err := os.RemoveAll(src); err != nil {
			return nil, fsError(err)
		}
	}
	e, err := s.entryInfo(dst)
	if err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(&fspb.MoveResponse{Entry: e}), nil
}

// copyTree copies src to dst preserving modes, owners and symlinks.
func copyTree(ctx context.Context, src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		target := filepath.Join(dst, rel)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st, _ := fi.Sys().(*syscall.Stat_t)
		switch {
		case d.IsDir():
			if err := os.Mkdir(target, fi.Mode().Perm()); err != nil && !errors.Is(err, fs.ErrExist) {
				return err
			}
		case fi.Mode()&fs.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if err := os.Symlink(link, target); err != nil {
				return err
			}
		case fi.Mode().IsRegular():
			if err := copyFile(p, target, fi.Mode().Perm()); err != nil {
				return err
			}
		default:
			// Devices, fifos and sockets cannot be copied meaningfully; skip them.
			return nil
		}
		if st != nil && os.Geteuid() == 0 {
			_ = os.Lchown(target, int(st.Uid), int(st.Gid))
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			_ = os.Chmod(target, fi.Mode()&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky))
		}
		return nil
	})
}

func copyFile(src, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func (fsv *filesystemService) ListDir(ctx context.Context, req *connect.Request[fspb.ListDirRequest]) (*connect.Response[fspb.ListDirResponse], error) {
	s := fsv.srv
	u, err := s.requestUser(req.Header())
	if err != nil {
		return nil, err
	}
	root := s.resolvePath(req.Msg.GetPath(), u)
	depth := int(max(req.Msg.GetDepth(), 1))
	fi, err := os.Stat(root)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("path '%s' does not exist", root))
		}
		return nil, fsError(err)
	}
	if !fi.IsDir() {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path '%s' is not a directory", root))
	}
	// WalkDir does not descend into a symlinked root, so walk its target while
	// reporting paths under the name the client used.
	real, err := filepath.EvalSymlinks(root)
	if err != nil {
		return nil, fsError(err)
	}
	var entries []*fspb.EntryInfo
	err = filepath.WalkDir(real, func(p string, d fs.DirEntry, walkErr error) error {
		if walkErr != nil {
			if p == real {
				return walkErr
			}
			// An unreadable subdirectory should not hide everything else.
			return nil
		}
		if p == real {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if len(entries) >= maxListEntries {
			return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("more than %d entries; list with a smaller depth", maxListEntries))
		}
		rel, err := filepath.Rel(real, p)
		if err != nil {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil // vanished while listing
		}
		entries = append(entries, s.entryFromInfo(p, filepath.Join(root, rel), info))
		if d.IsDir() && strings.Count(rel, string(filepath.Separator))+1 >= depth {
			return filepath.SkipDir
		}
		return nil
	})
	if err != nil {
		var ce *connect.Error
		if errors.As(err, &ce) {
			return nil, ce
		}
		if ctx.Err() != nil {
			return nil, ctxError(ctx)
		}
		return nil, fsError(err)
	}
	return connect.NewResponse(&fspb.ListDirResponse{Entries: entries}), nil
}

func (fsv *filesystemService) Remove(ctx context.Context, req *connect.Request[fspb.RemoveRequest]) (*connect.Response[fspb.RemoveResponse], error) {
	s := fsv.srv
	u, err := s.requestUser(req.Header())
	if err != nil {
		return nil, err
	}
	p := s.resolvePath(req.Msg.GetPath(), u)
	if p == "/" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("refusing to remove /"))
	}
	if err := os.RemoveAll(p); err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(&fspb.RemoveResponse{}), nil
}
