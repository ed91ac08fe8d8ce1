package reaper

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ngharness/ngharness/pkg/proto"
)

// Pause budgets of the contract.
const (
	// StopBudget is how long a pause waits for every process to stop.
	StopBudget = 5 * time.Second
	// UninterruptibleBudget is how long it keeps waiting while the only
	// processes left are in an uninterruptible call (state D): they take
	// the pending SIGSTOP when the call returns.
	UninterruptibleBudget = 30 * time.Second
)

// tracedSettle is how long a process must stay in a ptrace stop (t), not
// signalled again, before a pause counts it as stopped: its tracer, not the
// pause, decides when it runs, and a tracer that resumes it (one that
// suppresses SIGSTOP, say) leaves it in t only for a moment.
const tracedSettle = 50 * time.Millisecond

// PauseOptions tunes a pause. The zero value is the contract's behaviour.
type PauseOptions struct {
	// StopBudget and UninterruptibleBudget override the contract's budgets
	// when non-zero (tests use short ones).
	StopBudget, UninterruptibleBudget time.Duration
	// NoCgroup never freezes the launch's cgroup: signals alone do the
	// pause, even in a fork storm.
	NoCgroup bool
	// CgroupFirst freezes the cgroup before the first pass instead of only
	// when a fork storm shows (the benchmark compares both).
	CgroupFirst bool
	// ID names a launch that runs without a supervisor (no receipt): its
	// processes are found by their tag.
	ID string
}

// Pause stops every process of the launch in dir and confirms each one is
// stopped or dead. It creates dir/pause first, so a launch that has not
// started waits. The exit code is the contract's: 0 paused, 3 the launch had
// already ended (nothing paused, its result kept), 4 not confirmed (what was
// stopped is continued again, so a failed pause leaves the launch running).
// What it does in each state is the transition table's (transitions.go).
func Pause(dir string, opt PauseOptions) (proto.PauseResult, int, error) {
	return beginPause(dir, opt).finish()
}

// PauseAll pauses the launch in every dir, each exactly as Pause would on
// its own lock, and calls emit with each answer in the order of dirs, each
// as soon as it and every one before it are known. Every pause is begun
// before any is confirmed: each launch's folder is locked, its pause file
// made and its harness's process group sent SIGSTOP, at most workers at
// once. Then each is confirmed. While the later launches are begun, the
// processes of the earlier ones take their stops, so a confirmation mostly
// finds its launch stopped at its first pass instead of waiting for it:
// on a loaded host the waits of launches paused one after another add up.
func PauseAll(dirs []string, opt PauseOptions, workers int, emit func(i int, res proto.PauseResult, code int, err error)) {
	begun := make([]*pauseBegun, len(dirs))
	Each(len(dirs), workers, func(i int) { begun[i] = beginPause(dirs[i], opt) }, func(int) {})
	type answer struct {
		res  proto.PauseResult
		code int
		err  error
	}
	answers := make([]answer, len(dirs))
	Each(len(dirs), workers, func(i int) {
		res, code, err := begun[i].finish()
		answers[i] = answer{res, code, err}
	}, func(i int) { emit(i, answers[i].res, answers[i].code, answers[i].err) })
}

// pauseTrace, when set (by a test), is told each time a pause is begun and
// each time one is confirmed, with its folder.
var pauseTrace func(event, dir string)

// pauseBegun is a pause begun: its folder locked, its pause file made and,
// when the launch's processes may run, its harness's process group sent
// SIGSTOP; or the pause's answer when there is nothing to stop.
type pauseBegun struct {
	l       *Launch
	unlock  func()
	p       *pauser // nil: the answer below is final
	created bool
	begin   time.Time

	res  proto.PauseResult
	code int
	err  error
}

