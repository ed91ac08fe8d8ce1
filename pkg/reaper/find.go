package reaper

import (
	"bytes"
	"os"
	"path/filepath"
	"time"

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
	inode  uint64 // fromKnown: its pidfs inode number where recorded (0: none)
	src    source
}

// visitFunc acts on a process as soon as it is found and checked, before its
// children are read.
type visitFunc func(t *target)

// target is a process reached by a pass. Its pidfd is opened only when it is
// signalled, and the start time is checked again through it, so a pid reused
// after the check cannot receive what was meant for the process checked.
type target struct {
	Stat
	fs    FS
	fd    int
	inode uint64 // the pidfs inode recorded for it (0: none)
}

// Signal sends sig to the target if it is still the process that was
// checked. ErrNoProcess: gone; ErrNotSameProcess: its pid was reused.
func (t *target) Signal(sig unix.Signal) error {
	if t.fd < 0 && !noPidfd.Load() {
		fd, err := unix.PidfdOpen(t.PID, 0)
		switch {
		case err == nil:
			t.fd = fd
			if t.inode != 0 && havePidfs() && fdInode(fd) != t.inode {
				return ErrNotSameProcess
			}
		case err == unix.ESRCH:
			return ErrNoProcess
		case err == unix.ENOSYS:
			noPidfd.Store(true)
		}
		if t.fd >= 0 {
			if _, err := t.fs.checkIdentity(procOf(t.Stat)); err != nil {
				return err
			}
		}
	}
	if t.fd < 0 {
		// No pidfd (old kernel, or a zombie leader): check, then kill.
		if _, err := t.fs.checkIdentity(procOf(t.Stat)); err != nil {
			return err
		}
		return kill(t.PID, sig)
	}
	err := unix.PidfdSendSignal(t.fd, sig, nil, 0)
	if err == unix.ESRCH {
		return ErrNoProcess
	}
	return err
}

func (t *target) close() {
	if t.fd >= 0 {
		unix.Close(t.fd)
		t.fd = -1
	}
}

func kill(pid int, sig unix.Signal) error {
	err := unix.Kill(pid, sig)
	if err == unix.ESRCH {
		return ErrNoProcess
	}
	return err
}

// finder finds the processes of a launch: the supervisor's subtree, the
// harness (by the receipt's pid and start time) and its descendants, the
// launch's cgroup; and, as the fallback for a supervisor that is gone or
// never ran, every process carrying the launch's tag and every process an
// earlier pass recorded, with all their descendants.
//
// The tag is searched only when the supervisor was already gone when the
// verb began. Launch ids can collide (local sandboxes share one pid
// namespace), and while the supervisor lives its tree holds every process of
// the launch; a supervisor that exits during the verb (a stop ends the
// harness, and the supervisor with it) leaves what the verb already found,
// which its passes keep following, and the known set, which names processes
// by pid and start time and so cannot name another launch's.
type finder struct {
	l         *Launch
	exclude   map[int]bool
	tag       string
	fallback  bool // the supervisor was gone (or never ran) when the verb began
	known     []proto.Proc
	readKnown bool // the known set was read from the launch folder
	skipped   int  // lines of the known set that were not records
	cgname    []byte
	used      map[string]bool // sources searched (Source* constants)
	isKnown   map[proto.Proc]bool
	inodes    map[proto.Proc]uint64 // pidfs inodes the known set recorded
	// deadline, when set, ends a pass early (a fork storm can outgrow a
	// walk); cut says the last pass was ended so.
	deadline time.Time
	cut      bool
}

