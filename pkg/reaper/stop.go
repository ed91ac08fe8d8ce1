package reaper

import (
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ngharness/ngharness/pkg/proto"
)

// DefaultGrace is how long stop waits after SIGINT before SIGKILL.
const DefaultGrace = 10 * time.Second

// The time a stop gives itself beyond the grace. The SIGINT walks end at the
// grace (at least minPassBudget for the first); the kill sweeps and the last
// sweep end at most passOverrun after their phase's deadline. So a stop ends
// within about grace + freezeBudget + killBudget + settleBudget +
// confirmBudget + 2 passOverrun, even when a fork storm outgrows its walk;
// the reply says OutOfTime when a bound cut it short.
const (
	// passOverrun is how long a kill sweep or the last sweep may run past
	// its phase's end before it is cut. A walk over a large tree on a loaded
	// machine takes seconds (reading every process's environment for the tag
	// most of all), and one cut short leaves the stop unconfirmed; only a
	// walk that keeps finding new processes (a fork storm outside the
	// cgroup) runs this long.
	passOverrun = 10 * time.Second
	// killBudget bounds the SIGKILL sweeps after the grace.
	killBudget = 5 * time.Second
	// minPassBudget is the least time the first SIGINT pass gets, even with
	// a shorter grace.
	minPassBudget = time.Second
	// freezeBudget bounds the confirmation of a freeze of the cgroup.
	freezeBudget = time.Second
	// settleBudget is how long the supervisor gets to record the end.
	settleBudget = 2 * time.Second
	// confirmBudget bounds the last sweep, which touches nothing (it gets
	// passOverrun more, like every walk).
	confirmBudget = 2 * time.Second
)

// Stop ends every process of the launch: it creates dir/stop (so a run that
// has not started never starts), sends SIGINT to every process and SIGCONT so
// the SIGINT lands on stopped ones, SIGKILL after the grace, then SIGKILL
// again to anything still found, until a sweep finds nothing. Processes are
// found through the supervisor's tree, the harness's group and the cgroup;
// when the supervisor is gone (or never ran), through the tag and every
// process an earlier pass recorded instead of the tree, each with its
// descendants. The reply names the sources searched, and says Partial when
// the tree could not be: then an empty Survivors means none of the other
// sources names a live process, not that none is left. Exit 0 none left
// (as far as the sources searched tell), 4 survivors listed. A folder that
// is a copy of the one the launch ran in (its origin file names another
// folder: a snapshot or fork of the sandbox brought it) and whose records
// name nothing alive holds nothing to stop: the reply says Copied, and
// nothing is searched or signalled.
func Stop(dir string, grace time.Duration) (proto.StopResult, int, error) {
	return StopLaunch(dir, "", grace)
}

// StopLaunch is Stop for a launch named by id when it has no receipt (it
// runs without a supervisor): its processes are found by their tag. What it
// does in each state is the transition table's (transitions.go).
func StopLaunch(dir, id string, grace time.Duration) (proto.StopResult, int, error) {
	begin := time.Now()
	res := proto.StopResult{Method: proto.MethodNone, Survivors: []proto.Pending{}, Searched: []string{}}
	l, st, unlock, code, err := openFor(VerbStop, dir, id, true)
	if err != nil {
		return res, code, err
	}
	defer unlock()
	if _, err := touch(l.path(proto.StopFile), ""); err != nil {
		return res, proto.ExitUsage, unwritable(err, "stopped")
	}
	if l.ReceiptErr != nil {
		res.ReceiptError = l.ReceiptErr.Error()
	}
	res.Ended = l.Receipt != nil && l.Receipt.Ended
	switch Transition(VerbStop, st).Do {
	case Nothing:
		// A copy carried here by a snapshot or fork of the sandbox: the
		// launch never ran from this folder and nothing its records name
		// runs, so there is nothing here to search for (and no host to
		// scan for its tag). While something they name lives, the state
		// is not Copied and the stop goes on as for any folder: an origin
		// file is the sandbox's to write, and must not be a way out of a
		// stop.
		res.Copied, res.Stopped = true, true
	case File:
		// Nothing launched yet: the stop file keeps a run from starting.
		res.Supervised = l.Supervised
		res.Stopped = true
	default:
		res.Supervised = l.Supervised
		l.stop(&res, begin.Add(grace))
	}
	res.ElapsedMS = ms(time.Since(begin))
	if !res.Stopped {
		return res, proto.ExitNotConfirmed, nil
	}
	return res, proto.ExitOK, nil
}

