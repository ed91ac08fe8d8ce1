package driver

import "time"

// Observer is told what the runs do, for metrics. Every method must be safe
// for concurrent use and quick.
type Observer interface {
	// LaunchEnded: a launch ended (finished, interrupted or failed).
	LaunchEnded(outcome Outcome)
	// Paused: a pause ran; ok says it was confirmed; cause names why not
	// ("not_confirmed", "no_output", "exec_error", "ended").
	Paused(took time.Duration, ok bool, cause string)
	// Continued: a continue ran; ok says every process the pause held runs
	// again; cause names why not ("failed": ngsup could not continue them;
	// "found_nothing": none of them was left to continue).
	Continued(took time.Duration, ok bool, cause string)
	// Relaunched: a run launched again after a stop or a crash.
	Relaunched(resumed bool)
}

// nopObserver observes nothing.
type nopObserver struct{}

func (nopObserver) LaunchEnded(Outcome)                   {}
func (nopObserver) Paused(time.Duration, bool, string)    {}
func (nopObserver) Continued(time.Duration, bool, string) {}
func (nopObserver) Relaunched(bool)                       {}
