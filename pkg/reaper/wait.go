package reaper

import (
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ngharness/ngharness/pkg/proto"
)

// Wait timing. A wait sleeps until the launch folder changes (inotify: the
// receipt is replaced by a rename) or the process it watches exits (a
// pidfd of the supervisor, then of the harness if the supervisor died
// without recording the end), so hundreds of waits in one sandbox host
// cost nothing while their launches run: no timer wakes them. Where no
// pidfd can be had (an old kernel, a /proc that is not this machine's), it
// wakes every waitCheck to see whether the supervisor died.
const (
	waitCheck = time.Second
	// waitPoll is the fallback when the folder cannot be watched.
	waitPoll = 250 * time.Millisecond
)

// Wait blocks until the launch in dir has ended or timeout passed (0: no
// limit) and returns its receipt with exit code 0 (ended) or 3 (still
// running). A launch whose supervisor died without recording the end, and
// whose harness is gone too, is reported ended with ExitCode -1 and an Error
// saying so (the receipt on disk is left as it is). What it does in each
// state is the transition table's (transitions.go): the state is derived
// once, at the start; while it waits, the loop below watches the two ways a
// launch moves on, its end recorded or its supervisor gone.
func Wait(dir string, timeout time.Duration) (*proto.Receipt, int, error) {
	l, st, _, code, err := openFor(VerbWait, dir, "", false)
	if err != nil {
		return nil, code, err
	}
	if c := Transition(VerbWait, st); c.Do == Refuse {
		return nil, c.Exit[0], refuse(VerbWait, st, l.noReceipt())
	}
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	// Watch before reading again, so no replacement of the receipt falls
	// between the read and the sleep.
	w := watchDir(l.Dir)
	defer w.close()
	ex := exitWatch{fd: -1}
	defer func() { ex.close() }()
	if err := l.Reload(); err != nil {
		return nil, proto.ExitUsage, err
	}
	lastCheck := time.Time{}
	for {
		if l.Receipt.Ended {
			removeEndedCgroup(l.Receipt)
			return l.Receipt, proto.ExitOK, nil
		}
		if ex.fd < 0 && time.Since(lastCheck) >= waitCheck || ex.exited() {
			lastCheck = time.Now()
			if sup := l.supervisor(); l.FS.Live(sup) {
				ex = ex.follow(l.FS, sup)
			} else {
				if err := l.Reload(); err != nil {
					return nil, proto.ExitUsage, err
				}
				if l.Receipt.Ended {
					continue
				}
				h := l.harness()
				if h.PID == 0 || !l.FS.Live(h) {
					r := *l.Receipt
					r.Ended = true
					r.ExitCode = -1
					r.Error = "the supervisor exited without recording the harness's end"
					return &r, proto.ExitOK, nil
				}
				ex = ex.follow(l.FS, h)
			}
		}
		sleep := waitCheck
		if ex.fd >= 0 {
			sleep = -1 // the pidfd wakes the wait: no timer
		}
		if !deadline.IsZero() {
			left := time.Until(deadline)
			if left <= 0 {
				return l.Receipt, proto.ExitStillRunning, nil
			}
			if sleep < 0 || left < sleep {
				sleep = left
			}
		}
		w.wait(sleep, ex.fd)
		if err := l.Reload(); err != nil {
			return nil, proto.ExitUsage, err
		}
	}
}

// exitWatch holds a pidfd of the process a wait watches, which becomes
// readable when that process exits (a zombie has exited). fd is -1 when
// none is held: the wait then looks every waitCheck.
type exitWatch struct {
	p  proto.Proc
	fd int
}

