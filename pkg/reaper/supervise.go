package reaper

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ngharness/ngharness/pkg/proto"
)

// RunOptions describes one launch for Supervise.
type RunOptions struct {
	// Dir is the launch folder (absolute); ID the launch id.
	Dir, ID string
	// Command is the harness's argv.
	Command []string
	// Timeout, when non-zero, ends the harness after that much running time
	// (time spent paused does not count): SIGINT to its group, then SIGKILL
	// after Grace.
	Timeout, Grace time.Duration
	// Detached sends the harness's output to Dir/stdout and Dir/stderr and
	// its input from /dev/null; otherwise it inherits ngsup's stdio.
	Detached bool
	// Stdin, when set, is the file the harness reads as its stdin instead
	// (detached or not): how an adapter hands a harness input it reads
	// from stdin, such as a message to continue a session with.
	Stdin string
	// Ready, if set, is written "ok\n" (or the error) and closed once the
	// first receipt is on disk: the detaching parent waits for it.
	Ready *os.File
	// NoCgroup skips making a cgroup for the launch.
	NoCgroup bool
	// Log receives the supervisor's own messages.
	Log func(format string, args ...any)
}

// pollStart is how often a run held by a pause file looks again.
const pollStart = 20 * time.Millisecond

// recordEvery is how often the supervisor records the processes it holds
// (its children, among them every orphan it adopted) in the launch's known
// set, besides at each reap: once it is gone, they are found from there.
const recordEvery = 250 * time.Millisecond

// forwarded are the signals the supervisor passes on to the harness's group.
var forwarded = []os.Signal{unix.SIGINT, unix.SIGTERM, unix.SIGHUP, unix.SIGQUIT, unix.SIGUSR1, unix.SIGUSR2}

// Supervise runs a launch to its end, as the child subreaper of everything
// the harness starts, and returns the harness's exit code (128+N for signal
// N; 127/126 when the command cannot be run). Each setup step returns an
// error; then one loop waits for signals and reaps.
func Supervise(opt RunOptions) (code int, err error) {
	s, err := newSupervisor(opt)
	if err != nil {
		if opt.Ready != nil {
			fmt.Fprintf(opt.Ready, "%v\n", err)
			opt.Ready.Close()
		}
		return proto.ExitUsage, err
	}
	if opt.Ready != nil {
		fmt.Fprintln(opt.Ready, "ok")
		opt.Ready.Close()
	}
	defer signal.Stop(s.sigs)
	started, err := s.waitToStart()
	if err != nil || !started {
		return s.receipt.ExitCode, err
	}
	s.loop()
	return s.finish()
}

type supervisor struct {
	opt     RunOptions
	receipt proto.Receipt
	sigs    chan os.Signal
	cg      *Cgroup
	begin   time.Time
	status  unix.WaitStatus
	exited  bool
	// held are the children already recorded in the known set; a child
	// leaves it when reaped, so a pid reused later by a new child is
	// recorded again, and the set never outgrows the children.
	held map[int]bool
	kids []int
}

// newSupervisor checks the options, becomes a child subreaper, and writes the
// first receipt.
func newSupervisor(opt RunOptions) (*supervisor, error) {
	dir, err := proto.ValidateDir(opt.Dir)
	if err != nil {
		return nil, err
	}
	opt.Dir = dir
	if err := proto.ValidateID(opt.ID); err != nil {
		return nil, err
	}
	if len(opt.Command) == 0 {
		return nil, errors.New("run: no command given after --")
	}
	if opt.Grace <= 0 {
		opt.Grace = DefaultGrace
	}
	if opt.Log == nil {
		opt.Log = func(string, ...any) {}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("%w: create %s: %v", proto.ErrBadDir, dir, err)
	}
	unlock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if st := runState(dir); Transition(VerbRun, st).Do == Refuse {
		return nil, refuse(VerbRun, st, fmt.Errorf("%w: %s (use a new folder for each launch)", proto.ErrLaunchExists, dir))
	}
	// The folder the launch runs from, so that a copy of it (a snapshot or
	// fork of the sandbox) is known for one. A folder that cannot take it
	// cannot take the receipt either, which fails just below.
	if err := recordOrigin(dir); err != nil {
		opt.Log("ngsup: launch %s: %v", opt.ID, err)
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return nil, fmt.Errorf("become child subreaper: %w", err)
	}
	self, err := ProcFS.Identify(os.Getpid())
	if err != nil {
		return nil, fmt.Errorf("read own start time: %w", err)
	}
	s := &supervisor{opt: opt, sigs: make(chan os.Signal, 64), held: map[int]bool{}}
	signal.Notify(s.sigs, append([]os.Signal{unix.SIGCHLD}, forwarded...)...)
	s.receipt = proto.Receipt{
		ID:                   opt.ID,
		Command:              opt.Command,
		SupervisorPID:        self.PID,
		SupervisorStartTicks: self.StartTicks,
		ExitCode:             -1,
	}
	if err := s.write(); err != nil {
		signal.Stop(s.sigs)
		return nil, err
	}
	return s, nil
}

