package sandbox

import (
	"context"
	"fmt"
	"path"
	"strings"
	"time"
)

// Defaults shared by the backends that reach a sandbox from outside
// (opensandbox, docker, kubectl).
const (
	// DefaultRoot is where the driver keeps its files in a sandbox
	// (ngsup, launch folders, adapter state).
	DefaultRoot = "/var/lib/ngharness"
	// DefaultWorkdir is the folder commands run in.
	DefaultWorkdir = "/workspace"
	// DefaultTimeout bounds a command whose request sets no timeout.
	DefaultTimeout = 10 * time.Minute
)

// Folders fills in DefaultRoot and DefaultWorkdir for empty ones, and
// returns both cleaned; a relative one is an error that names it.
func Folders(root, workdir string) (string, string, error) {
	if root == "" {
		root = DefaultRoot
	}
	if workdir == "" {
		workdir = DefaultWorkdir
	}
	for _, f := range []struct{ what, p string }{{"root", root}, {"workdir", workdir}} {
		if !path.IsAbs(f.p) {
			return "", "", fmt.Errorf("the %s %q is not an absolute path", f.what, f.p)
		}
	}
	return path.Clean(root), path.Clean(workdir), nil
}

// PrepareExec is what every backend that runs a command through a shell
// does first: refuse an ended ctx, run in workdir unless req.Dir says
// otherwise (a relative Dir is taken inside workdir), fill in
// DefaultTimeout, and build the quoted command line (CommandLine), which
// may hold no NUL byte. Errors name the sandbox id.
func PrepareExec(ctx context.Context, id, workdir string, req ExecRequest) (ExecRequest, time.Duration, string, error) {
	if err := ctx.Err(); err != nil {
		return req, 0, "", fmt.Errorf("exec in %s: %w", id, err)
	}
	if req.Dir == "" {
		req.Dir = workdir
	} else if !path.IsAbs(req.Dir) {
		req.Dir = path.Join(workdir, req.Dir)
	}
	timeout := req.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	line, err := CommandLine(req)
	if err != nil {
		return req, 0, "", fmt.Errorf("exec in %s: %w", id, err)
	}
	if strings.IndexByte(line, 0) >= 0 {
		return req, 0, "", fmt.Errorf("exec in %s: the argv, environment or folder holds a NUL byte", id)
	}
	return req, timeout, line, nil
}
