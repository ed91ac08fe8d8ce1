// Package cliexec is what the docker and kubectl backends share: running
// their command-line client (killed by its own process group when the
// context ends), and the shell script that runs a command in the sandbox
// through `docker exec -i` or `kubectl exec -i` with its timeout enforced
// inside (neither client can kill what it started) and markers on stderr
// that tell a command that ran and exited apart from a client that failed
// or a connection that broke.
package cliexec

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
)

// Client runs a command-line client.
type Client struct {
	// Path is the client's executable.
	Path string
	// Args go before every call's own (e.g. --context NAME).
	Args []string
	// Env is added to the driver's environment for the client (e.g.
	// DOCKER_HOST=..., KUBECONFIG=...).
	Env []string
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
	res := Result{Stdout: stdout.Bytes(), Stderr: stderr.Bytes(), ExitCode: -1}
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

func ctxErr(ctx context.Context) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("%w: %w", sandbox.ErrTimeout, ctx.Err())
	}
	return context.Cause(ctx)
}

// Nonce returns a fresh random word for the markers of one command.
func Nonce() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// TagEnv tags the timeout(1) process of a Script run with its nonce (the
// command itself does not inherit it), so Kill signals only that group.
const TagEnv = "NGX_EXEC"

// Script returns the sh -c script that runs line (a command line whose
// every word is quoted) in the sandbox: a start marker on stderr, the line
// under `timeout -s KILL` (in a process group of its own, tagged with the
// nonce) when the sandbox has timeout(1), its pid on stderr, and an end
// marker with its exit code on stderr. The nonce makes the markers
// unguessable by the command's own output.
func Script(line string, timeout time.Duration, nonce string) string {
	secs := int64(math.Ceil(timeout.Seconds()))
	if secs < 1 {
		secs = 1
	}
	q := sandbox.Quote(line)
	tagged := sandbox.Quote("unset " + TagEnv + "; " + line)
	// The script's own stderr goes to /dev/null (a shell reports a child
	// killed by a signal on its stderr); the markers and the command (in a
	// subshell that restores fds 0 and 2 and execs it) get the originals.
	// The command runs as a job so that its pid is known (for Kill); a
	// job's stdin would be /dev/null, hence fd 4.
	return fmt.Sprintf(`exec 3>&2 2>/dev/null 4<&0
printf '\036ngx-%[1]s-start\n' >&3
(exec 2>&3 3>&- 0<&4 4<&-; if command -v timeout >/dev/null 2>&1; then exec env %[4]s=%[1]s timeout -s KILL %[2]d sh -c %[5]s; else exec sh -c %[3]s; fi) &
ngx_pid=$!
exec 4<&-
printf '\036ngx-%[1]s-pid %%d\n' "$ngx_pid" >&3
wait "$ngx_pid"
ngx_rc=$?
printf '\n\036ngx-%[1]s-end %%d\n' "$ngx_rc" >&3
exit "$ngx_rc"`, nonce, secs, q, TagEnv, tagged)
}

// KillScript is the sh -c script that kills the process group of the
// Script run with nonce whose pid it reported, only if that process still
// carries the nonce (a pid reused since is never signalled).
func KillScript(pid int, nonce string) string {
	return fmt.Sprintf(`p=%d; if tr '\000' '\n' </proc/$p/environ 2>/dev/null | grep -qx %s; then kill -KILL -$p 2>/dev/null || kill -KILL $p; fi`,
		pid, sandbox.Quote(TagEnv+"="+nonce))
}

// Outcome is what the markers of a Script said.
type Outcome struct {
	// Started: the script began in the sandbox. Ended: it reported the
	// command's exit code, ExitCode.
	Started, Ended bool
	ExitCode       int
	// PID is the pid of the command's process group in the sandbox (0 when
	// not reported yet).
	PID int
	// Stderr is the command's own stderr (markers removed). Client is what
	// the client printed on stderr outside the script (its own errors).
	Stderr, Client []byte
}