func (s *supervisor) write() error {
	return proto.WriteReceipt(s.opt.Dir, &s.receipt)
}

func (s *supervisor) path(name string) string { return filepath.Join(s.opt.Dir, name) }

// waitToStart starts the harness unless a stop file says never, waiting while
// a pause file is present. The check and the start happen under the launch
// folder's lock, so a pause or stop lands either before (held) or after
// (the harness is there to pause or stop).
func (s *supervisor) waitToStart() (bool, error) {
	for {
		unlock, err := lockDir(s.opt.Dir)
		if err != nil {
			return false, err
		}
		switch {
		case exists(s.path(proto.StopFile)):
			unlock()
			return false, s.endUnstarted("a stop file was present before the harness started; nothing was started")
		case exists(s.path(proto.PauseFile)):
			unlock()
		default:
			err := s.start()
			unlock()
			// A command that could not be run ends the launch: no harness.
			return err == nil && s.receipt.Started, err
		}
		select {
		case sig := <-s.sigs:
			if sig != unix.SIGCHLD {
				return false, s.endUnstarted(fmt.Sprintf("received %v before the harness started; nothing was started", sig))
			}
		case <-time.After(pollStart):
		}
	}
}

func (s *supervisor) endUnstarted(why string) error {
	s.receipt.Ended = true
	s.receipt.EndedAt = time.Now()
	s.receipt.ExitCode = -1
	s.receipt.CleanupConfirmed = true
	s.receipt.Error = why
	s.opt.Log("ngsup: launch %s: %s", s.opt.ID, why)
	return s.write()
}

// start forks the harness into its own session and process group (and the
// launch's cgroup where one can be made), with the launch's tag in its
// environment. In a session of its own the harness's group is orphaned from
// birth (no member has a parent in another group of the same session), so
// the supervisor's death changes nothing for it: the kernel sends SIGHUP and
// SIGCONT only to a group that becomes orphaned while a member is stopped,
// which would wake a paused launch or kill its members.
func (s *supervisor) start() error {
	argv := s.opt.Command
	path, code, err := lookCommand(argv[0])
	if err != nil {
		return s.failStart(code, err)
	}
	files, closeFiles, err := s.stdio()
	if err != nil {
		return s.failStart(proto.ExitInternal, err)
	}
	defer closeFiles()
	attr := &syscall.ProcAttr{
		Env:   taggedEnv(os.Environ(), s.opt.ID),
		Files: files,
		Sys:   &syscall.SysProcAttr{Setsid: true},
	}
	if !s.opt.NoCgroup {
		s.cg, _ = CreateCgroup(cgroupName(s.opt.ID, os.Getpid()))
	}
	pid, err := s.fork(path, argv, attr)
	if err != nil {
		code := proto.ExitExecNotRunnable
		if errors.Is(err, unix.ENOENT) {
			code = proto.ExitExecNotFound
		}
		return s.failStart(code, fmt.Errorf("start %s: %w", argv[0], err))
	}
	s.begin = time.Now()
	s.receipt.Started = true
	s.receipt.StartedAt = s.begin
	s.receipt.HarnessPID = pid
	s.receipt.HarnessPGID = pid // a session leader leads its group too
	if st, err := ProcFS.ReadStat(pid); err == nil {
		s.receipt.HarnessStartTicks = st.StartTicks
	}
	if s.cg != nil {
		s.receipt.Cgroup = s.cg.Path
		s.receipt.CgroupVersion = s.cg.Version
	}
	return s.write()
}

