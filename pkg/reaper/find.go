package reaper

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
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
	// workers is how many goroutines may walk one level of a pass at once
	// (0 or 1: the pass is walked by its caller alone). Above 1, visit is
	// called from several goroutines at once and must be safe for that.
	workers int
	// lastFound is how many processes the last pass found (to size the
	// next one's map).
	lastFound int
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
	seen := make(map[int]Stat, f.lastFound)
	defer func() { f.lastFound = len(seen) }()
	l := f.l
	var kids []int
	f.cut = false
	late := func() bool {
		if !f.cut && f.pastDeadline() {
			f.cut = true
		}
		return f.cut
	}
	// drain visits the queued candidates and all their descendants, a
	// level at a time: the candidates queued, then their children, and so
	// on. A pid queued twice in one level (listed by two sources) is
	// checked once; its other candidates wait for the next level, where
	// they are skipped if the first one was confirmed and checked if not.
	drain := func(queue []candidate) {
		inLevel := map[int]bool{}
		for len(queue) > 0 && !late() {
			var level, later []candidate
			clear(inLevel)
			for _, c := range queue {
				if f.exclude[c.pid] {
					continue
				}
				if _, ok := seen[c.pid]; ok {
					continue
				}
				if inLevel[c.pid] {
					later = append(later, c)
					continue
				}
				inLevel[c.pid] = true
				level = append(level, c)
			}
			queue = later
			for i, v := range f.visitLevel(level, visit) {
				if !v.ok {
					continue
				}
				seen[level[i].pid] = v.st
				for _, k := range v.kids {
					queue = append(queue, candidate{pid: k, parent: level[i].pid, src: fromChild})
				}
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

// levelShare is the fewest candidates of a level each worker of a pass
// takes: a shorter level is walked by one (starting a worker costs about
// as much as checking a few processes).
const levelShare = 32

// maxPassWorkers bounds the workers of one pass: reading /proc scales with
// the CPUs, but a pause runs beside the sandbox's own work (and, in a batch,
// beside the pauses of other launches).
const maxPassWorkers = 4

// passWorkers is how many workers a pause's or continue's pass may use: up
// to maxPassWorkers, no more than the CPUs Go runs on, and 1 when no CPU is
// idle now. On a machine whose CPUs are all taken a helper waits for one
// (tens of ms under a heavy load) while the level it holds waits for it,
// and a faster walk reaches more of the processes still stopping after
// their group's SIGSTOP (one more pass); it is idle CPUs that make workers
// pay. The runnable count is the kernel's, as /proc/loadavg shows it (the
// host's, in a container): one small read per verb.
func passWorkers() int {
	cpus := runtime.GOMAXPROCS(0)
	var buf [128]byte
	data, err := readFile("/proc/loadavg", buf[:])
	if err != nil {
		return 1
	}
	runnable, ok := parseRunnable(data)
	// This verb is one of the runnable.
	if !ok || runnable-1 >= cpus {
		return 1
	}
	return min(cpus, maxPassWorkers)
}

// parseRunnable reads the runnable count of a /proc/loadavg line
// ("0.52 0.58 0.59 3/183 3131": 3).
func parseRunnable(data []byte) (int, bool) {
	fields := bytes.Fields(data)
	if len(fields) < 4 {
		return 0, false
	}
	run, _, ok := bytes.Cut(fields[3], []byte("/"))
	if !ok {
		return 0, false
	}
	n, err := atoi(run)
	return n, err == nil && n >= 0
}

// visited is what a pass found of one candidate: its stat, whether it was
// confirmed (and visited), and its children.
type visited struct {
	st   Stat
	ok   bool
	kids []int
}

// visitLevel checks and visits every candidate of level (distinct pids) and
// lists the children of each one confirmed, in the order visit requires:
// the process is visited (a pause stops it) before its children are read.
// The level is taken from its end: a children file lists the oldest child
// first, and a signal to a process group reaches its newest member first,
// so a pause that follows its group's SIGSTOP reaches first the processes
// that have had the longest to stop (fewer found still running, fewer
// passes).
// A long level is shared by up to f.workers workers, each taking the next
// candidate not taken yet; the level is done when every candidate is. A
// pass past its deadline checks no more candidates (those left count as
// not found; the caller's late() marks the pass cut).
func (f *finder) visitLevel(level []candidate, visit visitFunc) []visited {
	out := make([]visited, len(level))
	one := func(i int) {
		c := level[i]
		st, ok := f.check(c, visit)
		if !ok {
			return
		}
		threads := st.NumThreads
		if st.State == 'Z' {
			threads = 0 // a zombie leader's live threads still have children
		}
		kids, _ := f.l.FS.Children(c.pid, threads, nil)
		out[i] = visited{st: st, ok: true, kids: kids}
	}
	workers := min(f.workers, len(level)/levelShare)
	if workers < 2 {
		for i := len(level) - 1; i >= 0; i-- {
			if f.pastDeadline() {
				break
			}
			one(i)
		}
		return out
	}
	// The caller is one of the workers, and waits only for candidates
	// taken and not finished yet, never for a worker to start: on a busy
	// machine a helper may get no CPU before the level is done, and then
	// finds nothing left to take.
	var next, finished atomic.Int64
	n := int64(len(level))
	lastDone := make(chan struct{})
	work := func() {
		for {
			k := next.Add(1) - 1
			if k >= n {
				return
			}
			if !f.pastDeadline() {
				one(int(n - 1 - k))
			}
			if finished.Add(1) == n {
				close(lastDone)
			}
		}
	}
	for range workers - 1 {
		go work()
	}
	work()
	<-lastDone
	return out
}

// pastDeadline says the pass's deadline (if any) has passed. It only
// reads, so the workers of a level may ask it at once.
func (f *finder) pastDeadline() bool {
	return !f.deadline.IsZero() && time.Now().After(f.deadline)
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