// Parse reads the markers of a Script run with nonce out of stderr.
func Parse(stderr []byte, nonce string) Outcome {
	start := []byte("\x1engx-" + nonce + "-start\n")
	end := []byte("\n\x1engx-" + nonce + "-end ")
	var o Outcome
	i := bytes.Index(stderr, start)
	if i < 0 {
		o.Client = stderr
		return o
	}
	o.Started = true
	o.Client = append([]byte(nil), stderr[:i]...)
	rest := stderr[i+len(start):]
	// The pid marker, wherever the command's output put it.
	pidMark := []byte("\x1engx-" + nonce + "-pid ")
	if k := bytes.Index(rest, pidMark); k >= 0 {
		if nl := bytes.IndexByte(rest[k+len(pidMark):], '\n'); nl >= 0 {
			o.PID, _ = strconv.Atoi(string(rest[k+len(pidMark) : k+len(pidMark)+nl]))
			rest = append(append([]byte(nil), rest[:k]...), rest[k+len(pidMark)+nl+1:]...)
		}
	}
	j := bytes.LastIndex(rest, end)
	if j < 0 {
		o.Stderr = rest
		return o
	}
	tail := rest[j+len(end):]
	k := bytes.IndexByte(tail, '\n')
	if k < 0 {
		o.Stderr = rest
		return o
	}
	code, err := strconv.Atoi(string(tail[:k]))
	if err != nil {
		o.Stderr = rest
		return o
	}
	o.Ended, o.ExitCode = true, code
	o.Stderr = rest[:j]
	o.Client = append(o.Client, tail[k+1:]...)
	return o
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
	m := strings.ToLower(string(msg))
	for _, s := range c.Gone {
		if strings.Contains(m, strings.ToLower(s)) {
			return sandbox.ErrGone
		}
	}
	for _, s := range c.Unauthorized {
		if strings.Contains(m, strings.ToLower(s)) {
			return sandbox.ErrUnauthorized
		}
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

// UploadLine is the command line that writes its stdin to path with mode:
// into a temporary file beside it (the folders made first), then renamed
// over it; the temporary file is removed if a step fails.
func UploadLine(path string, mode uint32) string {
	dir := path[:strings.LastIndexByte(path, '/')+1]
	if dir == "" {
		dir = "/"
	}
	tmp := dir + ".upload-" + Nonce()[:12]
	q := sandbox.Quote
	return fmt.Sprintf("mkdir -p -- %s && cat > %s && chmod %o %s && mv -f -- %s %s || { rc=$?; rm -f -- %s; exit $rc; }",
		q(dir), q(tmp), mode&0o7777, q(tmp), q(tmp), q(path), q(tmp))
}

// DefaultTimeout bounds a command whose request sets no timeout.
const DefaultTimeout = sandbox.DefaultTimeout

// slack is how much longer than a command's timeout the client may run
// before it is killed (the timeout itself is enforced inside).
const slack = 30 * time.Second

// Target is one sandbox reached through a client.
type Target struct {
	// ID names the sandbox in errors; Workdir is the folder of a request
	// without one (a relative Dir is taken from it).
	ID, Workdir string
	Client      *Client
	// ExecArgs returns the client's arguments that run `sh -c script` in
	// the sandbox with stdin attached.
	ExecArgs func(script string) []string
	// Classes classify the client's own failures.
	Classes Classes
	// Exists, if set, is asked after a command whose connection broke
	// whether the sandbox is still there (an error wrapping
	// sandbox.ErrGone when not).
	Exists func(ctx context.Context) error
}

// Exec runs req in the sandbox through the client (see Script): the exit
// code is the command's, read from the end marker. A command killed by its
// timeout is sandbox.ErrTimeout. When ctx ends first, the client is killed
// and so is the command's process group in the sandbox (KillScript). When the client failed before the script
// started, its message is classified (sandbox.ErrGone, ErrUnauthorized,
// else ErrTransport: the command never ran); when the script started but
// no end came back, the connection broke and the outcome is unknown
// (sandbox.ErrTransport, or ErrGone if the sandbox is gone).
func (t *Target) Exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	start := time.Now()
	req, timeout, line, err := sandbox.PrepareExec(ctx, t.ID, t.Workdir, req)
	if err != nil {
		return sandbox.ExecResult{ExitCode: -1}, err
	}
	return t.run(ctx, line, timeout, req.Stdin, nil, start)
}

func (t *Target) run(ctx context.Context, line string, timeout time.Duration, stdin io.Reader, stdout io.Writer, start time.Time) (sandbox.ExecResult, error) {
	nonce := Nonce()
	cctx, cancel := context.WithTimeout(ctx, timeout+slack)
	defer cancel()
	res, err := t.Client.Run(cctx, Call{Args: t.ExecArgs(Script(line, timeout, nonce)), Stdin: stdin, Stdout: stdout})
	o := Parse(res.Stderr, nonce)
	out := sandbox.ExecResult{ExitCode: -1, Stdout: res.Stdout, Stderr: o.Stderr, Duration: time.Since(start)}
	if o.Ended {
		out.ExitCode = o.ExitCode
		if o.ExitCode == 128+9 && out.Duration >= timeout {
			return out, fmt.Errorf("exec in %s: %w after %s", t.ID, sandbox.ErrTimeout, timeout)
		}
		return out, nil
	}
	if err != nil {
		if cctx.Err() != nil && o.PID > 0 {
			// Killing the client does not kill what it started: end the
			// command's group in the sandbox, as a local exec's would be.
			kctx, kcancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
			_, _ = t.Client.Run(kctx, Call{Args: t.ExecArgs(KillScript(o.PID, nonce))})
			kcancel()
		}
		if ctx.Err() == nil && cctx.Err() != nil && !errors.Is(err, sandbox.ErrTimeout) {
			err = fmt.Errorf("%w: %w", sandbox.ErrTimeout, err)
		}
		return out, fmt.Errorf("exec in %s: %w", t.ID, err)
	}
	if !o.Started {
		class := t.Classes.Classify(o.Client)
		return out, fmt.Errorf("exec in %s: %w: %s exited %d: %s", t.ID, class, t.Client.Path, res.ExitCode, Tail(o.Client))
	}
	// It started and never reported its end: the connection broke (or
	// the sandbox went away under it).
	why := fmt.Errorf("exec in %s: %w: the command started but %s exited %d before it reported its end: %s",
		t.ID, sandbox.ErrTransport, t.Client.Path, res.ExitCode, Tail(o.Client))
	if t.Exists != nil {
		ectx, ecancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer ecancel()
		if gerr := t.Exists(ectx); errors.Is(gerr, sandbox.ErrGone) {
			return out, fmt.Errorf("exec in %s: sandbox %s: %w (%v)", t.ID, t.ID, sandbox.ErrGone, why)
		}
	}
	return out, why
}

// Upload writes data to path with mode through the client's stdin (see
// UploadLine), atomically.
func (t *Target) Upload(ctx context.Context, path string, data []byte, mode uint32) error {
	if !strings.HasPrefix(path, "/") || strings.IndexByte(path, 0) >= 0 {
		return fmt.Errorf("upload to %s: path %q is not absolute", t.ID, path)
	}
	res, err := t.run(ctx, UploadLine(path, mode), 5*time.Minute, bytes.NewReader(data), nil, time.Now())
	if err != nil {
		return fmt.Errorf("upload %s: %w", path, err)
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("upload %s to %s: exit %d: %s", path, t.ID, res.ExitCode, Tail(res.Stderr))
	}
	return nil
}

// ExecTo runs line (quoted words) with its stdout written to w, for
// streams too large to hold (a snapshot's tar).
func (t *Target) ExecTo(ctx context.Context, line string, timeout time.Duration, stdin io.Reader, w io.Writer) (sandbox.ExecResult, error) {
	return t.run(ctx, line, timeout, stdin, w, time.Now())
}