// fork starts the harness, born inside the launch's cgroup when there is
// one: v2 through clone3's CLONE_INTO_CGROUP, v1 by forking from inside it.
func (s *supervisor) fork(path string, argv []string, attr *syscall.ProcAttr) (int, error) {
	if s.cg != nil && s.cg.Version == 2 {
		fd, err := unix.Open(s.cg.Path, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err == nil {
			attr.Sys.UseCgroupFD, attr.Sys.CgroupFD = true, fd
			pid, err := syscall.ForkExec(path, argv, attr)
			unix.Close(fd)
			if err == nil {
				return pid, nil
			}
			attr.Sys.UseCgroupFD, attr.Sys.CgroupFD = false, 0
			if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EACCES) || errors.Is(err, unix.ENOEXEC) {
				s.dropCgroup()
				return 0, err
			}
		}
		s.dropCgroup()
	}
	if s.cg != nil && s.cg.Version == 1 {
		if restore, err := s.cg.AddSelf(); err == nil {
			pid, err := syscall.ForkExec(path, argv, attr)
			if rerr := restore(); rerr != nil {
				s.opt.Log("ngsup: %v", rerr)
			}
			if err != nil {
				s.dropCgroup()
			}
			return pid, err
		}
		s.dropCgroup()
	}
	return syscall.ForkExec(path, argv, attr)
}

func (s *supervisor) dropCgroup() {
	if s.cg != nil {
		s.cg.Remove()
		s.cg = nil
	}
}

func (s *supervisor) failStart(code int, err error) error {
	s.receipt.Ended = true
	s.receipt.EndedAt = time.Now()
	s.receipt.ExitCode = code
	s.receipt.CleanupConfirmed = true
	s.receipt.Error = err.Error()
	s.opt.Log("ngsup: launch %s: %v", s.opt.ID, err)
	if werr := s.write(); werr != nil {
		return errors.Join(err, werr)
	}
	return nil
}

// lookCommand resolves argv[0] as a shell would, and says which exit code a
// failure gets: 127 not found, 126 found but not runnable.
func lookCommand(name string) (string, int, error) {
	path, err := exec.LookPath(name)
	if err == nil {
		return path, 0, nil
	}
	if errors.Is(err, fs.ErrPermission) {
		return "", proto.ExitExecNotRunnable, fmt.Errorf("start %s: permission denied", name)
	}
	if strings.Contains(name, "/") {
		if fi, serr := os.Stat(name); serr == nil && !fi.IsDir() {
			return "", proto.ExitExecNotRunnable, fmt.Errorf("start %s: not executable", name)
		}
	}
	return "", proto.ExitExecNotFound, fmt.Errorf("start %s: command not found", name)
}

// taggedEnv returns env with the launch tag set to id (replacing any tag
// inherited from an enclosing launch).
func taggedEnv(env []string, id string) []string {
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if !strings.HasPrefix(kv, proto.TagEnv+"=") {
			out = append(out, kv)
		}
	}
	return append(out, proto.TagEnv+"="+id)
}

