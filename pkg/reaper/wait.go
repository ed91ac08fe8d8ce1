package reaper

import (
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ngharness/ngharness/pkg/proto"
)

// Wait timing. A wait sleeps until the launch folder changes (inotify: the
// receipt is replaced by a rename), so hundreds of waits in one sandbox
// host cost nothing while their launches run; it wakes at least every
// waitCheck to see whether the supervisor died without recording the end.
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
	if err := l.Reload(); err != nil {
		return nil, proto.ExitUsage, err
	}
	lastCheck := time.Time{}
	for {
		if l.Receipt.Ended {
			removeEndedCgroup(l.Receipt)
			return l.Receipt, proto.ExitOK, nil
		}
		if time.Since(lastCheck) >= waitCheck {
			lastCheck = time.Now()
			if !l.FS.Live(l.supervisor()) {
				if err := l.Reload(); err != nil {
					return nil, proto.ExitUsage, err
				}
				if l.Receipt.Ended {
					continue
				}
				if h := l.harness(); h.PID == 0 || !l.FS.Live(h) {
					r := *l.Receipt
					r.Ended = true
					r.ExitCode = -1
					r.Error = "the supervisor exited without recording the harness's end"
					return &r, proto.ExitOK, nil
				}
			}
		}
		sleep := waitCheck
		if !deadline.IsZero() {
			left := time.Until(deadline)
			if left <= 0 {
				return l.Receipt, proto.ExitStillRunning, nil
			}
			sleep = min(sleep, left)
		}
		w.wait(sleep)
		if err := l.Reload(); err != nil {
			return nil, proto.ExitUsage, err
		}
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

// wait returns after an event in the folder or d, whichever comes first.
func (w dirWatch) wait(d time.Duration) {
	if w.fd < 0 {
		time.Sleep(min(d, waitPoll))
		return
	}
	fds := []unix.PollFd{{Fd: int32(w.fd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, int(d.Milliseconds())+1)
	if err != nil && err != unix.EINTR {
		time.Sleep(min(d, waitPoll))
		return
	}
	if n > 0 {
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
