package sandbox

import (
	"errors"
	"slices"
	"strings"
)

// Error classes of a backend. A backend wraps the cause with one of them
// (fmt.Errorf("exec in %s: %w: %v", id, ErrTransport, err)); callers decide
// with errors.Is whether to retry.
var (
	// ErrTransport: the request may not have reached the sandbox (connection
	// refused or reset). Safe to retry for idempotent calls.
	ErrTransport = errors.New("transport error")
	// ErrTimeout: the command or request ran out of time; its outcome is
	// unknown.
	ErrTimeout = errors.New("timed out")
	// ErrNotFound: a path or command id does not exist.
	ErrNotFound = errors.New("not found")
	// ErrUnauthorized: the service refused the credentials.
	ErrUnauthorized = errors.New("unauthorized")
	// ErrGone: the sandbox itself does not exist any more.
	ErrGone = errors.New("sandbox gone")
	// ErrSetup: the sandbox could not set the command up (the local
	// backend's mount namespace was not ready), so it never ran. Safe to
	// retry for idempotent calls.
	ErrSetup = errors.New("exec could not be set up")
	// ErrSnapshotInUse: the snapshot cannot be removed yet because a
	// sandbox made from it still exists (OpenSandbox's Docker runtime
	// answers 409 SNAPSHOT::DELETE_CONFLICT: the fork's container runs on
	// the snapshot's image). Nothing was removed; removing it again once
	// that sandbox is gone succeeds. Not a failure: the caller keeps the
	// snapshot and tries later.
	ErrSnapshotInUse = errors.New("snapshot still used by a sandbox made from it")
)

// Retryable reports whether an operation that failed with err may be sent
// again: only when it may not have reached the sandbox at all.
func Retryable(err error) bool {
	return errors.Is(err, ErrTransport)
}

// Quote returns s quoted for a POSIX shell: one word, nothing expanded.
func Quote(s string) string {
	if s == "" {
		return "''"
	}
	safe := true
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' ||
			strings.ContainsRune("@%+=:,./_-", r)) {
			safe = false
			break
		}
	}
	if safe {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'"'"'`) + "'"
}

// QuoteArgv returns argv as one shell command line, each word quoted.
func QuoteArgv(argv []string) string {
	words := make([]string, len(argv))
	for i, a := range argv {
		words[i] = Quote(a)
	}
	return strings.Join(words, " ")
}

// CommandLine builds the shell command that runs req.Argv in req.Dir with
// req.Env added: `cd -- DIR && K=V ... exec ARGV`, every part quoted. The
// variables are shell assignments before exec (not env(1) operands), so an
// argv[0] holding "=" is still the command. Env keys must be names.
func CommandLine(req ExecRequest) (string, error) {
	if len(req.Argv) == 0 {
		return "", errors.New("exec: empty argv")
	}
	var b strings.Builder
	if req.Dir != "" {
		b.WriteString("cd -- " + Quote(req.Dir) + " && ")
	}
	if len(req.Env) > 0 {
		if err := CheckEnv(req.Env); err != nil {
			return "", err
		}
		for _, k := range sortedKeys(req.Env) {
			b.WriteString(k + "=" + Quote(req.Env[k]) + " ")
		}
	}
	b.WriteString("exec " + QuoteArgv(req.Argv))
	return b.String(), nil
}

// CheckEnv rejects environment keys that are not shell names (a key with
// "=" or a space would change what env sets).
func CheckEnv(env map[string]string) error {
	for k := range env {
		if k == "" {
			return errors.New("exec: empty environment variable name")
		}
		for i, r := range k {
			if !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || i > 0 && r >= '0' && r <= '9') {
				return errors.New("exec: bad environment variable name " + Quote(k))
			}
		}
	}
	return nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
