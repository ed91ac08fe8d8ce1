package reaper

import (
	"errors"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ngharness/ngharness/pkg/proto"
)

// ContinueBudget is how long continue keeps checking that nothing of the
// launch stays stopped.
const ContinueBudget = 2 * time.Second

// Continue resumes exactly what the last pause stopped (pid AND start time),
// thaws the launch's cgroup, sends SIGCONT to anything of the launch still
// stopped, and removes dir/pause. Exit 0, or 4 if something stays stopped.
func Continue(dir string) (proto.ContinueResult, int, error) {
	return ContinueLaunch(dir, "")
}

// ContinueLaunch is Continue for a launch named by id when it has no receipt
// (it runs without a supervisor).
func ContinueLaunch(dir, id string) (proto.ContinueResult, int, error) {
	begin := time.Now()
	res := proto.ContinueResult{Method: proto.MethodNone, Pending: []proto.Pending{}}
	l, err := OpenLaunch(dir, id != "")
	if err == nil {
		err = l.Adopt(id)
	}
	if err != nil {
		return res, proto.ExitUsage, err
	}
	unlock, err := l.Lock()
	if err != nil {
		return res, proto.ExitInternal, err
	}
	defer unlock()
	if err := l.Reload(); err != nil && l.Receipt != nil {
		return res, proto.ExitUsage, err
	}
	finish := func(code int) (proto.ContinueResult, int, error) {
		if err := l.endPause(); err != nil {
			return res, proto.ExitInternal, err
		}
		res.ElapsedMS = ms(time.Since(begin))
		return res, code, nil
	}
	if l.unstarted() {
		return finish(proto.ExitOK)
	}
	paused, err := readProcSet(l.path(proto.PausedFile))
	if err != nil {
		return res, proto.ExitInternal, err
	}
	f, err := newFinder(l, false)
	if err != nil {
		return res, proto.ExitInternal, err
	}
	res.Method = f.method(false)
	if l.Cgroup != nil {
		if frozen, _ := l.Cgroup.Frozen(); frozen {
			l.Cgroup.Thaw() // a pause interrupted between freeze and thaw
		}
	}
	// The harness's group in one call, then each process the pause recorded
	// that is outside it, checked by pid and start time.
	group := l.signalGroup(unix.SIGCONT)
	for _, p := range paused {
		st, err := l.FS.ReadStat(p.PID)
		switch {
		case err != nil || st.StartTicks != p.StartTicks:
			res.Skipped++
		case group && l.Receipt != nil && st.PGID == l.Receipt.HarnessPGID:
			res.Continued++
		case l.FS.Signal(p, unix.SIGCONT) == nil:
			res.Continued++
		default:
			res.Skipped++
		}
	}
	// Anything of the launch still stopped (a process the pause found after
	// it recorded the set, or that was stopped twice) is continued too.
	wait := 500 * time.Microsecond
	deadline := begin.Add(ContinueBudget)
	for {
		var pending []proto.Pending
		found := f.pass(func(t *target) {
			if t.State == 'T' {
				if t.Signal(unix.SIGCONT) == nil && !slices.Contains(paused, procOf(t.Stat)) {
					res.Continued++
				}
			}
		})
		for pid, st := range found {
			if st.State == 'T' {
				pending = append(pending, proto.Pending{PID: pid, State: "T", Comm: st.Comm, Wchan: l.FS.Wchan(pid)})
			}
		}
		if len(pending) == 0 {
			break
		}
		if time.Now().After(deadline) {
			slices.SortFunc(pending, func(a, b proto.Pending) int { return a.PID - b.PID })
			res.Pending = pending
			return finish(proto.ExitNotConfirmed)
		}
		time.Sleep(wait)
		wait = min(wait*2, 20*time.Millisecond)
	}
	return finish(proto.ExitOK)
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
