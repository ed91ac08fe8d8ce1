package proto

// Proc identifies one process for as long as it lives: its pid and its start
// time in clock ticks since boot (field 22 of /proc/PID/stat). A pid whose
// start time changed belongs to another process and is never signalled.
type Proc struct {
	PID        int    `json:"pid"`
	StartTicks uint64 `json:"start_ticks"`
}

// DetachResult is what `ngsup run --detach` prints: the detached supervisor.
type DetachResult struct {
	ID         string `json:"id"`
	PID        int    `json:"pid"`
	StartTicks uint64 `json:"start_ticks"`
}

// Pending describes a process a pause, continue or stop could not confirm.
type Pending struct {
	PID int `json:"pid"`
	// State is the one-letter state of /proc/PID/stat (R, S, D, T, Z...).
	State string `json:"state"`
	// Wchan is where the process sleeps in the kernel (/proc/PID/wchan).
	Wchan string `json:"wchan,omitempty"`
	// Comm is the process's command name.
	Comm string `json:"comm,omitempty"`
}

// Method names say how a pause or stop reached the processes.
const (
	// MethodSignal: SIGSTOP to the harness's process group and to every
	// process found by walking the supervisor's tree.
	MethodSignal = "signal"
	// MethodCgroupSignal: a cgroup freeze of the launch's cgroup, plus the
	// signals of MethodSignal for anything outside it.
	MethodCgroupSignal = "cgroup+signal"
	// MethodScan: the supervisor is gone or never ran; processes were found by
	// their tag, by what earlier passes found, and their descendants.
	MethodScan = "scan"
	// MethodNone: nothing to act on (a launch that has not started).
	MethodNone = "none"
)

// PauseResult is what `ngsup pause` prints. Every field says what happened.
type PauseResult struct {
	// Paused is true when every process of the launch was confirmed stopped
	// (state T/t, or D with SIGSTOP pending, or frozen in the launch's cgroup)
	// or dead.
	Paused bool `json:"paused"`
	// Ended is true when the launch had already ended: nothing was paused.
	Ended bool `json:"ended,omitempty"`
	// Processes is how many live processes the pause holds stopped.
	Processes int `json:"processes"`
	// Gone counts processes found during the pause that exited before it ended.
	Gone int `json:"gone,omitempty"`
	// Passes is how many walks of the launch it took until one found nothing new.
	Passes int `json:"passes"`
	// ElapsedMS is the wall time of the whole pause, in milliseconds.
	ElapsedMS float64 `json:"elapsed_ms"`
	// Method says how the processes were reached (Method* constants).
	Method string `json:"method"`
	// Supervised says the launch's supervisor was alive and its tree walked.
	Supervised bool `json:"supervised"`
	// Pending lists what could not be confirmed; empty when Paused.
	Pending []Pending `json:"pending"`
	// Error is a one-line reason when Paused is false.
	Error string `json:"error,omitempty"`
	// RecoveredFreeze is true when the pause found the launch's cgroup
	// frozen by a verb that no longer runs (a pause killed between freeze
	// and thaw) and recovered it.
	RecoveredFreeze bool `json:"recovered_freeze,omitempty"`
	// SkippedLines counts unreadable lines skipped in the bookkeeping files.
	SkippedLines int `json:"skipped_lines,omitempty"`
}

// ContinueResult is what `ngsup continue` prints.
type ContinueResult struct {
	// Continued counts the processes sent SIGCONT (or thawed).
	Continued int `json:"continued"`
	// Skipped counts processes the pause had stopped that were gone or whose
	// pid now belongs to another process (left alone).
	Skipped int `json:"skipped"`
	// ElapsedMS is the wall time of the continue, in milliseconds.
	ElapsedMS float64 `json:"elapsed_ms"`
	// Method says how the processes were reached.
	Method string `json:"method"`
	// Pending lists processes still stopped afterwards.
	Pending []Pending `json:"pending"`
	// Found counts the live processes of the launch the continue's walk
	// reached, stopped or running. A continue that continued nothing and
	// found nothing found the launch gone; one sent again after its first
	// reply was lost continues nothing but finds the launch running.
	Found int `json:"found"`
	// SkippedLines counts unreadable lines skipped in the bookkeeping files.
	SkippedLines int `json:"skipped_lines,omitempty"`
}

