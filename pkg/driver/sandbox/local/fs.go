package local

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// renameNoReplace renames old to new unless new exists (ErrExists).
func renameNoReplace(old, new string) error {
	err := unix.Renameat2(unix.AT_FDCWD, old, unix.AT_FDCWD, new, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
		// A filesystem without RENAME_NOREPLACE: check, then rename (a
		// folder is never renamed over a non-empty one anyway).
		if _, serr := os.Lstat(new); serr == nil {
			return fmt.Errorf("%w: %s", ErrExists, new)
		}
		err = os.Rename(old, new)
	}
	if errors.Is(err, unix.EEXIST) || errors.Is(err, unix.ENOTEMPTY) {
		return fmt.Errorf("%w: %s", ErrExists, new)
	}
	if err != nil {
		return &os.LinkError{Op: "rename", Old: old, New: new, Err: err}
	}
	return nil
}

func randomSuffix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// copyTree copies the folder src to dstDir/name (copyFolder: what cp -a
// --reflink=auto copies, in this process), under a temporary name first,
// then renamed into place (never replacing). The temporary folder is
// locked (copyTemp) for as long as this process copies into it, so a
// copy a killed owner left is unlocked: Sweep removes only unlocked ones.
func (b *Backend) copyTree(ctx context.Context, src, dstDir, name string) error {
	if _, err := os.Lstat(filepath.Join(dstDir, name)); err == nil {
		return fmt.Errorf("%w: %s", ErrExists, filepath.Join(dstDir, name))
	}
	tmp, lock, err := copyTemp(dstDir, name)
	if err != nil {
		return err
	}
	defer lock.Close()
	defer removeAll(tmp) // a no-op once renamed
	if err := copyFolder(ctx, src, tmp); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// A copy that failed is a file error where it copied to (a full
		// or read-only disk, mostly), so callers classify it as any other
		// (errors.Is finds its errno).
		return &fs.PathError{Op: "copy " + src + " to", Path: filepath.Join(dstDir, name), Err: err}
	}
	if copiedHook != nil {
		copiedHook(tmp)
	}
	return renameNoReplace(tmp, filepath.Join(dstDir, name))
}

// copiedHook, when set (by a test), runs once a copy is complete and
// before it is renamed into place.
var copiedHook func(tmp string)

// removeTree renames dir/name away and deletes it.
func removeTree(dir, name string) error {
	gone, err := renameAway(dir, name)
	if err != nil || gone == "" {
		return err
	}
	return removeAll(gone)
}

// renameAway renames dir/name to dir/.remove-<name>-<random> and returns
// the new path ("" when dir/name does not exist).
func renameAway(dir, name string) (string, error) {
	gone := filepath.Join(dir, ".remove-"+name+"-"+randomSuffix())
	if err := os.Rename(filepath.Join(dir, name), gone); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", nil
		}
		return "", err
	}
	return gone, nil
}

// removeAll is os.RemoveAll that also deletes folders a command made
// read-only (which only matters when not running as root).
func removeAll(p string) error {
	err := os.RemoveAll(p)
	if err == nil || !errors.Is(err, fs.ErrPermission) {
		return err
	}
	_ = filepath.WalkDir(p, func(q string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(q, 0o700)
		}
		return nil
	})
	return os.RemoveAll(p)
}

// tail returns the last n bytes of b as text.
func tail(b []byte, n int) string {
	b = bytes.TrimSpace(b)
	if len(b) > n {
		b = append([]byte("..."), b[len(b)-n:]...)
	}
	return string(b)
}

// writeBeneath writes data to rel (a clean relative path, not empty) below
// the folder root, atomically: a temporary file in the same folder, then a
// rename over the target. Missing folders are made (0755). No symlink may
// lead out of root (openat2 RESOLVE_BENEATH): an absolute symlink or one
// climbing above root is refused, since the file would land outside the
// sandbox's folder.
func writeBeneath(root, rel string, data []byte, mode uint32) error {
	rootfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: root, Err: err}
	}
	defer unix.Close(rootfd)

	dir, base := filepath.Split(rel)
	dir = strings.TrimSuffix(dir, "/")
	dirfd := rootfd
	if dir != "" {
		dirfd, err = openDirBeneath(rootfd, root, dir)
		if err != nil {
			return err
		}
		defer unix.Close(dirfd)
	}

	tmp := ".upload-" + base + "-" + randomSuffix()
	if len(tmp) > 255 {
		tmp = ".upload-" + randomSuffix()
	}
	fd, err := unix.Openat(dirfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return &os.PathError{Op: "create", Path: filepath.Join(root, dir, tmp), Err: err}
	}
	f := os.NewFile(uintptr(fd), filepath.Join(root, dir, tmp))
	ok := false
	defer func() {
		if !ok {
			_ = unix.Unlinkat(dirfd, tmp, 0)
		}
	}()
	_, werr := f.Write(data)
	if werr == nil {
		// Fchmod: the mode exactly, whatever the umask.
		werr = unix.Fchmod(fd, mode&0o7777)
	}
	if werr == nil {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return werr
	}
	if err := unix.Renameat(dirfd, tmp, dirfd, base); err != nil {
		return &os.LinkError{Op: "rename", Old: tmp, New: filepath.Join(root, rel), Err: err}
	}
	ok = true
	return nil
}

// openDirBeneath opens (making what is missing) the folder dir below rootfd,
// resolving every component beneath root.
func openDirBeneath(rootfd int, root, dir string) (int, error) {
	parts := strings.Split(dir, "/")
	for i := range parts {
		sub := strings.Join(parts[:i+1], "/")
		how := &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS}
		fd, err := unix.Openat2(rootfd, sub, how)
		if errors.Is(err, unix.ENOENT) {
			parent := rootfd
			if i > 0 {
				parent, err = unix.Openat2(rootfd, strings.Join(parts[:i], "/"), how)
				if err != nil {
					return -1, beneathErr(root, strings.Join(parts[:i], "/"), err)
				}
			}
			err = unix.Mkdirat(parent, parts[i], 0o755)
			if parent != rootfd {
				unix.Close(parent)
			}
			if err != nil && !errors.Is(err, unix.EEXIST) {
				return -1, &os.PathError{Op: "mkdir", Path: filepath.Join(root, sub), Err: err}
			}
			fd, err = unix.Openat2(rootfd, sub, how)
		}
		if err != nil {
			return -1, beneathErr(root, sub, err)
		}
		if i == len(parts)-1 {
			return fd, nil
		}
		unix.Close(fd)
	}
	return -1, errors.New("unreachable")
}

func beneathErr(root, sub string, err error) error {
	if errors.Is(err, unix.EXDEV) {
		return fmt.Errorf("%s leads out of the sandbox's folder through a symlink", filepath.Join(root, sub))
	}
	if errors.Is(err, unix.ENOTDIR) {
		return fmt.Errorf("%s is not a folder", filepath.Join(root, sub))
	}
	return &os.PathError{Op: "open", Path: filepath.Join(root, sub), Err: err}
}
