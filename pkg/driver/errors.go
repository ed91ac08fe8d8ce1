package driver

import "errors"

// Sentinel errors of the driver. Callers wrap them with %w and a verb
// phrase; errors.Is tells the classes apart, and the HTTP layer maps each
// class to one status code.
var (
	// ErrBadBookmark: a bookmark is malformed (not JSON, a missing or
	// unknown "next", a field of the wrong type).
	ErrBadBookmark = errors.New("malformed bookmark")
	// ErrBookmarkVersion: a bookmark of a version this build does not read.
	ErrBookmarkVersion = errors.New("unknown bookmark version")
	// ErrBadRequest: a run request that cannot be run (no rollout id, a body
	// that is not a JSON object).
	ErrBadRequest = errors.New("bad run request")
	// ErrCancelled: the run was cancelled; its launch was killed first.
	ErrCancelled = errors.New("run cancelled")
	// ErrCrashed: the run was abandoned as if its driver had died: nothing
	// was cleaned up (used to rehearse a crash and restore).
	ErrCrashed = errors.New("run abandoned by a crash")
	// ErrDuplicateRun: a run with the same rollout id and attempt is
	// already in flight.
	ErrDuplicateRun = errors.New("run already in flight")
	// ErrRunsInFlight: a restore asked for while runs are in flight.
	ErrRunsInFlight = errors.New("runs in flight")
	// ErrShuttingDown: the participant takes no new runs.
	ErrShuttingDown = errors.New("shutting down")
)
