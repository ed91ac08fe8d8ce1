package proto

// Exit codes of ngsup's verbs (docs/ngsup.md, "Exit codes").
// A foreground `ngsup run` exits with the harness's own code instead.
const (
	// ExitOK: the verb did what it was asked.
	ExitOK = 0
	// ExitInternal: an internal error; stderr names it.
	ExitInternal = 1
	// ExitUsage: a usage error or an unreadable launch folder or receipt.
	ExitUsage = 2
	// ExitEnded: pause found a launch that had already ended (its result is
	// kept, nothing was paused); wait found a launch still running.
	ExitEnded = 3
	// ExitStillRunning is the code wait uses when its timeout passed first.
	ExitStillRunning = 3
	// ExitNotConfirmed: pause, continue or stop could not confirm its effect on
	// every process; the JSON lists the ones pending.
	ExitNotConfirmed = 4
	// ExitExecNotFound: the harness command was not found.
	ExitExecNotFound = 127
	// ExitExecNotRunnable: the harness command exists but could not be run.
	ExitExecNotRunnable = 126
	// ExitSignalBase is added to a signal number when the harness died of it.
	ExitSignalBase = 128
)
