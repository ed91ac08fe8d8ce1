package reaper

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/ngharness/ngharness/pkg/proto"
)

// source says how a candidate process was found, and so how its identity is
// checked before anything is done to it.
type source uint8

const (
	// fromChild: listed in a launch process's children; checked by its ppid.
	fromChild source = iota
	// fromKnown: recorded by pid and start time; checked by start time.
	fromKnown
	// fromTag: found by the tag scan; checked by its environment.
	fromTag
	// fromCgroup: listed in the launch's cgroup; checked by /proc/PID/cgroup.
	fromCgroup
)

type candidate struct {
	pid    int
	parent int    // fromChild: the process it was listed under
	start  uint64 // fromKnown: its start time
	src    source
}

// visitFunc acts on a process as soon as it is found and checked, before its
// children are read. fd is a pidfd of it, or -1 where pidfds are missing.
type visitFunc func(fd int, st Stat)

// finder finds the processes of a launch: the supervisor's subtree, the
// launch's cgroup, and (as the fallback, or when sweep is set) every process
// carrying the launch's tag and every process an earlier pass recorded, with
// all their descendants.
type finder struct {
	l       *Launch
	exclude map[int]bool
	tag     string
	sweep   bool // also the tag scan and the known set, even when supervised
	known   []proto.Proc
	cgname  []byte
}

func newFinder(l *Launch, sweep bool) (*finder, error) {
	f := &finder{l: l, exclude: map[int]bool{0: true, 1: true}, sweep: sweep}
	if l.Receipt != nil {
		f.tag = proto.TagEnv + "=" + l.Receipt.ID
		f.exclude[l.Receipt.SupervisorPID] = true
	}
	// Never act on ourselves or whoever runs us.
	for pid := os.Getpid(); pid > 1 && !f.exclude[pid]; {
		f.exclude[pid] = true
		st, err := l.FS.ReadStat(pid)
		if err != nil {
			break
		}
		pid = st.PPID
	}
	if l.Cgroup != nil {
		f.cgname = []byte("/" + filepath.Base(l.Cgroup.Path))
	}
	if sweep || !l.Supervised {
		known, err := readProcSet(l.path(proto.KnownFile))
		if err != nil {
			return nil, err
		}
		f.known = known
	}
	return f, nil
}

// method names how this finder reaches the processes.
func (f *finder) method(frozen bool) string {
	switch {
	case !f.l.Supervised:
		return proto.MethodScan
	case frozen:
		return proto.MethodCgroupSignal
	}
	return proto.MethodSignal
}

// pass walks the launch once, calling visit on every process found, and
// returns them by pid.
func (f *finder) pass(visit visitFunc) map[int]Stat {
	seen := map[int]Stat{}
	var queue []candidate
	l := f.l
	// The supervisor is checked on every pass: it may exit during a stop.
	l.Supervised = l.Receipt != nil && l.FS.Alive(l.supervisor())
	if l.Supervised {
		sup := l.Receipt.SupervisorPID
		var kids []int
		kids, _ = l.FS.Children(sup, 0, kids)
		for _, k := range kids {
			queue = append(queue, candidate{pid: k, parent: sup, src: fromChild})
		}
	}
	if h := l.harness(); h.PID > 0 {
		queue = append(queue, candidate{pid: h.PID, start: h.StartTicks, src: fromKnown})
	}
	if l.Cgroup != nil {
		if pids, err := l.Cgroup.Procs(); err == nil {
			for _, p := range pids {
				queue = append(queue, candidate{pid: p, src: fromCgroup})
			}
		}
	}
	for _, p := range f.known {
		queue = append(queue, candidate{pid: p.PID, start: p.StartTicks, src: fromKnown})
	}
	if f.tag != "" && (f.sweep || !l.Supervised) {
		if pids, err := l.FS.PIDs(); err == nil {
			for _, p := range pids {
				if !f.exclude[p] && l.FS.HasEnv(p, f.tag) {
					queue = append(queue, candidate{pid: p, src: fromTag})
				}
			}
		}
	}
	var kids []int
	for len(queue) > 0 {
		c := queue[0]
		queue = queue[1:]
		if f.exclude[c.pid] {
			continue
		}
		if _, ok := seen[c.pid]; ok {
			continue
		}
		st, ok := f.check(c, visit)
		if !ok {
			continue
		}
		seen[c.pid] = st
		threads := st.NumThreads
		if st.State == 'Z' {
			threads = 0 // a zombie leader's live threads still have children
		}
		kids, _ = l.FS.Children(c.pid, threads, kids[:0])
		for _, k := range kids {
			queue = append(queue, candidate{pid: k, parent: c.pid, src: fromChild})
		}
	}
	return seen
}

// check opens a pidfd of c, confirms c is what its source says, and visits
// it. The pidfd is opened before the check, so a pid reused after the check
// cannot receive what was meant for the process checked.
func (f *finder) check(c candidate, visit visitFunc) (Stat, bool) {
	fd := -1
	if !noPidfd.Load() {
		var err error
		fd, err = unix.PidfdOpen(c.pid, 0)
		switch {
		case err == nil:
			defer unix.Close(fd)
		case err == unix.ESRCH:
			return Stat{}, false
		case err == unix.ENOSYS:
			noPidfd.Store(true)
			fd = -1
		default:
			fd = -1
		}
	}
	st, err := f.l.FS.ReadStat(c.pid)
	if err != nil {
		return st, false
	}
	switch c.src {
	case fromChild:
		if st.PPID != c.parent {
			return st, false
		}
	case fromKnown:
		if st.StartTicks != c.start {
			return st, false
		}
	case fromTag:
		if !f.l.FS.HasEnv(c.pid, f.tag) {
			return st, false
		}
	case fromCgroup:
		if !f.inCgroup(c.pid) {
			return st, false
		}
	}
	if visit != nil {
		visit(fd, st)
	}
	return st, true
}

func (f *finder) inCgroup(pid int) bool {
	if f.cgname == nil {
		return false
	}
	data, err := readFile(f.l.FS.pidPath(pid, "/cgroup"), make([]byte, 1024))
	if err != nil {
		return false
	}
	for _, line := range bytes.Split(data, []byte("\n")) {
		if bytes.HasSuffix(line, f.cgname) {
			return true
		}
	}
	return false
}

// signalFD sends sig through a pidfd, or by pid where pidfds are missing (the
// identity was checked just before).
func signalFD(fd, pid int, sig unix.Signal) error {
	var err error
	if fd >= 0 {
		err = unix.PidfdSendSignal(fd, sig, nil, 0)
	} else {
		err = unix.Kill(pid, sig)
	}
	if errors.Is(err, unix.ESRCH) {
		return ErrNoProcess
	}
	return err
}

// signalGroup signals the harness's process group, but only while the
// harness itself (pid and start time) is alive, so the group id is ours.
// kill(-pgid) is race-free against fork: the kernel holds births in a group
// being signalled.
func (l *Launch) signalGroup(sig unix.Signal) bool {
	h := l.harness()
	if h.PID <= 0 || !l.FS.Alive(h) {
		return false
	}
	return unix.Kill(-l.Receipt.HarnessPGID, sig) == nil
}

func isStopped(state byte) bool { return state == 'T' || state == 't' }

func procOf(st Stat) proto.Proc { return proto.Proc{PID: st.PID, StartTicks: st.StartTicks} }