// follow returns a watch of p: ex itself when it already watches p, else a
// new one (ex closed). The pidfd is opened, then p's identity confirmed
// (pid and start time), so that a pid reused before the open is never
// watched in p's place; a p already gone, or no pidfd here (an old kernel,
// a /proc that is not this machine's), gives a watch without one.
func (ex exitWatch) follow(fs FS, p proto.Proc) exitWatch {
	if ex.fd >= 0 && ex.p == p {
		return ex
	}
	ex.close()
	if p.PID <= 0 || fs.Root != ProcFS.Root || noPidfd.Load() {
		return exitWatch{fd: -1}
	}
	fd, err := unix.PidfdOpen(p.PID, unix.PIDFD_NONBLOCK)
	if err != nil {
		return exitWatch{fd: -1}
	}
	if !fs.Live(p) {
		unix.Close(fd)
		return exitWatch{fd: -1}
	}
	return exitWatch{p: p, fd: fd}
}

// exited reports whether the watched process has exited, without waiting.
func (ex exitWatch) exited() bool {
	if ex.fd < 0 {
		return false
	}
	fds := []unix.PollFd{{Fd: int32(ex.fd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	return err == nil && n > 0 && fds[0].Revents&(unix.POLLIN|unix.POLLHUP|unix.POLLERR) != 0
}

func (ex exitWatch) close() {
	if ex.fd >= 0 {
		unix.Close(ex.fd)
	}
}

// dirWatch wakes a waiter when a file is renamed into, created in or
// written in a folder. Without inotify it falls back to a short sleep.
type dirWatch struct{ fd int }

func watchDir(dir string) dirWatch {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return dirWatch{fd: -1}
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_MOVED_TO|unix.IN_CREATE|unix.IN_CLOSE_WRITE); err != nil {
		unix.Close(fd)
		return dirWatch{fd: -1}
	}
	return dirWatch{fd: fd}
}

// wait returns after an event in the folder, the exit of the process
// whose pidfd is pidfd (-1: none), or d (negative: no limit), whichever
// comes first.
func (w dirWatch) wait(d time.Duration, pidfd int) {
	fds := make([]unix.PollFd, 0, 2)
	if w.fd >= 0 {
		fds = append(fds, unix.PollFd{Fd: int32(w.fd), Events: unix.POLLIN})
	}
	if pidfd >= 0 {
		fds = append(fds, unix.PollFd{Fd: int32(pidfd), Events: unix.POLLIN})
	}
	if w.fd < 0 && (d < 0 || d > waitPoll) {
		d = waitPoll // nothing tells the wait that the folder changed
	}
	timeout := -1
	if d >= 0 {
		timeout = int(d.Milliseconds()) + 1
	}
	n, err := unix.Poll(fds, timeout)
	if err != nil && err != unix.EINTR {
		time.Sleep(waitPoll)
		return
	}
	if n > 0 && w.fd >= 0 && fds[0].Revents != 0 {
		var buf [4096]byte
		for {
			if m, err := unix.Read(w.fd, buf[:]); m <= 0 || err != nil {
				break
			}
		}
	}
}

func (w dirWatch) close() {
	if w.fd >= 0 {
		unix.Close(w.fd)
	}
}

// Status returns the launch's receipt. An ended launch's cgroup is removed
// if it is empty. What it does in each state is the transition table's
// (transitions.go).
func Status(dir string) (*proto.Receipt, error) {
	l, st, _, _, err := openFor(VerbStatus, dir, "", false)
	if err != nil {
		return nil, err
	}
	if Transition(VerbStatus, st).Do == Refuse {
		return nil, refuse(VerbStatus, st, l.noReceipt())
	}
	removeEndedCgroup(l.Receipt)
	return l.Receipt, nil
}

// removeEndedCgroup removes the cgroup of an ended launch if it is empty:
// the supervisor leaves it while a detached process lives in it, and when
// that process ends by itself, the next verb to look is the one that sees
// it empty. Only a folder named as the supervisor names the launch's cgroup
// is touched.
func removeEndedCgroup(r *proto.Receipt) {
	if !r.Ended || filepath.Base(r.Cgroup) != cgroupName(r.ID, r.SupervisorPID) {
		return
	}
	if cg := OpenCgroup(r.Cgroup, r.CgroupVersion); cg != nil {
		cg.Remove()
	}
}