// stop is Stop's work on a launch whose processes may run: SIGINT until the
// grace (ending at deadline), then SIGKILL sweeps, then the supervisor's
// end, then a sweep that confirms. It fills in res.
func (l *Launch) stop(res *proto.StopResult, deadline time.Time) {
	f := newFinder(l)
	res.SkippedLines = f.skipped
	res.Method, res.Interrupted = l.interruptAll(f, deadline)
	var killDeadline time.Time
	res.Killed, killDeadline = l.killAll(f)
	// The supervisor records the harness's end and exits by itself once
	// its tree is empty; give it a moment, then end it too.
	l.settleSupervisor(settleBudget)
	// Confirm: one more sweep, this time touching nothing.
	l.Supervised = l.FS.Live(l.supervisor())
	f.deadline = time.Now().Add(confirmBudget + passOverrun)
	found := f.pass(nil)
	for _, st := range live(found) {
		res.Survivors = append(res.Survivors, proto.Pending{PID: st.PID, State: string(st.State), Comm: st.Comm, Wchan: l.FS.Wchan(st.PID)})
	}
	slices.SortFunc(res.Survivors, func(a, b proto.Pending) int { return a.PID - b.PID })
	// Out of time: the kill sweeps ran out with processes left, or the
	// confirming sweep could not finish (so it cannot vouch for none left).
	res.OutOfTime = f.cut || len(res.Survivors) > 0 && time.Now().After(killDeadline)
	if l.Cgroup != nil && len(res.Survivors) == 0 && !f.cut {
		l.Cgroup.Release(time.Second, true)
	}
	res.Stopped = len(res.Survivors) == 0 && !f.cut
	res.Searched = f.searched()
	res.Partial = f.fallback
}

// interruptAll sends SIGINT (and SIGCONT, so it lands on stopped ones) to
// every process of the launch, walking again until none is found alive or
// the grace ends at deadline. Everything found is recorded, so that once the
// supervisor exits its orphans are still found by pid and start time. It
// returns the method and how many processes were interrupted.
func (l *Launch) interruptAll(f *finder, deadline time.Time) (string, int) {
	interrupted := map[proto.Proc]bool{}
	interrupt := func() map[int]Stat {
		found := f.pass(func(t *target) {
			p := procOf(t.Stat)
			if !interrupted[p] {
				interrupted[p] = true
				t.Signal(unix.SIGINT)
				t.Signal(unix.SIGCONT)
			}
		})
		f.learn(found)
		return found
	}
	// A fork storm left running competes with the walk for the CPU and
	// outgrows it: where the launch has a cgroup, it is frozen for the
	// first walk (and a freeze a dead pause left is taken over). The
	// SIGINTs wait in the frozen tasks and land when the cgroup is thawed;
	// SIGCONT does not undo a freeze.
	frozen := false
	if l.Cgroup != nil {
		frozen = l.Cgroup.Freeze(time.Now().Add(freezeBudget)) == nil
	}
	method := f.method(frozen)
	if f.fallback && !frozen {
		// No supervisor and no frozen cgroup hold the launch: the
		// harness's children are found only as its children, and the
		// group's SIGINT may end it before a walk reads them (a shell's
		// background jobs ignore SIGINT and, orphaned, would be found no
		// more). A first walk, touching nothing, learns them.
		f.deadline = later(deadline, time.Now().Add(minPassBudget))
		f.learn(f.pass(nil))
	}
	if l.signalGroup(unix.SIGINT) {
		f.used[proto.SourceGroup] = true
	}
	l.signalGroup(unix.SIGCONT)
	// The SIGINT walks end at the grace: one cut short costs nothing, the
	// kill sweeps that follow reach what it did not.
	f.deadline = later(deadline, time.Now().Add(minPassBudget))
	found := interrupt()
	if l.Cgroup != nil {
		l.Cgroup.Thaw() // a frozen task cannot act on SIGINT
	}
	wait := time.Millisecond
	for len(live(found)) > 0 && time.Now().Before(deadline) {
		time.Sleep(wait)
		wait = min(wait*2, 50*time.Millisecond)
		f.deadline = deadline
		found = interrupt()
	}
	return method, len(interrupted)
}

