package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"
)

// copyFolder copies the folder src into dst, an empty folder, as `cp -a
// --reflink=auto -T src dst` does, in this process: every entry (folders,
// regular files, symlinks, FIFOs, sockets, device nodes), hard links within
// the tree kept as links, owner and group (when allowed), mode, extended
// attributes (where the filesystem keeps them) and times; a file's data is
// shared by a reflink where the filesystem can (copy-on-write: a write to
// either copy never shows in the other), else copied, holes kept. It runs
// no process (a cp per sandbox cost 4x the CPU of the copy itself, which
// at 512 sandboxes a commit was mostly spent on).
//
// The tree is the sandbox's to write, so nothing in it is followed: every
// entry is reached relative to its parent's descriptor, never by a path
// through a symlink (O_NOFOLLOW), and an entry that changes type between
// its stat and its open is an error, as a file that vanishes is (the
// caller keeps the sandbox still while it is copied).
func copyFolder(ctx context.Context, src, dst string) error {
	sfd, err := unix.Open(src, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: src, Err: err}
	}
	defer unix.Close(sfd)
	dfd, err := unix.Open(dst, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: dst, Err: err}
	}
	defer unix.Close(dfd)
	c := &copier{ctx: ctx, src: src, root: dfd, links: map[fileKey]string{}}
	var st unix.Stat_t
	if err := unix.Fstat(sfd, &st); err != nil {
		return &os.PathError{Op: "stat", Path: src, Err: err}
	}
	if err := c.folder(sfd, dfd, ""); err != nil {
		return err
	}
	return c.attrs(dfd, sfd, &st, ".")
}

// fileKey names a file by device and inode (hard links).
type fileKey struct{ dev, ino uint64 }

type copier struct {
	ctx   context.Context
	src   string
	root  int                // dst's descriptor
	links map[fileKey]string // first copy of a file with several links, relative to dst
	// noClone: a reflink failed once (the filesystem has none), so no
	// other file of the tree tries one.
	noClone bool
}

func (c *copier) fail(rel, op string, err error) error {
	return &os.PathError{Op: op, Path: filepath.Join(c.src, rel), Err: err}
}

// folder copies the entries of the folder sfd into dfd (rel is its path
// below the tree's root).
func (c *copier) folder(sfd, dfd int, rel string) error {
	names, err := readNames(sfd)
	if err != nil {
		return c.fail(rel, "read folder", err)
	}
	for _, name := range names {
		if err := c.ctx.Err(); err != nil {
			return err
		}
		if err := c.entry(sfd, dfd, filepath.Join(rel, name), name); err != nil {
			return err
		}
	}
	return nil
}

func (c *copier) entry(sfd, dfd int, rel, name string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(sfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return c.fail(rel, "stat", err)
	}
	typ := st.Mode & unix.S_IFMT
	if typ == unix.S_IFDIR {
		return c.subfolder(sfd, dfd, rel, name)
	}
	key := fileKey{uint64(st.Dev), st.Ino}
	if st.Nlink > 1 {
		if first, ok := c.links[key]; ok {
			if err := unix.Linkat(c.root, first, dfd, name, 0); err != nil {
				return c.fail(rel, "link", err)
			}
			return nil
		}
	}
	var err error
	switch typ {
	case unix.S_IFREG:
		err = c.file(sfd, dfd, rel, name, &st)
	case unix.S_IFLNK:
		err = c.symlink(sfd, dfd, rel, name, &st)
	default: // FIFO, socket, device
		if err = unix.Mknodat(dfd, name, st.Mode, int(st.Rdev)); err != nil {
			return c.fail(rel, "mknod", err)
		}
		err = c.nameAttrs(dfd, name, &st, rel, false)
	}
	if err != nil {
		return err
	}
	if st.Nlink > 1 {
		c.links[key] = rel
	}
	return nil
}