func newFinder(l *Launch) *finder {
	f := &finder{l: l, exclude: map[int]bool{0: true, 1: true}, fallback: !l.Supervised, used: map[string]bool{}, isKnown: map[proto.Proc]bool{}, inodes: map[proto.Proc]uint64{}}
	if l.ID != "" {
		f.tag = proto.TagEnv + "=" + l.ID
	}
	if l.Receipt != nil {
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
	if f.fallback {
		f.loadKnown()
	}
	return f
}

// loadKnown adds the launch's known set to what the finder follows, once.
func (f *finder) loadKnown() {
	if f.readKnown {
		return
	}
	f.readKnown = true
	known, inodes, skipped := readProcSet(f.l.path(proto.KnownFile))
	f.skipped += skipped
	for p, ino := range inodes {
		if ino != 0 {
			f.inodes[p] = ino
		}
	}
	f.add(known)
}

// add appends to the known processes the ones not there yet, and returns
// those.
func (f *finder) add(procs []proto.Proc) []proto.Proc {
	var fresh []proto.Proc
	for _, p := range procs {
		if !f.isKnown[p] {
			f.isKnown[p] = true
			f.known = append(f.known, p)
			fresh = append(fresh, p)
		}
	}
	return fresh
}

// searched lists the sources the finder used, in the order of the
// Source* constants.
func (f *finder) searched() []string {
	out := []string{}
	for _, s := range []string{proto.SourceTree, proto.SourceGroup, proto.SourceCgroup, proto.SourceKnown, proto.SourceTag} {
		if f.used[s] {
			out = append(out, s)
		}
	}
	return out
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
	l := f.l
	var kids []int
	f.cut = false
	late := func() bool {
		if !f.cut && !f.deadline.IsZero() && time.Now().After(f.deadline) {
			f.cut = true
		}
		return f.cut
	}
	// drain visits the queued candidates and all their descendants.
	drain := func(queue []candidate) {
		for len(queue) > 0 && !late() {
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
	}
	// The supervisor's tree first: it holds every process while the
	// supervisor lives. It is checked on every pass: it may exit mid-stop.
	l.Supervised = l.Receipt != nil && l.FS.Live(l.supervisor())
	if l.Supervised {
		f.used[proto.SourceTree] = true
		sup := l.Receipt.SupervisorPID
		var queue []candidate
		kids, _ = l.FS.Children(sup, 0, kids[:0])
		for _, k := range kids {
			queue = append(queue, candidate{pid: k, parent: sup, src: fromChild})
		}
		drain(queue)
	}
	// Then what the tree may have missed, each with its descendants.
	var queue []candidate
	if h := l.harness(); h.PID > 0 {
		queue = append(queue, candidate{pid: h.PID, start: h.StartTicks, src: fromKnown})
	}
	if !l.Supervised {
		f.loadKnown() // the supervisor is gone: what it recorded is needed now
	}
	if l.Cgroup != nil {
		if pids, err := l.Cgroup.Procs(); err == nil {
			f.used[proto.SourceCgroup] = true
			for _, p := range pids {
				if _, ok := seen[p]; !ok {
					queue = append(queue, candidate{pid: p, src: fromCgroup})
				}
			}
		}
	}
	if f.readKnown {
		f.used[proto.SourceKnown] = true
	}
	for _, p := range f.known {
		if _, ok := seen[p.PID]; !ok {
			queue = append(queue, candidate{pid: p.PID, start: p.StartTicks, inode: f.inodes[p], src: fromKnown})
		}
	}
	drain(queue)
	// The tag scan last, each tagged process visited (with its descendants)
	// as soon as it is found: the scan reads every process's environment,
	// and one that a fork storm keeps long must have acted on what it
	// reached by the time its deadline cuts it.
	if f.tag != "" && f.fallback {
		if pids, err := l.FS.PIDs(); err == nil {
			f.used[proto.SourceTag] = true
			for _, p := range pids {
				if late() {
					break
				}
				if _, ok := seen[p]; !ok && !f.exclude[p] && l.FS.HasEnv(p, f.tag) {
					drain([]candidate{{pid: p, src: fromTag}})
				}
			}
		}
	}
	return seen
}

// check confirms c is what its source says, and visits it.
func (f *finder) check(c candidate, visit visitFunc) (Stat, bool) {
	st, err := f.l.FS.ReadStat(c.pid)
	if err != nil {
		return st, false
	}
	pidfd := -1
	defer func() {
		if pidfd >= 0 {
			unix.Close(pidfd)
		}
	}()
	switch c.src {
	case fromChild:
		if st.PPID != c.parent {
			return st, false
		}
	case fromKnown:
		if st.StartTicks != c.start {
			return st, false
		}
		// Same pid and start time, but another pidfs inode: the pid was
		// reused within one clock tick.
		fd, ok := openAs(c.pid, c.inode)
		if !ok {
			return st, false
		}
		pidfd = fd
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
		t := target{Stat: st, fs: f.l.FS, fd: pidfd, inode: c.inode}
		pidfd = -1 // the target closes it
		visit(&t)
		t.close()
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
