package reaper

import (
	"path/filepath"

	"github.com/ngharness/ngharness/pkg/proto"
)

// State is a launch's state as ngsup's verbs see it. It is derived in one
// place, from the launch folder and /proc: whether the folder exists, the
// receipt (absent, unreadable, written, started, ended), the id the verb was
// given for a launch that keeps no receipt, whether the supervisor the
// receipt names lives (pid AND start time), the pause file, and, for the
// verbs that tell a copy apart, the origin file. Each verb looks up what it
// does in that state in the transition table (transitions.go).
//
// Only the states some verb treats differently are named. The stop file is
// not part of it: no control verb acts differently for it (the supervisor
// reads it, before the start and once the harness has exited).
type State uint8

// The states, in the order their conditions are checked: the first that
// holds is the launch's state.
const (
	// Missing: the folder does not exist.
	Missing State = iota
	// Unreadable: the receipt is there but cannot be read (corrupt, too
	// large, of an unknown version).
	Unreadable
	// Copied: the folder is a copy of the one the launch was set up in
	// (its origin file names another folder: a snapshot or fork of the
	// sandbox brought it) and nothing its records name runs (the
	// supervisor, the harness, the known set, the cgroup). Only the verbs
	// whose row names it look for it; the others see the state the copy's
	// receipt names.
	Copied
	// Empty: no receipt, and no --id names the launch: nothing was launched
	// from the folder yet.
	Empty
	// Tagged: no receipt, and --id names the launch: it runs without a
	// supervisor, and its processes are found by their tag (and the known
	// set, where an earlier verb wrote one).
	Tagged
	// NeverStarted: the receipt records the end of a run whose harness
	// never started (a stop file was there first, the supervisor was
	// signalled while it waited, or the command could not be run).
	NeverStarted
	// Ended: the receipt records the harness's end.
	Ended
	// Pending: the supervisor wrote the receipt but the harness has not
	// started: it waits while the pause file is there (or is about to
	// start it), or it died waiting.
	Pending
	// Orphaned: the harness started and its end is not recorded, but the
	// supervisor is gone: the launch's processes are found through the
	// known set and the tag instead of its tree.
	Orphaned
	// Paused: the harness started, its end is not recorded, the supervisor
	// lives, and the pause file is there.
	Paused
	// Running: the harness started, its end is not recorded, the
	// supervisor lives, and no pause file is there.
	Running

	numStates
)

// States lists every state, in the order of their checks.
var States = []State{Missing, Unreadable, Copied, Empty, Tagged, NeverStarted, Ended, Pending, Orphaned, Paused, Running}

var stateNames = [numStates]string{
	Missing:      "missing",
	Unreadable:   "unreadable",
	Copied:       "copied",
	Empty:        "empty",
	Tagged:       "tagged",
	NeverStarted: "never-started",
	Ended:        "ended",
	Pending:      "pending",
	Orphaned:     "orphaned",
	Paused:       "paused",
	Running:      "running",
}

// String is the state's name, as docs/ngsup.md and the "cannot X in state Y"
// errors spell it.
func (s State) String() string {
	if s < numStates {
		return stateNames[s]
	}
	return "unknown"
}

// state derives the state of a launch whose folder was opened and whose
// receipt was read (Missing and Unreadable are found while opening it, see
// openFor). copies says whether to look for a copy: only the verbs that tell
// one apart pay for reading the origin file (and, for a copy, the records).
func (l *Launch) state(copies bool) State {
	if copies {
		if copied, _ := copiedFrom(l.Dir); copied && !l.showsLife() {
			return Copied
		}
	}
	r := l.Receipt
	switch {
	case r == nil && l.ID == "":
		return Empty
	case r == nil:
		return Tagged
	case r.Ended && !r.Started:
		return NeverStarted
	case r.Ended:
		return Ended
	case !r.Started:
		return Pending
	case !l.Supervised:
		return Orphaned
	case exists(l.path(proto.PauseFile)):
		return Paused
	}
	return Running
}

// runState is the state run finds dir in, under the folder's lock (the
// folder was made first, so it is never Missing): Empty while no receipt
// file is there, else the state the receipt names (Unreadable when it cannot
// be read). Run does not tell a copy apart: a copy holds a launch too.
func runState(dir string) State {
	if !exists(filepath.Join(dir, proto.ReceiptFile)) {
		return Empty
	}
	l := &Launch{Dir: dir, FS: ProcFS}
	if err := l.readReceipt(); err != nil || l.Receipt == nil {
		return Unreadable
	}
	return l.state(false)
}