func (c *copier) subfolder(sfd, dfd int, rel, name string) error {
	if err := unix.Mkdirat(dfd, name, 0o700); err != nil {
		return c.fail(rel, "mkdir", err)
	}
	csfd, err := unix.Openat(sfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return c.fail(rel, "open", err)
	}
	defer unix.Close(csfd)
	cdfd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return c.fail(rel, "open the copy of", err)
	}
	defer unix.Close(cdfd)
	var st unix.Stat_t
	if err := unix.Fstat(csfd, &st); err != nil {
		return c.fail(rel, "stat", err)
	}
	if err := c.folder(csfd, cdfd, rel); err != nil {
		return err
	}
	return c.attrs(cdfd, csfd, &st, rel)
}

func (c *copier) file(sfd, dfd int, rel, name string, st *unix.Stat_t) error {
	in, err := c.open(sfd, name)
	if err != nil {
		return c.fail(rel, "open", err)
	}
	defer unix.Close(in)
	if err := unix.Fstat(in, st); err != nil {
		return c.fail(rel, "stat", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return c.fail(rel, "copy", errors.New("it changed while it was copied"))
	}
	out, err := unix.Openat(dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return c.fail(rel, "create the copy of", err)
	}
	defer unix.Close(out)
	if err := c.copyData(in, out, st); err != nil {
		return c.fail(rel, "copy", err)
	}
	return c.attrs(out, in, st, rel)
}

// open opens the regular file name in the folder sfd for reading, never
// blocking on a FIFO swapped in for it: without blocking first; a file
// whose open would block (another process holds a lease on it) is opened
// as a path, checked to be a regular file, and opened again through that
// descriptor, waiting for the lease as cp waits.
func (c *copier) open(sfd int, name string) (int, error) {
	fd, err := unix.Openat(sfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if !errors.Is(err, unix.EWOULDBLOCK) {
		return fd, err
	}
	pfd, err := unix.Openat(sfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		return -1, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return -1, errors.New("it changed while it was copied")
	}
	return unix.Open("/proc/self/fd/"+strconv.Itoa(pfd), unix.O_RDONLY|unix.O_CLOEXEC, 0)
}

// copyData copies the data of in (st is its stat) to out, an empty file:
// a reflink where the filesystem can (tried until it fails once), else
// the data; the data ranges alone of a sparse file (holes stay holes).
func (c *copier) copyData(in, out int, st *unix.Stat_t) error {
	size := st.Size
	if size == 0 {
		return nil
	}
	if !c.noClone {
		if unix.IoctlFileClone(out, in) == nil {
			return nil
		}
		c.noClone = true
	}
	if st.Blocks*512 >= size {
		return copyRange(in, out, 0, size)
	}
	for off := int64(0); off < size; {
		data, err := unix.Seek(in, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			data = off // no SEEK_DATA here: everything is data
		}
		end, err := unix.Seek(in, data, unix.SEEK_HOLE)
		if err != nil || end > size {
			end = size
		}
		if err := copyRange(in, out, data, end-data); err != nil {
			return err
		}
		off = end
	}
	return unix.Ftruncate(out, size)
}

// copyRange copies n bytes at off from in to out, at the same offset.
func copyRange(in, out int, off, n int64) error {
	inOff, outOff := off, off
	for n > 0 {
		m, err := unix.CopyFileRange(in, &inOff, out, &outOff, int(min(n, 1<<30)), 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil && (errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP)) {
			return readWrite(in, out, inOff, n)
		}
		if err != nil {
			return err
		}
		if m == 0 {
			return errors.New("the file got shorter while it was copied")
		}
		n -= int64(m)
	}
	return nil
}

func readWrite(in, out int, off, n int64) error {
	buf := make([]byte, min(n, 1<<20))
	for n > 0 {
		m, err := unix.Pread(in, buf[:min(n, int64(len(buf)))], off)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if m == 0 {
			return errors.New("the file got shorter while it was copied")
		}
		for w := 0; w < m; {
			k, err := unix.Pwrite(out, buf[w:m], off+int64(w))
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil {
				return err
			}
			w += k
		}
		off += int64(m)
		n -= int64(m)
	}
	return nil
}

func (c *copier) symlink(sfd, dfd int, rel, name string, st *unix.Stat_t) error {
	buf := make([]byte, max(st.Size+1, 256))
	for {
		n, err := unix.Readlinkat(sfd, name, buf)
		if err != nil {
			return c.fail(rel, "readlink", err)
		}
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	if err := unix.Symlinkat(string(buf), dfd, name); err != nil {
		return c.fail(rel, "symlink", err)
	}
	return c.nameAttrs(dfd, name, st, rel, true)
}

// attrs gives the copy open as fd the owner, mode, extended attributes
// (read from the original, open as from) and times of st.
func (c *copier) attrs(fd, from int, st *unix.Stat_t, rel string) error {
	if err := unix.Fchown(fd, int(st.Uid), int(st.Gid)); err != nil && !errors.Is(err, unix.EPERM) {
		return c.fail(rel, "chown the copy of", err)
	}
	if err := unix.Fchmod(fd, st.Mode&0o7777); err != nil {
		return c.fail(rel, "chmod the copy of", err)
	}
	if err := copyXattrs(from, fd); err != nil {
		return c.fail(rel, "copy the extended attributes of", err)
	}
	ts := [2]unix.Timespec{st.Atim, st.Mtim}
	if _, _, e := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(fd), 0, uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0); e != 0 {
		return c.fail(rel, "set the times of the copy of", e)
	}
	return nil
}

// nameAttrs is attrs for an entry that is not opened (a symlink, a FIFO,
// a socket, a device node), by its name in dfd; a symlink keeps no mode.
func (c *copier) nameAttrs(dfd int, name string, st *unix.Stat_t, rel string, link bool) error {
	if err := unix.Fchownat(dfd, name, int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW); err != nil && !errors.Is(err, unix.EPERM) {
		return c.fail(rel, "chown the copy of", err)
	}
	if !link {
		if err := unix.Fchmodat(dfd, name, st.Mode&0o7777, 0); err != nil {
			return c.fail(rel, "chmod the copy of", err)
		}
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(dfd, name, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return c.fail(rel, "set the times of the copy of", err)
	}
	return nil
}

// copyXattrs copies the extended attributes of the file open as from to
// the one open as to. One the filesystem or the caller may not set (a
// security or trusted attribute without the privilege, a filesystem
// without them) is left out, as cp -a leaves it.
func copyXattrs(from, to int) error {
	size, err := unix.Flistxattr(from, nil)
	if err != nil || size == 0 {
		if errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.EOPNOTSUPP) {
			return nil
		}
		return err
	}
	list := make([]byte, size)
	if size, err = unix.Flistxattr(from, list); err != nil {
		return err
	}
	for _, name := range splitNames(list[:size]) {
		n, err := unix.Fgetxattr(from, name, nil)
		if err != nil {
			continue // gone meanwhile, or not readable
		}
		val := make([]byte, n)
		if n, err = unix.Fgetxattr(from, name, val); err != nil {
			continue
		}
		if err := unix.Fsetxattr(to, name, val[:n], 0); err != nil &&
			!errors.Is(err, unix.EPERM) && !errors.Is(err, unix.ENOTSUP) && !errors.Is(err, unix.EOPNOTSUPP) {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return nil
}

func splitNames(list []byte) []string {
	var out []string
	start := 0
	for i, b := range list {
		if b == 0 {
			if i > start {
				out = append(out, string(list[start:i]))
			}
			start = i + 1
		}
	}
	return out
}

// readNames lists the names in the folder open as fd (not "." or "..").
func readNames(fd int) ([]string, error) {
	dup, err := unix.Dup(fd)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(dup), "")
	defer f.Close()
	if _, err := unix.Seek(dup, 0, 0); err != nil {
		return nil, err
	}
	return f.Readdirnames(-1)
}