// beginPause is the first half of Pause: everything up to the first pass.
func beginPause(dir string, opt PauseOptions) *pauseBegun {
	b := &pauseBegun{begin: time.Now(), res: proto.PauseResult{Method: proto.MethodNone, Pending: []proto.Pending{}}}
	l, st, unlock, code, err := openFor(VerbPause, dir, opt.ID, true)
	if err != nil {
		b.code, b.err = code, err
		return b
	}
	b.l, b.unlock = l, unlock
	created, err := touch(l.path(proto.PauseFile), strconv.FormatInt(time.Now().UnixNano(), 10))
	if err != nil {
		b.code, b.err = proto.ExitUsage, unwritable(err, "paused")
		return b
	}
	b.created = created
	switch Transition(VerbPause, st).Do {
	case Refuse:
		// Ended, or never started (an unreadable receipt was refused as
		// the folder was opened): the result is kept, exit 3.
		b.res, b.code, b.err = l.pauseEnded(b.res, created, b.begin)
		return b
	case File:
		// The pause file holds the run until continue.
		b.res.Paused = true
		b.res.Supervised = l.Supervised
		b.res.ElapsedMS = ms(time.Since(b.begin))
		b.code = proto.ExitOK
		return b
	}
	b.p = newPauser(l, opt)
	b.res.Supervised = l.Supervised
	b.res.SkippedLines = b.p.f.skipped
	b.res.RecoveredFreeze = b.p.recoverFreeze()
	b.p.start()
	if pauseTrace != nil {
		pauseTrace("begun", dir)
	}
	return b
}

// finish is the second half of Pause: confirm, record what is held, and
// unlock the folder.
func (b *pauseBegun) finish() (proto.PauseResult, int, error) {
	if b.unlock != nil {
		defer b.unlock()
	}
	if b.p == nil {
		return b.res, b.code, b.err
	}
	res, code, err := b.l.pause(b.res, b.p, b.created, b.begin)
	if pauseTrace != nil {
		pauseTrace("confirmed", b.l.Dir)
	}
	return res, code, err
}

// pause is Pause's work on a launch whose processes may run, once p has
// begun (start): confirm every process stopped, and record what it holds.
func (l *Launch) pause(res proto.PauseResult, p *pauser, created bool, begin time.Time) (proto.PauseResult, int, error) {
	ok := p.run()
	res.Method = p.f.method(p.frozen)
	res.Passes = p.passes
	res.Gone = p.gone
	// A harness that ended while we paused keeps its result: undo the pause.
	if l.Receipt != nil && l.Reload() == nil && l.Receipt.Ended {
		p.undo()
		return l.pauseEnded(res, created, begin)
	}
	if !ok {
		res.Pending = p.pending
		res.Error = p.failure
		p.undo()
		os.Remove(l.path(proto.PauseFile))
		res.ElapsedMS = ms(time.Since(begin))
		return res, proto.ExitNotConfirmed, nil
	}
	held := p.held()
	// Keep what an earlier pause of the same hold recorded, if still alive.
	prev, _, skipped := readProcSet(l.path(proto.PausedFile))
	res.SkippedLines += skipped
	if len(prev) > 0 && !created {
		inHeld := make(map[proto.Proc]bool, len(held))
		for _, q := range held {
			inHeld[q] = true
		}
		for _, q := range prev {
			if !inHeld[q] && l.FS.Alive(q) {
				held = append(held, q)
			}
		}
	}
	if err := proto.ReplaceFile(l.path(proto.PausedFile), formatProcSet(held, noInode), 0o644); err != nil {
		p.undo()
		os.Remove(l.path(proto.PauseFile))
		return res, proto.ExitInternal, err
	}
	if err := l.remember(l.unrecorded(p.fresh)); err != nil {
		fmt.Fprintf(os.Stderr, "ngsup: %v\n", err)
	}
	res.Paused = true
	res.Processes = len(held)
	res.ElapsedMS = ms(time.Since(begin))
	return res, proto.ExitOK, nil
}

// pauseEnded is pause's answer for a launch that had already ended: exit 3,
// nothing paused, its result kept, and no pause file left by this pause.
func (l *Launch) pauseEnded(res proto.PauseResult, created bool, begin time.Time) (proto.PauseResult, int, error) {
	if created {
		os.Remove(l.path(proto.PauseFile))
	}
	res.Paused = false
	res.Ended = true
	res.Error = "the launch had already ended; its result is kept"
	res.ElapsedMS = ms(time.Since(begin))
	return res, proto.ExitEnded, nil
}

