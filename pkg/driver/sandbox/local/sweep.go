package local

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"

	"golang.org/x/sys/unix"
)

// The temporary names the backend gives folders on their way in or out:
// a copy being made (.copy-<id>-<suffix>, snapshot or fork) and a folder
// being deleted (.remove-<id>-<suffix>), the suffix being randomSuffix's 12
// hex digits. Sweep matches these exact shapes and nothing else.
const (
	copyPrefix   = ".copy-"
	removePrefix = ".remove-"
)

var tempName = regexp.MustCompile(`^\.(copy|remove)-([A-Za-z0-9._-]+)-[0-9a-f]{12}$`)

// copyTemp makes the temporary folder of a copy of name in dir and takes an
// exclusive lock (flock) on it, returned open: the lock lasts while the
// file (or a child process that inherited it) is open, so the kernel drops
// it when every process copying is gone, however it ended. A Sweep that
// locked and removed the folder between its creation and this lock is
// noticed (the name no longer leads to the locked folder) and another
// folder is made.
func copyTemp(dir, name string) (string, *os.File, error) {
	for range 3 {
		tmp := filepath.Join(dir, copyPrefix+name+"-"+randomSuffix())
		if err := os.Mkdir(tmp, 0o700); err != nil {
			return "", nil, err
		}
		f, err := os.Open(tmp)
		if err != nil {
			return "", nil, err
		}
		if err := flock(f, unix.LOCK_EX); err != nil {
			f.Close()
			return "", nil, &os.PathError{Op: "flock", Path: tmp, Err: err}
		}
		if sameFolder(f, tmp) {
			return tmp, f, nil
		}
		f.Close()
	}
	return "", nil, fmt.Errorf("cannot make a temporary copy of %s in %s: each was swept away as it was made", name, dir)
}

func flock(f *os.File, how int) error {
	for {
		err := unix.Flock(int(f.Fd()), how)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// sameFolder reports whether path still names the folder f has open.
func sameFolder(f *os.File, path string) bool {
	var a, b unix.Stat_t
	if unix.Fstat(int(f.Fd()), &a) != nil || unix.Lstat(path, &b) != nil {
		return false
	}
	return a.Dev == b.Dev && a.Ino == b.Ino
}

// Sweep removes what a killed process left half done under the base
// folder: temporary copies (.copy-<id>-<suffix> in base/snapshots and
// base/sandboxes: a snapshot or fork whose process died before renaming
// it into place) and folders it was deleting (.remove-<id>-<suffix>). Only
// entries of exactly those shapes, directly in those two folders, are
// touched, and a copy still being made is left alone: its folder is locked
// by the process copying (and by the cp it runs), which a process that is
// gone no longer holds. Call it when an owner starts. It returns the
// folders removed; an error names what could not be removed, the rest is
// swept anyway.
func (b *Backend) Sweep() ([]string, error) {
	var removed []string
	var errs []error
	for _, dir := range []string{b.snapshotsDir(), b.sandboxesDir()} {
		ents, err := os.ReadDir(dir)
		if err != nil {
			errs = append(errs, fmt.Errorf("local: sweep %s: %w", dir, err))
			continue
		}
		for _, ent := range ents {
			m := tempName.FindStringSubmatch(ent.Name())
			if m == nil || !ent.IsDir() || CheckID("temporary", m[2]) != nil {
				continue
			}
			p := filepath.Join(dir, ent.Name())
			ok, err := sweepOne(p, m[1] == "copy")
			if err != nil {
				errs = append(errs, fmt.Errorf("local: sweep %s: %w", p, err))
			}
			if ok {
				removed = append(removed, p)
			}
		}
	}
	return removed, errors.Join(errs...)
}

// sweepOne removes the temporary folder p; a copy only if no process holds
// its lock (it holds the lock itself while it removes it, so a copyTemp
// racing it makes another folder).
func sweepOne(p string, isCopy bool) (bool, error) {
	if isCopy {
		f, err := os.Open(p)
		if errors.Is(err, fs.ErrNotExist) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		defer f.Close()
		if err := flock(f, unix.LOCK_EX|unix.LOCK_NB); err != nil {
			if errors.Is(err, unix.EWOULDBLOCK) {
				return false, nil // being copied into right now
			}
			return false, &os.PathError{Op: "flock", Path: p, Err: err}
		}
		if !sameFolder(f, p) {
			return false, nil
		}
	}
	if err := removeAll(p); err != nil {
		return false, err
	}
	return true, nil
}
