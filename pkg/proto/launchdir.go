package proto

import (
	"fmt"
	"path/filepath"
)

// Files of a launch folder. The folder is the launch's whole state on the
// sandbox's disk: it survives the exec service forgetting its commands and is
// carried into a fork by the owner's snapshot.
const (
	// ReceiptFile is the msgpack receipt, replaced atomically on every write.
	ReceiptFile = "receipt"
	// StopFile, when present, keeps a run from starting anything.
	StopFile = "stop"
	// PauseFile, when present, keeps a run that has not started waiting.
	PauseFile = "pause"
	// PausedFile lists the processes the last pause stopped ("pid start" lines).
	PausedFile = "paused"
	// KnownFile lists every process any pass ever found ("pid start" lines),
	// the fallback once the supervisor is gone.
	KnownFile = "known"
	// LockFile serialises the control verbs and the run's start.
	LockFile = "lock"
	// StdoutFile and StderrFile receive the harness's output in a detached run.
	StdoutFile = "stdout"
	StderrFile = "stderr"
	// SupervisorLogFile receives the detached supervisor's own messages.
	SupervisorLogFile = "supervisor.log"
	// PausedTimeFile holds the total nanoseconds the launch spent paused, so a
	// run's --timeout does not count time held at a checkpoint.
	PausedTimeFile = "paused-ns"
	// OriginFile names the folder the launch was set up in: its device,
	// inode and birth time ("dev ino btime_ns"), written once by the first
	// verb that sets the folder up (run, or a control verb of a launch that
	// keeps no receipt). A snapshot or fork of the sandbox copies the file
	// but not the folder's identity, so a folder whose origin names another
	// folder is a copy: nothing of the launch ever ran from it.
	OriginFile = "origin"
)

// TagEnv is the environment variable every process of a launch inherits; its
// value is the launch id. It is how a launch's processes are found once the
// supervisor is gone.
const TagEnv = "NEMO_GYM_HARNESS_LAUNCH"

// MaxIDLen bounds a launch id: it becomes a file, cgroup and env value.
const MaxIDLen = 200

// ValidateDir checks that dir names a launch folder: non-empty and absolute.
// It returns dir cleaned.
func ValidateDir(dir string) (string, error) {
	if dir == "" {
		return "", fmt.Errorf("%w: --dir is required", ErrBadDir)
	}
	if !filepath.IsAbs(dir) {
		return "", fmt.Errorf("%w: --dir %q is not an absolute path", ErrBadDir, dir)
	}
	return filepath.Clean(dir), nil
}

// ValidateID checks a launch id. Ids name cgroups and files and travel in the
// environment, so only a plain set of characters is allowed: letters, digits
// and . _ - : @ + =, not starting with a dot.
func ValidateID(id string) error {
	if id == "" {
		return fmt.Errorf("%w: the id is empty", ErrBadID)
	}
	if len(id) > MaxIDLen {
		return fmt.Errorf("%w: the id is %d bytes long, the limit is %d", ErrBadID, len(id), MaxIDLen)
	}
	if id[0] == '.' {
		return fmt.Errorf("%w: %q starts with a dot", ErrBadID, id)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '.' || c == '_' || c == '-' || c == ':' || c == '@' || c == '+' || c == '=':
		case c == '/':
			return fmt.Errorf("%w: %q holds a slash", ErrBadID, id)
		default:
			return fmt.Errorf("%w: %q holds the character %q at byte %d", ErrBadID, id, rune(c), i)
		}
	}
	return nil
}