func (s *supervisor) stdio() ([]uintptr, func(), error) {
	input := os.DevNull
	if s.opt.Stdin != "" {
		input = s.opt.Stdin
	}
	if !s.opt.Detached && s.opt.Stdin == "" {
		return []uintptr{0, 1, 2}, func() {}, nil
	}
	in, err := os.Open(input)
	if err != nil {
		return nil, nil, fmt.Errorf("open the harness's stdin: %w", err)
	}
	if !s.opt.Detached {
		return []uintptr{in.Fd(), 1, 2}, func() { in.Close() }, nil
	}
	out, err := os.OpenFile(s.path(proto.StdoutFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		in.Close()
		return nil, nil, err
	}
	errf, err := os.OpenFile(s.path(proto.StderrFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		in.Close()
		out.Close()
		return nil, nil, err
	}
	return []uintptr{in.Fd(), out.Fd(), errf.Fd()}, func() { in.Close(); out.Close(); errf.Close() }, nil
}

// loop is the supervisor's one loop: wait for a signal, reap everything,
// forward what is meant for the harness, record the processes it holds,
// until the harness has exited.
func (s *supervisor) loop() {
	pgid := s.receipt.HarnessPGID
	var timeout, kill <-chan time.Time
	if s.opt.Timeout > 0 {
		timeout = time.After(s.opt.Timeout)
	}
	record := time.NewTicker(recordEvery)
	defer record.Stop()
	pauseMoved, unwatch := watchPauseFile(s.opt.Dir)
	defer unwatch()
	recording := true
	// The harness may have exited before the signal handler saw it.
	if s.reap() {
		return
	}
	s.record()
	for {
		select {
		case <-pauseMoved:
			// While a pause holds the launch the supervisor records
			// nothing (the pause recorded what it holds): it would be the
			// one thing in the sandbox still moving. It starts again when
			// the pause file goes.
			switch paused := exists(s.path(proto.PauseFile)); {
			case paused && recording:
				s.record()
				record.Stop()
				recording = false
			case !paused && !recording:
				s.record()
				record.Reset(recordEvery)
				recording = true
			}
		case sig := <-s.sigs:
			if sig == unix.SIGCHLD {
				if s.reap() {
					return
				}
				s.record()
				continue
			}
			unix.Kill(-pgid, sig.(unix.Signal))
		case <-record.C:
			s.recordAdopted()
		case <-timeout:
			timeout = nil
			if left := s.runningTimeLeft(); left > 0 {
				timeout = time.After(left)
				continue
			}
			s.receipt.TimedOut = true
			s.opt.Log("ngsup: launch %s: timed out after %s; interrupting the harness", s.opt.ID, s.opt.Timeout)
			unix.Kill(-pgid, unix.SIGINT)
			unix.Kill(-pgid, unix.SIGCONT)
			kill = time.After(s.opt.Grace)
		case <-kill:
			kill = nil
			unix.Kill(-pgid, unix.SIGKILL)
		}
	}
}

// watchPauseFile returns a channel that receives when a file is created in,
// removed from or moved in or out of dir (inotify), which is how the
// supervisor learns that a pause began or ended without waking up to look,
// and the function that ends the watch. Without inotify the channel never
// receives: the supervisor then records on its timer throughout.
func watchPauseFile(dir string) (<-chan struct{}, func()) {
	events := make(chan struct{}, 1)
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return events, func() {}
	}
	mask := uint32(unix.IN_CREATE | unix.IN_DELETE | unix.IN_MOVED_TO | unix.IN_MOVED_FROM)
	var quit [2]int
	if _, err := unix.InotifyAddWatch(fd, dir, mask); err != nil || unix.Pipe2(quit[:], unix.O_CLOEXEC) != nil {
		unix.Close(fd)
		return events, func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}, {Fd: int32(quit[0]), Events: unix.POLLIN}}
		var buf [4096]byte
		for {
			if _, err := unix.Poll(fds, -1); err != nil && err != unix.EINTR {
				return
			}
			if fds[1].Revents != 0 {
				return
			}
			if fds[0].Revents == 0 {
				continue
			}
			for {
				if n, err := unix.Read(fd, buf[:]); n <= 0 || err != nil {
					break
				}
			}
			select {
			case events <- struct{}{}:
			default:
			}
		}
	}()
	return events, func() {
		unix.Close(quit[1])
		<-done
		unix.Close(quit[0])
		unix.Close(fd)
	}
}

// runningTimeLeft is how much of the timeout is left once the time spent
// paused is taken out; while a pause holds the launch it is at least a
// second.
func (s *supervisor) runningTimeLeft() time.Duration {
	if exists(s.path(proto.PauseFile)) {
		return time.Second
	}
	l := &Launch{Dir: s.opt.Dir}
	ran := time.Since(s.begin) - l.pausedTotal()
	return s.opt.Timeout - ran
}

// reap collects every exited child. When the harness has exited, what is
// left in its process group is killed first, while the harness's zombie still
// holds the group id, so the id cannot have been reused. It reports whether
// the harness has exited.
func (s *supervisor) reap() bool {
	hpid := s.receipt.HarnessPID
	if !s.exited {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, hpid, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
		if err == nil && siginfoPID(&info) == hpid {
			unix.Kill(-s.receipt.HarnessPGID, unix.SIGKILL)
			if s.cg != nil && s.cg.Version == 1 {
				// A SIGKILLed task frozen under v1 dies only once thawed.
				s.cg.Thaw()
			}
		}
	}
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			break
		}
		delete(s.held, pid)
		if pid == hpid && !s.exited {
			s.exited = true
			s.status = ws
		}
	}
	return s.exited
}

// record appends to the launch's known set (pid and start time) every child
// of the supervisor not recorded yet: the harness and every orphan it
// adopted. The walk of a later stop or pause finds their descendants. The
// children of every thread are read: each thread's file lists only the
// children it forked or adopted.
func (s *supervisor) record() { s.recordFrom(false) }

