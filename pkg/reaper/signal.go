package reaper

import (
	"errors"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/ngharness/ngharness/pkg/proto"
)

// ErrNotSameProcess means the pid now belongs to a process with another start
// time: the one we knew is gone and its pid was reused.
var ErrNotSameProcess = errors.New("pid belongs to another process now")

// noPidfd is set once pidfd_open is found missing (kernels before 5.3).
var noPidfd atomic.Bool

// Signal sends sig to p only if the process living at p.PID still has
// p.StartTicks. It opens a pidfd first, checks the start time, then signals
// through the pidfd, so the process checked is the process signalled.
// ErrNoProcess: gone; ErrNotSameProcess: the pid was reused.
func (fs FS) Signal(p proto.Proc, sig unix.Signal) error {
	t := target{Stat: Stat{PID: p.PID, StartTicks: p.StartTicks}, fs: fs, fd: -1}
	defer t.close()
	return t.Signal(sig)
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
