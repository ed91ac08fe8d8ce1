package reaper

import (
	"errors"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ngharness/ngharness/pkg/proto"
)

// Continue resumes exactly what the last pause stopped (pid AND start time),
// thaws the launch's cgroup, sends SIGCONT to anything of the launch still
// stopped, and removes dir/pause. Exit 0, or 4 if something stays stopped.
func Continue(dir string) (proto.ContinueResult, int, error) {
	return ContinueLaunch(dir, "")
}

// ContinueLaunch is Continue for a launch named by id when it has no receipt
// (it runs without a supervisor). What it does in each state is the
// transition table's (transitions.go).
func ContinueLaunch(dir, id string) (proto.ContinueResult, int, error) {
	begin := time.Now()
	res := proto.ContinueResult{Method: proto.MethodNone, Pending: []proto.Pending{}}
	l, st, unlock, code, err := openFor(VerbContinue, dir, id, true)
	if err != nil {
		return res, code, err
	}
	defer unlock()
	code = proto.ExitOK
	if Transition(VerbContinue, st).Do == Act {
		code = l.resume(&res)
	}
	if err := l.endPause(); err != nil {
		return res, proto.ExitInternal, err
	}
	res.ElapsedMS = ms(time.Since(begin))
	return res, code, nil
}

// resume is continue's work on a launch whose processes may be stopped: it
// continues exactly what the last pause held and anything of the launch
// still stopped, counts them into res, and returns the exit code: 0, or 4
// when something stays stopped.
func (l *Launch) resume(res *proto.ContinueResult) int {
	paused, inodes, skipped := readProcSet(l.path(proto.PausedFile)) // inodes: none written today, read where present
	f := newFinder(l)
	res.SkippedLines = skipped + f.skipped
	res.Method = f.method(false)
	if l.Cgroup != nil {
		if frozen, _ := l.Cgroup.Frozen(); frozen {
			l.Cgroup.Thaw() // a pause interrupted between freeze and thaw
		}
	}
	// The harness's group in one call; then one walk that continues every
	// process of the launch still stopped (a process stopped twice, or found
	// by the pause after it recorded its set); then each process the pause
	// recorded that the walk did not reach, checked by pid and start time.
	// A SIGCONT that was delivered has woken its process by the time the
	// call returns, so one walk confirms.
	group := l.signalGroup(unix.SIGCONT)
	inPaused := make(map[proto.Proc]bool, len(paused))
	for _, p := range paused {
		inPaused[p] = true
	}
	// The walk's workers visit several processes at once (finder.workers):
	// what the visit counts is guarded by mu.
	f.workers = passWorkers()
	var mu sync.Mutex
	var pending []proto.Pending
	found := f.pass(func(t *target) {
		// The group's members were continued by the group signal.
		if group && t.PGID == l.Receipt.HarnessPGID {
			return
		}
		// What the pause held is continued whatever its state reads now:
		// one it confirmed in an uninterruptible call with SIGSTOP pending
		// (D) still reads D, and would take that stop as soon as the call
		// returns unless a SIGCONT clears it first. Anything else is
		// continued when it is stopped (T, or a zombie leader whose live
		// threads are T) or has a SIGSTOP pending.
		held := inPaused[procOf(t.Stat)] && !isDead(t.Stat)
		stopped := t.State == 'T' || t.State == 'Z' && t.NumThreads > 1
		if !held && !stopped && !l.FS.stopPending(t.PID) {
			return
		}
		if err := t.Signal(unix.SIGCONT); err != nil && err != ErrNoProcess && err != ErrNotSameProcess {
			wchan := l.FS.Wchan(t.PID)
			mu.Lock()
			pending = append(pending, proto.Pending{PID: t.PID, State: "T", Comm: t.Comm, Wchan: wchan})
			mu.Unlock()
			return
		}
		if !inPaused[procOf(t.Stat)] {
			mu.Lock()
			res.Continued++
			mu.Unlock()
		}
	})
	res.Found = len(live(found))
	// A held process killed while paused is skipped, not continued, even
	// while it is a zombie its stopped parent has not reaped yet: a continue
	// that finds only dead processes must say so.
	for _, p := range paused {
		if st, ok := found[p.PID]; ok && st.StartTicks == p.StartTicks {
			if isDead(st) {
				res.Skipped++
			} else {
				res.Continued++
			}
			continue
		}
		if l.FS.signalAs(p, inodes[p], unix.SIGCONT) != nil {
			res.Skipped++
		} else if st, err := l.FS.ReadStat(p.PID); err != nil || st.StartTicks != p.StartTicks || isDead(st) {
			res.Skipped++
		} else {
			res.Continued++
		}
	}
	if len(pending) > 0 {
		slices.SortFunc(pending, func(a, b proto.Pending) int { return a.PID - b.PID })
		res.Pending = pending
		return proto.ExitNotConfirmed
	}
	return proto.ExitOK
}

// endPause removes the pause file and the paused set, and adds the time the
// launch spent paused to its total, so the run's --timeout leaves it out.
func (l *Launch) endPause() error {
	path := l.path(proto.PauseFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if at, ok := parsePauseStamp(data); ok {
		total := l.pausedTotal() + time.Since(at)
		if err := proto.ReplaceFile(l.path(proto.PausedTimeFile), []byte(strconv.FormatInt(int64(total), 10)), 0o644); err != nil {
			return err
		}
	}
	os.Remove(l.path(proto.PausedFile))
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// pausedTotal is the time the launch spent paused in earlier holds.
func (l *Launch) pausedTotal() time.Duration {
	data, err := os.ReadFile(l.path(proto.PausedTimeFile))
	if err != nil {
		return 0
	}
	n, err := strconv.ParseInt(string(data), 10, 64)
	if err != nil || n < 0 {
		return 0
	}
	return time.Duration(n)
}
