package reaper

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/ngharness/ngharness/pkg/proto"
)

// A launch folder travels: the owner's snapshot of a sandbox copies it,
// and a fork of that snapshot carries it into a new sandbox, receipt,
// known set and all, while the launch itself never ran there (and its
// processes, on the local backend, may still run in the old sandbox). The
// folder's own identity is what a copy does not carry: a copy is a new
// folder, with a new inode and a new birth time. The origin file records
// the identity of the folder a launch was set up in; a folder whose origin
// names another folder is a copy.

// folderIdentity is a folder's device, inode and birth time (nanoseconds
// since the epoch; 0 where the filesystem keeps none). The birth time tells
// a copy apart from the folder it was copied from even when the copy was
// given the inode number of the original after that was deleted.
type folderIdentity struct {
	dev, ino uint64
	btime    int64
}

// maxOriginBytes caps what is read of an origin file: three numbers.
const maxOriginBytes = 128

// identifyFolder returns dir's identity.
func identifyFolder(dir string) (folderIdentity, error) {
	var st unix.Statx_t
	err := unix.Statx(unix.AT_FDCWD, dir, unix.AT_STATX_SYNC_AS_STAT, unix.STATX_INO|unix.STATX_BTIME, &st)
	if err == unix.ENOSYS {
		var fst unix.Stat_t
		if err := unix.Stat(dir, &fst); err != nil {
			return folderIdentity{}, &os.PathError{Op: "stat", Path: dir, Err: err}
		}
		return folderIdentity{dev: fst.Dev, ino: fst.Ino}, nil
	}
	if err != nil {
		return folderIdentity{}, &os.PathError{Op: "statx", Path: dir, Err: err}
	}
	id := folderIdentity{dev: unix.Mkdev(st.Dev_major, st.Dev_minor), ino: st.Ino}
	if st.Mask&unix.STATX_BTIME != 0 {
		id.btime = st.Btime.Sec*1e9 + int64(st.Btime.Nsec)
	}
	return id, nil
}

func (f folderIdentity) String() string {
	return fmt.Sprintf("%d %d %d", f.dev, f.ino, f.btime)
}

// parseIdentity parses "dev ino btime".
func parseIdentity(data []byte) (folderIdentity, bool) {
	fields := bytes.Fields(data)
	if len(fields) != 3 {
		return folderIdentity{}, false
	}
	dev, err1 := strconv.ParseUint(string(fields[0]), 10, 64)
	ino, err2 := strconv.ParseUint(string(fields[1]), 10, 64)
	btime, err3 := strconv.ParseInt(string(fields[2]), 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || ino == 0 {
		return folderIdentity{}, false
	}
	return folderIdentity{dev: dev, ino: ino, btime: btime}, true
}

// same reports whether f and g name one folder: the same device and inode,
// and the same birth time where both know it.
func (f folderIdentity) same(g folderIdentity) bool {
	return f.dev == g.dev && f.ino == g.ino && (f.btime == 0 || g.btime == 0 || f.btime == g.btime)
}

// recordOrigin writes dir's origin file, the identity of dir, unless it has
// one: the first verb to set the folder up records it, and no later one
// replaces it (a copy keeps naming the original). The file appears whole or
// not at all (written aside, then linked into place).
func recordOrigin(dir string) error {
	path := filepath.Join(dir, proto.OriginFile)
	if _, err := os.Lstat(path); err == nil {
		return nil
	}
	id, err := identifyFolder(dir)
	if err != nil {
		return fmt.Errorf("record the launch folder's origin: %w", err)
	}
	tmp, err := os.CreateTemp(dir, "."+proto.OriginFile+"-*")
	if err != nil {
		return fmt.Errorf("record the launch folder's origin: %w", err)
	}
	defer os.Remove(tmp.Name())
	_, werr := tmp.WriteString(id.String() + "\n")
	if err := errors.Join(werr, tmp.Close()); err != nil {
		return fmt.Errorf("record the launch folder's origin: %w", err)
	}
	if err := os.Link(tmp.Name(), path); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("record the launch folder's origin: %w", err)
	}
	return nil
}

// copiedFrom reports whether dir is a copy of the folder its launch was set
// up in: its origin file names another folder. It returns the origin it
// read. A missing, unreadable or malformed origin is no proof of a copy
// (false): the folder is then taken for the launch's own, as before there
// were origin files.
func copiedFrom(dir string) (bool, string) {
	data, ok := readSmallFile(filepath.Join(dir, proto.OriginFile), maxOriginBytes)
	if !ok {
		return false, ""
	}
	origin, ok := parseIdentity(data)
	if !ok {
		return false, ""
	}
	here, err := identifyFolder(dir)
	if err != nil {
		return false, ""
	}
	return !origin.same(here), origin.String()
}

// readSmallFile reads a regular file of at most limit bytes without
// following a symlink or blocking on a FIFO (the launch folder is the
// sandbox's to write); ok is false for anything else.
func readSmallFile(path string, limit int) ([]byte, bool) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, false
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size > int64(limit) {
		return nil, false
	}
	buf := make([]byte, limit+1)
	n := 0
	for n < len(buf) {
		m, err := unix.Read(fd, buf[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, false
		}
		if m == 0 {
			break
		}
		n += m
	}
	if n > limit {
		return nil, false
	}
	return buf[:n], true
}

// showsLife reports whether anything the launch's records name still runs:
// the supervisor or the harness the receipt names, a process of the known
// set (each by pid and start time), or a member of its cgroup. A copy of a
// folder whose launch runs on (on a local backend, in the sandbox it was
// copied from) shows life; so does a launch whose own folder a process of
// it made look like a copy.
func (l *Launch) showsLife() bool {
	if l.FS.Live(l.supervisor()) || l.FS.Live(l.harness()) {
		return true
	}
	known, _, _ := readProcSet(l.path(proto.KnownFile))
	for _, p := range known {
		if l.FS.Live(p) {
			return true
		}
	}
	if l.Cgroup != nil {
		if pids, err := l.Cgroup.Procs(); err == nil && len(pids) > 0 {
			return true
		}
	}
	return false
}