// pauser holds the state of one pause.
type pauser struct {
	l        *Launch
	f        *finder
	opt      PauseOptions
	frozen   bool                     // the cgroup held the launch while it was signalled
	grouped  bool                     // the harness's process group was sent SIGSTOP
	lastNews int                      // processes the last pass found for the first time
	stopped  map[int]Stat             // everything found, by pid, with its latest stat
	traced   map[proto.Proc]time.Time // in a ptrace stop (t) since, as of the last pass
	fresh    []proto.Proc             // found for the first time (for the known set)
	passes   int
	gone     int
	pending  []proto.Pending
	failure  string
}

func newPauser(l *Launch, opt PauseOptions) *pauser {
	f := newFinder(l)
	if opt.StopBudget == 0 {
		opt.StopBudget = StopBudget
	}
	if opt.UninterruptibleBudget == 0 {
		opt.UninterruptibleBudget = UninterruptibleBudget
	}
	return &pauser{l: l, f: f, opt: opt, stopped: map[int]Stat{}}
}

// start is the pause's first move: the cgroup frozen first when asked
// (CgroupFirst), then SIGSTOP to the harness's process group, which no
// member can escape by forking.
func (p *pauser) start() {
	if p.opt.CgroupFirst {
		p.freezeAndStop()
	}
	p.grouped = p.l.signalGroup(unix.SIGSTOP)
}

// stormPasses is the pass from which a walk that still finds new processes
// is taken for a fork storm, and the cgroup is frozen to contain it.
const stormPasses = 3

// run is the pause loop, once start has sent SIGSTOP to the harness's
// process group (race-free against fork): walk-and-stop passes until a pass finds every process
// already stopped when it was reached. Such a pass is complete: a process
// read as stopped before its children were listed cannot have forked one
// the listing missed. When passes keep finding new processes (a tree that
// forks faster than the walk, outside the harness's group), the launch's
// cgroup is frozen once, every member is sent SIGSTOP, and it is thawed:
// each takes its SIGSTOP before it runs another instruction of its own.
func (p *pauser) run() bool {
	begin := time.Now()
	wait := 200 * time.Microsecond
	for {
		if len(p.step()) == 0 {
			return true
		}
		if !p.frozen && p.passes >= stormPasses && p.lastNews > 0 {
			p.freezeAndStop()
		}
		elapsed := time.Since(begin)
		if elapsed > p.opt.StopBudget {
			if !allUninterruptible(p.pending) {
				p.failure = fmt.Sprintf("%d processes not stopped after %s", len(p.pending), p.opt.StopBudget)
				return false
			}
			if elapsed > p.opt.UninterruptibleBudget {
				p.failure = fmt.Sprintf("%d processes still in an uninterruptible call after %s", len(p.pending), p.opt.UninterruptibleBudget)
				return false
			}
		}
		if p.lastNews == 0 {
			time.Sleep(wait)
			wait = min(wait*2, 10*time.Millisecond)
		}
	}
}

// freezeAndStop freezes the launch's cgroup, sends SIGSTOP to every member
// and thaws it. While frozen no member can fork or exit, so the pids listed
// are the members themselves and are signalled by pid. A freeze that cannot
// be confirmed is thawed back and the pause goes on with signals alone.
func (p *pauser) freezeAndStop() {
	if p.l.Cgroup == nil || p.opt.NoCgroup {
		return
	}
	if err := p.l.Cgroup.Freeze(time.Now().Add(time.Second)); err != nil {
		return
	}
	p.stopFrozen()
}

// stopFrozen sends SIGSTOP to every member of the frozen cgroup and thaws
// it: each member takes its SIGSTOP before it runs another instruction.
func (p *pauser) stopFrozen() {
	p.frozen = true
	if pids, err := p.l.Cgroup.Procs(); err == nil {
		for _, pid := range pids {
			kill(pid, unix.SIGSTOP)
		}
	}
	p.l.Cgroup.Thaw()
}