// killAll sends SIGKILL to every process of the launch, sweep after sweep,
// until a sweep finds none and the supervisor is gone, or killBudget ends.
// It returns how many processes were killed and when the budget ends.
func (l *Launch) killAll(f *finder) (int, time.Time) {
	killed := map[proto.Proc]bool{}
	killDeadline := time.Now().Add(killBudget)
	f.deadline = killDeadline.Add(passOverrun)
	for {
		// The cgroup first, all at once: a storm inside it cannot outrun
		// the walk that follows, which finds what is outside.
		if l.Cgroup != nil {
			// Its live members are counted killed (by identity, as the
			// walk counts them), read before the kill: the reply says
			// what was sent SIGKILL whichever way it went.
			if pids, err := l.Cgroup.Procs(); err == nil {
				for _, pid := range pids {
					if st, err := l.FS.ReadStat(pid); err == nil && !isDead(st) {
						killed[procOf(st)] = true
					}
				}
			}
			l.Cgroup.KillAll(time.Now().Add(freezeBudget))
		}
		found := f.pass(func(t *target) {
			if t.State != 'Z' || t.NumThreads > 1 {
				killed[procOf(t.Stat)] = true
				t.Signal(unix.SIGKILL)
			}
		})
		f.learn(found)
		// A supervisor still alive holds something of its tree: during a
		// stop it stays the subreaper until no child is left, so that what
		// a process forks as it dies comes back to it, and so to the tree.
		if len(live(found)) == 0 && !f.cut && !l.Supervised {
			break
		}
		if time.Now().After(killDeadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	return len(killed), killDeadline
}

// later returns the later of two times.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// live keeps the processes that still run code (not zombies).
func live(found map[int]Stat) []Stat {
	var out []Stat
	for _, st := range found {
		if !isDead(st) {
			out = append(out, st)
		}
	}
	return out
}

// isDead reports a process that runs no code any more: a zombie (or a dying
// task) with no live thread. A zombie leader whose other threads run is not
// dead.
func isDead(st Stat) bool {
	return (st.State == 'Z' || st.State == 'X') && st.NumThreads <= 1
}

// learn adds found processes to the finder's known set and the launch's.
func (f *finder) learn(found map[int]Stat) {
	procs := make([]proto.Proc, 0, len(found))
	for _, st := range found {
		procs = append(procs, procOf(st))
	}
	f.l.remember(f.add(procs))
}

// settleSupervisor waits up to d for the supervisor to record the end and
// exit. If it is still there it is killed, and the end is recorded here, so
// that wait and status report an ended launch.
func (l *Launch) settleSupervisor(d time.Duration) {
	if l.Receipt == nil {
		return // unsupervised: nothing to record
	}
	sup := l.supervisor()
	deadline := time.Now().Add(d)
	for l.FS.Alive(sup) && time.Now().Before(deadline) {
		if st, err := l.FS.ReadStat(sup.PID); err == nil && st.State == 'Z' {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if st, err := l.FS.ReadStat(sup.PID); err == nil && st.StartTicks == sup.StartTicks && st.State != 'Z' {
		l.FS.Signal(sup, unix.SIGKILL)
	}
	if err := l.Reload(); err != nil || l.Receipt.Ended {
		return
	}
	r := *l.Receipt
	r.Ended = true
	r.EndedAt = time.Now()
	r.ExitCode = -1
	r.Error = "the launch was stopped and its supervisor ended before recording the harness's exit"
	proto.WriteReceipt(l.Dir, &r)
}