// recordAdopted is record's periodic form: it reads the children of the
// main thread only. An orphan is adopted by the first live thread of its
// subreaper, the main thread of a Go program, which never exits; what the
// supervisor forks itself (the harness, from any thread) is recorded by
// the full record at the start, at each SIGCHLD and when a pause ends. At
// 512 launches on 2 CPUs the full record every 250 ms (a listing of the
// task folder and a read of each thread's file) took 13.5 % of the
// machine's CPU during a checkpoint (docs/BENCHMARKS.md).
func (s *supervisor) recordAdopted() { s.recordFrom(true) }

func (s *supervisor) recordFrom(mainThread bool) {
	self := os.Getpid()
	if mainThread {
		s.kids, _ = ProcFS.TaskChildren(self, self, s.kids[:0])
	} else {
		s.kids, _ = ProcFS.Children(self, 0, s.kids[:0])
	}
	var fresh []proto.Proc
	for _, pid := range s.kids {
		if s.held[pid] {
			continue
		}
		st, err := ProcFS.ReadStat(pid)
		if err != nil || st.PPID != self {
			continue
		}
		s.held[pid] = true
		fresh = append(fresh, procOf(st))
	}
	// The real /proc, so that each record carries its pidfs inode.
	l := Launch{Dir: s.opt.Dir, FS: ProcFS}
	if err := l.remember(fresh); err != nil {
		s.opt.Log("ngsup: launch %s: %v", s.opt.ID, err)
	}
}

// finish waits (briefly) for the harness's process group to empty, reaping,
// then records the end.
func (s *supervisor) finish() (int, error) {
	pgid := s.receipt.HarnessPGID
	deadline := time.Now().Add(2 * time.Second)
	confirmed := false
	for {
		s.reap()
		if err := unix.Kill(-pgid, 0); err == unix.ESRCH {
			confirmed = true
			break
		}
		if time.Now().After(deadline) {
			break
		}
		unix.Kill(-pgid, unix.SIGKILL)
		time.Sleep(5 * time.Millisecond)
	}
	// What outlives the harness (detached processes it adopted) is found
	// from the known set once the supervisor has exited.
	s.record()
	code := -1
	switch {
	case s.status.Exited():
		code = s.status.ExitStatus()
	case s.status.Signaled():
		s.receipt.Signal = int(s.status.Signal())
		code = proto.ExitSignalBase + int(s.status.Signal())
	}
	s.receipt.Ended = true
	s.receipt.EndedAt = time.Now()
	s.receipt.ExitCode = code
	s.receipt.CleanupConfirmed = confirmed
	if !confirmed {
		s.receipt.Error = "processes were left in the harness's process group after it exited"
	}
	if s.cg != nil {
		// It stays while detached processes live in it: a later stop, wait
		// or status that finds it empty removes it.
		s.cg.Release(time.Second, false)
	}
	if err := s.write(); err != nil {
		return code, err
	}
	s.outliveStop()
	return code, nil
}

// lingerPoll is how often a supervisor that outlives its harness during a
// stop looks again, besides at each SIGCHLD.
const lingerPoll = 10 * time.Millisecond

// outliveStop keeps the supervisor the child subreaper of what the harness
// left while a stop ends it: until no child is left (every descendant dead
// and reaped: an orphan comes back to the subreaper, so none is left
// anywhere in its tree) or the stop no longer holds the launch folder's
// lock. Without it, a process that forks and dies during the stop (a
// daemon's loop forking its next child as the stop kills the last one, a
// cleanup on SIGINT that starts a helper and exits) orphans its new child
// to the sandbox's first process, out of every source the stop searches.
func (s *supervisor) outliveStop() {
	if !exists(s.path(proto.StopFile)) {
		return
	}
	fd, err := unix.Open(s.path(proto.LockFile), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	poll := time.NewTicker(lingerPoll)
	defer poll.Stop()
	for !s.reapOrphans() {
		if unix.Flock(fd, unix.LOCK_SH|unix.LOCK_NB) == nil {
			unix.Flock(fd, unix.LOCK_UN) // no stop holds the launch
			return
		}
		select {
		case <-s.sigs: // SIGCHLD; nothing is left to forward others to
		case <-poll.C:
		}
	}
}

// reapOrphans collects every exited child and reports whether none is left.
func (s *supervisor) reapOrphans() bool {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		switch {
		case err == unix.EINTR:
		case err == unix.ECHILD:
			return true
		case err != nil || pid <= 0:
			return false
		}
	}
}