// recoverFreeze handles a cgroup found frozen (or freezing) when the pause
// begins. The control verbs are serialised by the folder's lock, which this
// pause holds, so no running verb holds that freeze: a pause was killed
// between its freeze and its thaw. Waiting for T would spin the whole budget
// (frozen tasks never show T), so the freeze is finished as the pause's own:
// SIGSTOP to every member while frozen, then thaw. It reports whether it
// found such a freeze.
func (p *pauser) recoverFreeze() bool {
	if p.l.Cgroup == nil || !p.l.Cgroup.FreezeAsked() {
		return false
	}
	// Let a freeze the kernel has not finished complete, so that no member
	// runs between the listing and its SIGSTOP; one that cannot complete
	// is thawed back by Freeze, and the pause goes on with signals alone.
	if err := p.l.Cgroup.Freeze(time.Now().Add(time.Second)); err == nil {
		p.stopFrozen()
	}
	return true
}

// step is one pass. Every process reached is checked; one not stopped yet is
// sent SIGSTOP (unless it is in T already, with threads still stopping) and
// counted unsettled. Processes found before but not reached (exited, or
// re-parented out of the walk) are read directly. It returns the processes
// not confirmed stopped, and keeps them in p.pending.
func (p *pauser) step() []proto.Pending {
	p.passes++
	// The pause's visit (check below) is safe to run in several workers.
	// How many is asked at every pass: right after the SIGSTOP to the
	// harness's group its members are runnable until they have stopped,
	// and a walk that takes their CPUs reaches them before they stop (one
	// more pass).
	p.f.workers = passWorkers()
	// check runs in the pass's workers, several at once (finder.workers):
	// what it records is guarded by mu; p.traced is only read.
	var mu sync.Mutex
	var pending []proto.Pending
	unsettled := func(st Stat, state byte) {
		mu.Lock()
		pending = append(pending, proto.Pending{PID: st.PID, State: string(state), Comm: st.Comm})
		mu.Unlock()
	}
	begin := time.Now()
	var waited atomic.Int64 // ns the first pass spent in awaitGroupStop
	traced := map[proto.Proc]time.Time{}
	// In the first pass, a member of the harness's process group has the
	// group's SIGSTOP pending: one not stopped yet has not run since, and
	// a SIGSTOP of its own (a pidfd, a second read of its stat, the
	// signal) would only cost the pause what the process needs to stop. A
	// later pass signals it: it may have joined the group after the
	// group's signal, or been continued since.
	inGroup := func(st Stat) bool {
		return p.passes == 1 && p.grouped && st.PGID == p.l.Receipt.HarnessPGID
	}
	check := func(st Stat, stop func()) {
		state, ok := p.l.FS.stoppedState(st)
		switch {
		case !ok:
			if inGroup(st) && !isStopped(st.State) && p.awaitGroupStop(st, &waited) {
				// Stopped before its children are listed: as complete as
				// if the walk had found it stopped.
				return
			}
			if !isStopped(st.State) && !inGroup(st) {
				stop()
			}
			unsettled(st, state)
		case state == 't':
			// A ptrace stop holds only while the tracer wants it: count it
			// once it has lasted, untouched, for tracedSettle.
			q := procOf(st)
			since, seen := p.traced[q]
			if !seen {
				since = begin
			}
			mu.Lock()
			traced[q] = since
			mu.Unlock()
			if begin.Sub(since) < tracedSettle {
				unsettled(st, state)
			}
		}
	}
	found := p.f.pass(func(t *target) {
		check(t.Stat, func() { t.Signal(unix.SIGSTOP) })
	})
	p.lastNews = 0
	for pid, st := range found {
		if old, ok := p.stopped[pid]; !ok || old.StartTicks != st.StartTicks {
			p.fresh = append(p.fresh, procOf(st))
			p.lastNews++
		}
		p.stopped[pid] = st
	}
	for pid, st := range p.stopped {
		if _, ok := found[pid]; ok {
			continue
		}
		now, err := p.l.FS.ReadStat(pid)
		if err != nil || now.StartTicks != st.StartTicks {
			delete(p.stopped, pid)
			p.gone++
			continue
		}
		p.stopped[pid] = now
		check(now, func() { p.l.FS.Signal(procOf(now), unix.SIGSTOP) })
	}
	p.traced = traced
	for i := range pending {
		pending[i].Wchan = p.l.FS.Wchan(pending[i].PID)
	}
	slices.SortFunc(pending, func(a, b proto.Pending) int { return a.PID - b.PID })
	p.pending = pending
	return pending
}

