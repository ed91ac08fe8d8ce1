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
// through the pidfd, so the process checked is the process signalled. It
// returns the stat read during the check. ErrNoProcess: gone;
// ErrNotSameProcess: the pid was reused.
func (fs FS) Signal(p proto.Proc, sig unix.Signal) (Stat, error) {
	if !noPidfd.Load() {
		fd, err := unix.PidfdOpen(p.PID, 0)
		switch {
		case err == nil:
			defer unix.Close(fd)
			st, err := fs.checkIdentity(p)
			if err != nil {
				return st, err
			}
			if err := unix.PidfdSendSignal(fd, sig, nil, 0); err != nil {
				if err == unix.ESRCH {
					return st, ErrNoProcess
				}
				return st, err
			}
			return st, nil
		case err == unix.ESRCH:
			return Stat{}, ErrNoProcess
		case err == unix.ENOSYS:
			noPidfd.Store(true)
		case err == unix.EINVAL:
			// A pid that is not a thread-group leader (or an old kernel):
			// fall back to the checked kill below.
		default:
			return Stat{}, err
		}
	}
	st, err := fs.checkIdentity(p)
	if err != nil {
		return st, err
	}
	if err := unix.Kill(p.PID, sig); err != nil {
		if err == unix.ESRCH {
			return st, ErrNoProcess
		}
		return st, err
	}
	return st, nil
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

// Identify returns the identity of the process living at pid now.
func (fs FS) Identify(pid int) (proto.Proc, error) {
	st, err := fs.ReadStat(pid)
	if err != nil {
		return proto.Proc{}, err
	}
	return proto.Proc{PID: pid, StartTicks: st.StartTicks}, nil
}
