package cliexec

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
)

// DefaultTimeout bounds a command whose request sets no timeout.
const DefaultTimeout = sandbox.DefaultTimeout

// slack is how much longer than a command's timeout the client may run
// before it is killed (the timeout itself is enforced inside).
const slack = 30 * time.Second

// Shape is what a backend supplies for one sandbox: the command lines of
// its client.
type Shape struct {
	// ExecArgs returns the client's arguments that run `sh -c script` in
	// the sandbox with stdin attached.
	ExecArgs func(script string) []string
	// Exists, if set, is asked after a command whose connection broke
	// whether the sandbox is still there (an error wrapping
	// sandbox.ErrGone when not).
	Exists func(ctx context.Context) error
}

// Sandbox is one sandbox reached through a client. It implements
// sandbox.Sandbox.
type Sandbox struct {
	c                 *Client
	id, root, workdir string
	shape             Shape
}

var _ sandbox.Sandbox = (*Sandbox)(nil)

// NewSandbox returns the sandbox id (named so in errors), whose files
// ngharness keeps under root and whose commands run in workdir unless they
// say otherwise.
func NewSandbox(c *Client, id, root, workdir string, shape Shape) *Sandbox {
	return &Sandbox{c: c, id: id, root: root, workdir: path.Clean(workdir), shape: shape}
}

// ID is the sandbox's id.
func (s *Sandbox) ID() string { return s.id }

// Root is where ngharness keeps its files in the sandbox.
func (s *Sandbox) Root() string { return s.root }

// Workdir is the folder of a command that names none.
func (s *Sandbox) Workdir() string { return s.workdir }

// Exec runs req in the sandbox through the client (see Script): the exit
// code is the command's, read from the end marker. A command killed by its
// timeout is sandbox.ErrTimeout. When ctx ends first, the client is killed
// and so is the command in the sandbox, by its tag (KillScript), however
// far it got. When the client failed before the script started, its
// message is classified (sandbox.ErrGone, ErrUnauthorized, else
// ErrTransport: the command never ran); when the script started but no
// end came back, the connection broke and the outcome is unknown
// (sandbox.ErrTransport, or ErrGone if the sandbox is gone).
func (s *Sandbox) Exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	start := time.Now()
	req, timeout, line, err := sandbox.PrepareExec(ctx, s.id, s.workdir, req)
	if err != nil {
		return sandbox.ExecResult{ExitCode: -1}, err
	}
	return s.run(ctx, line, timeout, req.Stdin, nil, start)
}

// ExecTo runs line (quoted words) with its stdout written to w, for
// streams too large to hold (a snapshot's tar).
func (s *Sandbox) ExecTo(ctx context.Context, line string, timeout time.Duration, stdin io.Reader, w io.Writer) (sandbox.ExecResult, error) {
	return s.run(ctx, line, timeout, stdin, w, time.Now())
}

// Upload writes data to path with mode through the client's stdin (see
// UploadLine): into a temporary file that is then renamed over path.
func (s *Sandbox) Upload(ctx context.Context, p string, data []byte, mode uint32) error {
	if !strings.HasPrefix(p, "/") || strings.IndexByte(p, 0) >= 0 {
		return fmt.Errorf("%s: upload to %s: path %q is not absolute", s.c.Name, s.id, p)
	}
	p = path.Clean(p)
	res, err := s.run(ctx, UploadLine(p, mode), 5*time.Minute, bytes.NewReader(data), nil, time.Now())
	if err != nil {
		return fmt.Errorf("%s: upload %s: %w", s.c.Name, p, err)
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("%s: upload %s to %s: exit %d: %s", s.c.Name, p, s.id, res.ExitCode, Tail(res.Stderr))
	}
	return nil
}

// MakeFolders makes dirs (and the folders above them) in the sandbox.
func (s *Sandbox) MakeFolders(ctx context.Context, dirs ...string) error {
	res, err := s.Exec(ctx, sandbox.ExecRequest{Argv: append([]string{"mkdir", "-p", "--"}, dirs...), Dir: "/", Timeout: time.Minute})
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("mkdir exited %d: %s", res.ExitCode, Tail(res.Stderr))
	}
	return err
}

func (s *Sandbox) run(ctx context.Context, line string, timeout time.Duration, stdin io.Reader, stdout io.Writer, start time.Time) (sandbox.ExecResult, error) {
	nonce := Nonce()
	cctx, cancel := context.WithTimeout(ctx, timeout+slack)
	defer cancel()
	res, err := s.c.Run(cctx, Call{Args: s.shape.ExecArgs(Script(line, timeout, nonce, Fence(s.root, nonce))), Stdin: stdin, Stdout: stdout})
	o := Parse(res.Stderr, nonce)
	out := sandbox.ExecResult{ExitCode: -1, Stdout: res.Stdout, Stderr: o.Stderr, Duration: time.Since(start)}
	if o.Ended {
		out.ExitCode = o.ExitCode
		if o.ExitCode == 128+9 && out.Duration >= timeout {
			return out, fmt.Errorf("exec in %s: %w after %s", s.id, sandbox.ErrTimeout, timeout)
		}
		return out, nil
	}
	if err != nil {
		if res.Ran && cctx.Err() != nil {
			// Killing the client does not kill what it started, and the
			// client may have died before any marker reached it.
			if kerr := s.kill(ctx, nonce); kerr != nil {
				err = fmt.Errorf("%w (and ending the command in the sandbox failed: %v)", err, kerr)
			}
		}
		if ctx.Err() == nil && cctx.Err() != nil && !errors.Is(err, sandbox.ErrTimeout) {
			err = fmt.Errorf("%w: %w", sandbox.ErrTimeout, err)
		}
		return out, fmt.Errorf("exec in %s: %w", s.id, err)
	}
	if !o.Started {
		class := s.c.Classes.Classify(o.Client)
		return out, fmt.Errorf("exec in %s: %w: %s exited %d: %s", s.id, class, s.c.Path, res.ExitCode, Tail(o.Client))
	}
	// It started and never reported its end: the connection broke (or
	// the sandbox went away under it).
	why := fmt.Errorf("exec in %s: %w: the command started but %s exited %d before it reported its end: %s",
		s.id, sandbox.ErrTransport, s.c.Path, res.ExitCode, Tail(o.Client))
	if s.shape.Exists != nil {
		ectx, ecancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer ecancel()
		// A container removed under the command can still show as running
		// for a moment after its exec died (seen with dockerd 20.10: 1 of
		// 6 times right after `docker rm -f`): ask again for goneSettle
		// before taking it for a broken connection.
		settle := time.Now().Add(goneSettle)
		for {
			if gerr := s.shape.Exists(ectx); errors.Is(gerr, sandbox.ErrGone) {
				return out, fmt.Errorf("exec in %s: sandbox %s: %w (%v)", s.id, s.id, sandbox.ErrGone, why)
			}
			if time.Now().After(settle) || sleepCtx(ectx, 200*time.Millisecond) != nil {
				break
			}
		}
	}
	return out, why
}

// goneSettle is how long a sandbox that still shows as there after an exec
// broke is asked again whether it is gone.
const goneSettle = 2 * time.Second

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// kill ends the command of the Script run with nonce in the sandbox (see
// KillScript), whether or not it began.
func (s *Sandbox) kill(ctx context.Context, nonce string) error {
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
	defer cancel()
	res, err := s.c.Run(kctx, Call{Args: s.shape.ExecArgs(KillScript(nonce, Fence(s.root, nonce)))})
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("%s exited %d: %s", s.c.Path, res.ExitCode, Tail(res.Stderr))
	}
	return err
}