// groupStopWait bounds the time the first pass spends, over all its
// workers, waiting for members of the harness's process group to take the
// group's SIGSTOP (awaitGroupStop).
const groupStopWait = 20 * time.Millisecond

// awaitGroupStop waits a moment for st's process, a member of the
// harness's group reached by the first pass before it took the group's
// SIGSTOP, to stop (T) or die. Right after the group's signal its members
// are runnable until they stop, and a walk that overtakes them would have
// to walk the whole tree again (a second pass) for the few it found
// running. Waiting here instead, while it is still the same process, makes
// its children's listing (which follows) complete. The first pass waits
// at most groupStopWait in all (waited counts it); then the process counts
// as not settled, as before.
func (p *pauser) awaitGroupStop(st Stat, waited *atomic.Int64) bool {
	for waited.Load() < int64(groupStopWait) {
		t0 := time.Now()
		time.Sleep(50 * time.Microsecond)
		now, err := p.l.FS.ReadStat(st.PID)
		waited.Add(int64(time.Since(t0)))
		if err != nil || now.StartTicks != st.StartTicks {
			return false // gone: the pass's own reading of it decides
		}
		switch state, ok := p.l.FS.stoppedState(now); {
		case ok && state != 't':
			return true
		case ok, isStopped(now.State):
			return false // traced, or threads still stopping: the usual path
		}
	}
	return false
}

func allUninterruptible(pending []proto.Pending) bool {
	for _, q := range pending {
		if q.State != "D" {
			return false
		}
	}
	return len(pending) > 0
}

// stoppedState reports whether a process no longer runs user code: stopped
// (T, t), dead (a zombie with no live thread), or in an uninterruptible call
// with SIGSTOP pending (it stops when the call returns; a vfork parent sits
// there until its child execs). A zombie leader whose threads live is judged
// by its threads. It returns the state that decided.
func (fs FS) stoppedState(st Stat) (byte, bool) {
	switch {
	case isStopped(st.State) && st.NumThreads <= 1:
		return st.State, true
	case st.State == 'Z' && st.NumThreads <= 1, st.State == 'X':
		return st.State, true
	case st.State == 'D' && st.NumThreads <= 1:
		return st.State, fs.stopPending(st.PID)
	case st.NumThreads <= 1:
		return st.State, false
	}
	// Several threads: every live one must be stopped.
	tids, err := fs.Tasks(st.PID)
	if err != nil {
		return st.State, err == ErrNoProcess
	}
	var anyStopped, anyTraced bool
	var inD []int
	for _, tid := range tids {
		ts, err := fs.ReadTaskStat(st.PID, tid)
		if err != nil {
			continue
		}
		switch {
		case isStopped(ts.State):
			anyStopped = true
			anyTraced = anyTraced || ts.State == 't'
		case ts.State == 'Z' || ts.State == 'X':
		case ts.State == 'D':
			inD = append(inD, tid)
		default:
			return ts.State, false
		}
	}
	for _, tid := range inD {
		shd, sig, err := fs.Pending(st.PID, tid)
		// In a group stop begun by another thread, the signal is already
		// taken; the thread stops when its call returns.
		if !anyStopped && (err != nil || (shd|sig)&SigStop == 0) {
			return 'D', false
		}
	}
	if anyTraced {
		return 't', true
	}
	return 'T', true
}

// held lists the live processes the pause holds.
func (p *pauser) held() []proto.Proc {
	out := make([]proto.Proc, 0, len(p.stopped))
	for _, st := range p.stopped {
		if st.State != 'Z' || st.NumThreads > 1 {
			out = append(out, procOf(st))
		}
	}
	slices.SortFunc(out, func(a, b proto.Proc) int { return a.PID - b.PID })
	return out
}

// undo continues what this pause stopped.
func (p *pauser) undo() {
	for _, st := range p.stopped {
		p.l.FS.Signal(procOf(st), unix.SIGCONT)
	}
	p.l.signalGroup(unix.SIGCONT)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// parsePauseStamp reads the time a pause file was created.
func parsePauseStamp(data []byte) (time.Time, bool) {
	n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil || n <= 0 {
		return time.Time{}, false
	}
	return time.Unix(0, n), true
}