// StopResult is what `ngsup stop` prints.
type StopResult struct {
	// Stopped is true when no process of the launch is left.
	Stopped bool `json:"stopped"`
	// Interrupted counts processes sent SIGINT; Killed those sent SIGKILL.
	Interrupted int `json:"interrupted"`
	Killed      int `json:"killed"`
	// ElapsedMS is the wall time of the stop, in milliseconds.
	ElapsedMS float64 `json:"elapsed_ms"`
	// Method says how the processes were found.
	Method string `json:"method"`
	// Supervised says the supervisor was alive when the stop began.
	Supervised bool `json:"supervised"`
	// Survivors lists processes still alive at the end.
	Survivors []Pending `json:"survivors"`
	// Searched names the sources this stop looked in for the launch's
	// processes (Source* constants), in the order it used them.
	Searched []string `json:"searched"`
	// Partial is true when the supervisor's tree could not be searched (the
	// supervisor was gone or never ran): processes it had adopted were
	// found only through the other sources, so an empty Survivors is not
	// proof that nothing is left.
	Partial bool `json:"partial,omitempty"`
	// Ended is true when the receipt said the launch had ended before this
	// stop began (its supervisor recorded the end and exited): a partial
	// search is then the normal case, what is left being only what the
	// harness detached.
	Ended bool `json:"ended,omitempty"`
	// OutOfTime is true when the stop reached its own time bound before a
	// sweep found nothing: Survivors lists what the last sweep saw.
	OutOfTime bool `json:"out_of_time,omitempty"`
	// SkippedLines counts unreadable lines skipped in the launch's
	// bookkeeping files (the known and paused sets).
	SkippedLines int `json:"skipped_lines,omitempty"`
	// ReceiptError says why the receipt could not be read when a stop
	// named by --id went on without it: the launch was then found by its
	// tag and the known set (so Partial is true), and the receipt was left
	// as it was.
	ReceiptError string `json:"receipt_error,omitempty"`
	// Copied is true when the launch folder is a copy of the one the launch
	// ran in (its origin file names another folder: a snapshot or fork of
	// the sandbox carried it here) and nothing its records name runs (the
	// supervisor, the harness, the known set, the cgroup): nothing of the
	// launch runs from it, so the stop searched nothing and signalled
	// nothing, and Stopped is true. While something they name runs, the
	// stop goes on as for any folder.
	Copied bool `json:"copied,omitempty"`
}

// Sources a stop (or pause) searches for a launch's processes.
const (
	// SourceTree: the supervisor's subtree, read from every thread's
	// children file while the supervisor lives.
	SourceTree = "tree"
	// SourceGroup: the harness's process group, while the harness lives.
	SourceGroup = "group"
	// SourceCgroup: the launch's cgroup.
	SourceCgroup = "cgroup"
	// SourceKnown: every process an earlier pass or the supervisor
	// recorded, by pid and start time.
	SourceKnown = "known"
	// SourceTag: every process whose environment carries the launch's tag.
	SourceTag = "tag"
)

// TreeProc is one process in `ngsup tree --json`.
type TreeProc struct {
	PID        int    `json:"pid"`
	PPID       int    `json:"ppid"`
	PGID       int    `json:"pgid"`
	SID        int    `json:"sid"`
	State      string `json:"state"`
	StartTicks uint64 `json:"start_ticks"`
	Threads    int    `json:"threads"`
	Comm       string `json:"comm"`
	Cmdline    string `json:"cmdline"`
}

// TreeResult is what `ngsup tree --json` prints.
type TreeResult struct {
	// ID is the launch id ("" with --pid).
	ID string `json:"id,omitempty"`
	// Root is the pid the tree hangs from (the supervisor, or --pid).
	Root int `json:"root"`
	// Supervised says the supervisor was alive and its tree walked.
	Supervised bool `json:"supervised"`
	// Processes lists every process found, parents before children.
	Processes []TreeProc `json:"processes"`
}

// VersionResult is what `ngsup version` prints.
type VersionResult struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	GoVersion string `json:"go_version"`
}

// PauseLine is one line of `ngsup pause` given several --dir: the
// PauseResult of one launch folder, with the folder as given and the exit
// code a pause of that folder alone would have had (0, 3, 4; or 2 or 1 with
// Error naming a bad folder or an internal error).
type PauseLine struct {
	Dir  string `json:"dir"`
	Code int    `json:"code"`
	PauseResult
}

// ContinueLine is one line of `ngsup continue` given several --dir: the
// ContinueResult of one launch folder, with the folder as given, the exit
// code a continue of that folder alone would have had (0, 4; or 2 or 1),
// and Error naming a bad folder or an internal error.
type ContinueLine struct {
	Dir  string `json:"dir"`
	Code int    `json:"code"`
	ContinueResult
	Error string `json:"error,omitempty"`
}
