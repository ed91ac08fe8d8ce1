// Package cliexec is the one implementation of the sandbox backends that
// shell out to a command-line client (docker, kubectl); each backend only
// supplies the client's command lines (see Shape). It runs the client
// (killed by its own process group when the context ends), runs every
// command in the sandbox through `CLIENT ... sh -c SCRIPT` with stdin
// attached (Script: the timeout enforced inside, since neither client can
// kill what it started, and markers on stderr that tell a command that ran
// and exited apart from a client that failed or a connection that broke),
// ends a cancelled command in the sandbox by its tag (KillScript), uploads
// through stdin, and classifies the client's own failures.
package cliexec

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
)

// Client runs a command-line client.
type Client struct {
	// Name is the client's name in errors ("docker", "kubectl").
	Name string
	// Path is the client's executable.
	Path string
	// Args go before every call's own (e.g. --context NAME).
	Args []string
	// Env is added to the driver's environment for the client (e.g.
	// DOCKER_HOST=..., KUBECONFIG=...).
	Env []string
	// Classes classify the client's own failures.
	Classes Classes
}

// Call is one run of the client.
type Call struct {
	Args   []string
	Stdin  io.Reader
	Stdout io.Writer // nil: collected into Result.Stdout
}

// Result is what the client left.
type Result struct {
	Stdout, Stderr []byte
	// ExitCode is the client's exit code (128+N for signal N; -1 unknown).
	ExitCode int
	// Ran: the client was started (it may have reached the sandbox).
	Ran bool
}

// Run runs the client until it exits or ctx ends; then its process group
// (it runs in one of its own) is killed. An error means it could not be
// started or ctx ended (a deadline wraps sandbox.ErrTimeout); a non-zero
// exit is not an error.
func (c *Client) Run(ctx context.Context, call Call) (Result, error) {
	args := append(append([]string(nil), c.Args...), call.Args...)
	cmd := exec.Command(c.Path, args...)
	if len(c.Env) > 0 {
		cmd.Env = append(os.Environ(), c.Env...)
	}
	cmd.Stdin = call.Stdin
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	if call.Stdout != nil {
		cmd.Stdout = call.Stdout
	}
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = 5 * time.Second
	if err := ctx.Err(); err != nil {
		return Result{ExitCode: -1}, ctxErr(ctx)
	}
	if err := cmd.Start(); err != nil {
		return Result{ExitCode: -1}, fmt.Errorf("start %s: %w", c.Path, err)
	}
	pid := cmd.Process.Pid
	done := make(chan struct{})
	// killed is set before the kill is sent, so a Wait that returns
	// because of it always sees it: the client's death is then the
	// context's doing, not a broken connection.
	var killed atomic.Bool
	go func() {
		select {
		case <-ctx.Done():
			killed.Store(true)
			_ = syscall.Kill(-pid, syscall.SIGKILL)
		case <-done:
		}
	}()
	werr := cmd.Wait()
	close(done)
	res := Result{Stdout: stdout.Bytes(), Stderr: stderr.Bytes(), ExitCode: -1, Ran: true}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok {
		switch {
		case ws.Signaled():
			res.ExitCode = 128 + int(ws.Signal())
		case ws.Exited():
			res.ExitCode = ws.ExitStatus()
		}
	}
	if killed.Load() {
		return res, ctxErr(ctx)
	}
	var ee *exec.ExitError
	if werr != nil && !errors.As(werr, &ee) && !errors.Is(werr, exec.ErrWaitDelay) {
		return res, fmt.Errorf("run %s: %w", c.Path, werr)
	}
	return res, nil
}

// Output runs the client with args and returns its stdout, trimmed. A
// non-zero exit is an error that names the call by its first two words
// and carries the client's message, classified (see Classes).
func (c *Client) Output(ctx context.Context, args ...string) (string, error) {
	what := c.Name + " " + strings.Join(args[:min(2, len(args))], " ")
	res, err := c.Run(ctx, Call{Args: args})
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	if res.ExitCode != 0 {
		return string(res.Stdout), fmt.Errorf("%s: %w: exit %d: %s", what, c.Classes.Classify(res.Stderr), res.ExitCode, Tail(res.Stderr))
	}
	return strings.TrimSpace(string(res.Stdout)), nil
}

func ctxErr(ctx context.Context) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("%w: %w", sandbox.ErrTimeout, ctx.Err())
	}
	return context.Cause(ctx)
}

// Classes maps what a client prints when it fails to the error classes.
// Each entry is matched case-insensitively as a substring.
type Classes struct {
	Gone, Unauthorized, Transport []string
}

// Classify returns the class of a client failure whose message is msg:
// sandbox.ErrGone, sandbox.ErrUnauthorized, or (matched or not)
// sandbox.ErrTransport, since the command never ran.
func (c Classes) Classify(msg []byte) error {
	switch {
	case Matches(msg, c.Gone...):
		return sandbox.ErrGone
	case Matches(msg, c.Unauthorized...):
		return sandbox.ErrUnauthorized
	}
	return sandbox.ErrTransport
}

// Matches reports whether msg holds one of words (case-insensitively).
func Matches(msg []byte, words ...string) bool {
	m := strings.ToLower(string(msg))
	for _, w := range words {
		if strings.Contains(m, strings.ToLower(w)) {
			return true
		}
	}
	return false
}

// Tail is the end of a client's message, for errors.
func Tail(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 1000 {
		s = "..." + s[len(s)-1000:]
	}
	if s == "" {
		return "no message"
	}
	return s
}
