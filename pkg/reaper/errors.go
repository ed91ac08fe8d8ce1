package reaper

import (
	"errors"
	"fmt"
)

// Sentinel errors of the package. The contract's own classes (a bad folder,
// no launch, a corrupt receipt...) are pkg/proto's; these are reaper's.
var (
	// ErrNoProcess means the process (or thread) does not exist any more.
	ErrNoProcess = errors.New("no such process")
	// ErrNotSameProcess means the pid now belongs to a process with another
	// start time: the one we knew is gone and its pid was reused.
	ErrNotSameProcess = errors.New("pid belongs to another process now")
	// ErrNoCgroup means no writable cgroup hierarchy with a freezer was found.
	ErrNoCgroup = errors.New("no writable cgroup freezer")
)

// StateError is a verb's refusal to act on a launch in a state where the
// transition table (transitions.go) says it cannot: "cannot X in state Y".
// It wraps why, whose class (errors.Is: proto.ErrNoLaunch,
// proto.ErrCorruptReceipt, proto.ErrLaunchExists...) gives the exit code, so
// a refusal exits as it did before the table named it.
type StateError struct {
	// Verb is the verb that refused, State the state it found.
	Verb  Verb
	State State
	// Err says why, with the launch folder in it.
	Err error
}

func (e *StateError) Error() string {
	return fmt.Sprintf("cannot %s a launch in state %s: %v", e.Verb.phrase(), e.State, e.Err)
}

// Unwrap returns why, for errors.Is.
func (e *StateError) Unwrap() error { return e.Err }
