// Package sandbox is how ngdriver reaches a sandbox: exec a command (argv,
// environment, working folder, timeout) and upload a file. Every process
// control the driver needs goes through ngsup run by exec, so this interface
// stays small enough for any sandbox service to implement.
//
// Backends live in sub-packages (local, opensandbox, docker, kubectl). A
// backend that runs commands through a shell builds the command line with
// Quote, so no task text, id or path can inject a command. Each also
// implements the lending contract (Lender, lend.go): what an owner needs to
// make, snapshot, fork and remove its sandboxes.
package sandbox

import (
	"context"
	"io"
	"time"
)

// ExecRequest is one command to run in a sandbox.
type ExecRequest struct {
	// Argv is the command and its arguments. It is never given to a shell
	// unquoted.
	Argv []string
	// Env is added to the sandbox's environment for this command.
	Env map[string]string
	// Dir is the working folder inside the sandbox ("" for the backend's
	// default).
	Dir string
	// Timeout bounds the command inside the sandbox (0: the backend's
	// default). It is enforced in the sandbox where the service cannot kill
	// an exec itself.
	Timeout time.Duration
	// Stdin, if set, is the command's input.
	Stdin io.Reader
	// HostPaths says the command touches the sandbox only through the
	// absolute paths among its arguments (and Dir) and needs nothing else
	// of the sandbox's view: ngsup's control verbs, test, cat, ls, tail. A
	// backend that can run such a command more cheaply outside the
	// sandbox's view, with those paths translated, may; others ignore it.
	// Never set it for a command that starts the harness.
	HostPaths bool
}

// ExecResult is what a finished command left.
type ExecResult struct {
	// ExitCode is the command's exit code (128+N when killed by signal N).
	ExitCode int
	// Stdout and Stderr are the command's output.
	Stdout, Stderr []byte
	// Duration is how long the exec took, as the driver saw it.
	Duration time.Duration
}

// Sandbox is one sandbox, reached through its backend.
type Sandbox interface {
	// ID names the sandbox for its backend and in logs.
	ID() string
	// Exec runs a command and waits for it. A non-zero exit code is not an
	// error; an error means the command's outcome is unknown (classified with
	// the sentinels of errors.go).
	Exec(ctx context.Context, req ExecRequest) (ExecResult, error)
	// Upload writes data to path inside the sandbox with mode, creating the
	// folders above it, replacing any file there.
	Upload(ctx context.Context, path string, data []byte, mode uint32) error
	// Root is a folder inside the sandbox, on the filesystem its snapshot
	// carries, where ngharness keeps its own files (ngsup, launch folders,
	// harness state).
	Root() string
	// Workdir is the task's working folder inside the sandbox.
	Workdir() string
}

// Descriptor says which sandbox an owner lent: what /sandbox_access returns
// under connection.descriptor.
type Descriptor struct {
	// Provider names the backend ("local", "opensandbox", "docker", "kubectl").
	Provider string `json:"provider_config_ref"`
	// SandboxID is the sandbox's id for that backend.
	SandboxID string `json:"sandbox_id"`
	// Workdir is the task's working folder inside it.
	Workdir string `json:"workdir"`
}

// Backend connects to the sandboxes of one provider.
type Backend interface {
	// Name is the provider name descriptors use.
	Name() string
	// Connect returns a handle on the sandbox a descriptor names.
	Connect(ctx context.Context, d Descriptor) (Sandbox, error)
}

// Stopper is implemented by sandboxes the driver may stop itself (a restart
// run's sandbox, or one the driver created). Stop ends every process in it.
type Stopper interface {
	Stop(ctx context.Context) error
}

// HostBatcher is the optional capability of a sandbox whose HostPaths
// commands run on a host it shares with other sandboxes (the local
// backend's). Sandboxes with the same BatchKey live on the same host, and a
// command marked HostPaths run through any one of them may name the others'
// paths by HostPathOf: one command may then cover several sandboxes at once
// (the driver pauses and continues the launches of one host with one ngsup
// process).
type HostBatcher interface {
	// BatchKey names the host (the backend instance); sandboxes with equal
	// keys may be covered by one HostPaths command.
	BatchKey() string
	// HostPathOf maps an absolute path inside the sandbox to the path a
	// HostPaths command of any sandbox with the same BatchKey reaches it
	// at. It is an error for a path the sandbox cannot translate.
	HostPathOf(inside string) (string, error)
}

// Unwrapper is implemented by a sandbox that wraps another (a layer that
// records or intercepts its execs): Unwrap returns the wrapped sandbox.
type Unwrapper interface {
	Unwrap() Sandbox
}

// AsHostBatcher returns sb's HostBatcher, looking through wrappers
// (Unwrapper); ok is false when sb has none. Commands still go through sb
// itself, so a wrapper sees them.
func AsHostBatcher(sb Sandbox) (HostBatcher, bool) {
	for i := 0; sb != nil && i < 16; i++ {
		if hb, ok := sb.(HostBatcher); ok {
			return hb, true
		}
		u, ok := sb.(Unwrapper)
		if !ok {
			return nil, false
		}
		sb = u.Unwrap()
	}
	return nil, false
}

// ToolSharer is the optional capability of a sandbox whose backend keeps
// static helper binaries (ngsup, ngresume) once per host, outside every
// sandbox's folder, instead of a copy uploaded into each sandbox (which a
// snapshot and a fork would then copy again, 3.5 MB a sandbox). The shared
// file is the backend's: no sandbox can write it, and the backend checks
// it is still the content it installed before a command runs it, so code
// in one sandbox can neither change the tool another sandbox runs nor the
// one the host runs for it (HostPaths).
type ToolSharer interface {
	// SharedTool installs the tool name whose content is data (sum is the
	// hex SHA-256 of data) unless the host has it already, and returns its
	// path as commands of the sandbox name it (HostPaths commands too).
	SharedTool(ctx context.Context, name string, data []byte, sum string) (string, error)
}

// AsToolSharer returns sb's ToolSharer, looking through wrappers
// (Unwrapper); ok is false when sb has none.
func AsToolSharer(sb Sandbox) (ToolSharer, bool) {
	for i := 0; sb != nil && i < 16; i++ {
		if ts, ok := sb.(ToolSharer); ok {
			return ts, true
		}
		u, ok := sb.(Unwrapper)
		if !ok {
			return nil, false
		}
		sb = u.Unwrap()
	}
	return nil, false
}
