// Package hosttest is a sandbox.Sandbox on a folder of the host, for the
// unit tests of adapters: Exec runs its argv with os/exec on the host (a
// real /bin/sh, real files), Upload writes below the same filesystem. It
// isolates nothing; it is for tests alone.
package hosttest

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
)

// Sandbox is a sandbox whose inside is the host: Root is Dir/.ngharness,
// Workdir Dir/work.
type Sandbox struct {
	// Dir is the folder the sandbox's Root and Workdir are in.
	Dir string
	// Execs counts the commands run.
	Execs int
}

// New is a Sandbox in a fresh temporary folder of t (t.TempDir()), its
// work folder made.
func New(t interface {
	TempDir() string
	Fatal(...any)
}) *Sandbox {
	s := &Sandbox{Dir: t.TempDir()}
	if err := os.MkdirAll(s.Workdir(), 0o755); err != nil {
		t.Fatal(err)
	}
	return s
}

// ID implements sandbox.Sandbox.
func (s *Sandbox) ID() string { return "host" }

// Root implements sandbox.Sandbox.
func (s *Sandbox) Root() string { return filepath.Join(s.Dir, ".ngharness") }

// Workdir implements sandbox.Sandbox.
func (s *Sandbox) Workdir() string { return filepath.Join(s.Dir, "work") }

// Exec implements sandbox.Sandbox: argv runs on the host in req.Dir (the
// work folder when ""), with the host's environment and req.Env, stdin
// req.Stdin; a non-zero exit is an exit code, a command that cannot start
// an error. The timeout is left to ctx.
func (s *Sandbox) Exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	s.Execs++
	if len(req.Argv) == 0 {
		return sandbox.ExecResult{}, errors.New("hosttest: no argv")
	}
	cmd := exec.CommandContext(ctx, req.Argv[0], req.Argv[1:]...)
	cmd.Dir = req.Dir
	if cmd.Dir == "" {
		cmd.Dir = s.Workdir()
	}
	cmd.Env = os.Environ()
	for k, v := range req.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdin = req.Stdin
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return sandbox.ExecResult{ExitCode: exit.ExitCode(), Stdout: stdout.Bytes(), Stderr: stderr.Bytes()}, nil
	}
	if err != nil {
		return sandbox.ExecResult{}, err
	}
	return sandbox.ExecResult{Stdout: stdout.Bytes(), Stderr: stderr.Bytes()}, nil
}

// Upload implements sandbox.Sandbox: the folders above p are made, then
// the file written with mode.
func (s *Sandbox) Upload(_ context.Context, p string, data []byte, mode uint32) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return os.WriteFile(p, data, os.FileMode(mode))
}

var _ sandbox.Sandbox = (*Sandbox)(nil)
