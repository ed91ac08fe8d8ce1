package reaper

import (
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/ngharness/ngharness/pkg/proto"
)

// noPidfd is set once pidfd_open is found missing (kernels before 5.3).
var noPidfd atomic.Bool

// Signal sends sig to p only if the process living at p.PID still has
// p.StartTicks. It opens a pidfd first, checks the start time, then signals
// through the pidfd, so the process checked is the process signalled.
// ErrNoProcess: gone; ErrNotSameProcess: the pid was reused.
func (fs FS) Signal(p proto.Proc, sig unix.Signal) error {
	return fs.signalAs(p, 0, sig)
}

// signalAs is Signal for a process whose pidfs inode number was recorded
// (0: none): a process with p's pid and start time but another inode is
// another process (its pid was reused within one clock tick) and is not
// signalled (ErrNotSameProcess).
func (fs FS) signalAs(p proto.Proc, inode uint64, sig unix.Signal) error {
	t := target{Stat: Stat{PID: p.PID, StartTicks: p.StartTicks}, fs: fs, fd: -1, inode: inode}
	defer t.close()
	return t.Signal(sig)
}

// pidfsMagic is the f_type of pidfs (linux/magic.h), where each process's
// pidfd has an inode number of its own, never reused while the system runs
// (Linux 6.9 and later). Before, pidfds were anonymous inodes sharing one
// number.
const pidfsMagic = 0x50494446

// havePidfs says pidfds live on pidfs here, checked once.
var havePidfs = sync.OnceValue(func() bool {
	fd, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	var sfs unix.Statfs_t
	return unix.Fstatfs(fd, &sfs) == nil && uint64(sfs.Type) == pidfsMagic
})

// fdInode is the inode number of a pidfd, 0 when it cannot be read.
func fdInode(fd int) uint64 {
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil {
		return 0
	}
	return st.Ino
}

// Inode returns p's pidfs inode number: unique to the process for as long as
// the system runs, so, unlike pid and start time, it tells apart two
// processes that got the same pid within one clock tick. It is 0 where there
// is no pidfs (or no pidfd), where this FS is not the real /proc, or when p
// (pid and start time) is gone.
func (fs FS) Inode(p proto.Proc) uint64 {
	if fs.Root != ProcFS.Root || noPidfd.Load() || !havePidfs() {
		return 0
	}
	fd, err := unix.PidfdOpen(p.PID, 0)
	if err != nil {
		return 0
	}
	defer unix.Close(fd)
	ino := fdInode(fd)
	// The pidfd holds the process that had the pid when it was opened:
	// check that it is p.
	if _, err := fs.checkIdentity(p); err != nil {
		return 0
	}
	return ino
}

// openAs opens a pidfd for pid and checks that its pidfs inode is inode. It
// returns the fd (-1 when none could be opened but the pid may still be
// the process: no pidfd here) and whether the process may be the one
// recorded.
func openAs(pid int, inode uint64) (int, bool) {
	if inode == 0 || noPidfd.Load() || !havePidfs() {
		return -1, true
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return -1, err != unix.ESRCH
	}
	if fdInode(fd) != inode {
		unix.Close(fd)
		return -1, false
	}
	return fd, true
}

func (fs FS) checkIdentity(p proto.Proc) (Stat, error) {
	st, err := fs.ReadStat(p.PID)
	if err != nil {
		return st, err
	}
	if st.StartTicks != p.StartTicks {
		return st, ErrNotSameProcess
	}
	return st, nil
}

// Alive reports whether p (pid and start time) still exists, zombies
// included.
func (fs FS) Alive(p proto.Proc) bool {
	if p.PID <= 0 {
		return false
	}
	st, err := fs.ReadStat(p.PID)
	return err == nil && st.StartTicks == p.StartTicks
}

// Live reports whether p (pid and start time) still exists and is not dead:
// a zombie counts only while it is a thread-group leader whose other threads
// run. A killed supervisor stays a zombie for as long as its parent does not
// reap it (a sandbox's init may never do so).
func (fs FS) Live(p proto.Proc) bool {
	if p.PID <= 0 {
		return false
	}
	st, err := fs.ReadStat(p.PID)
	return err == nil && st.StartTicks == p.StartTicks && st.State != 'X' && (st.State != 'Z' || st.NumThreads > 1)
}

// Identify returns the identity of the process living at pid now.
func (fs FS) Identify(pid int) (proto.Proc, error) {
	st, err := fs.ReadStat(pid)
	if err != nil {
		return proto.Proc{}, err
	}
	return proto.Proc{PID: pid, StartTicks: st.StartTicks}, nil
}
