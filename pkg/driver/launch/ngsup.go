package launch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/proto"
)

// Ngsup drives ngsup inside sandboxes: it uploads the binary once per
// sandbox, for the sandbox's architecture, to a path named by its hash, and
// runs its verbs through exec. Its launchers (Launcher) start and control
// launches with it.
type Ngsup struct {
	// Binaries maps an architecture (GOARCH: amd64, arm64) to the host path
	// of the static ngsup built for it.
	Binaries map[string]string
	// Log receives what went wrong and how long it took.
	Log *slog.Logger
	// BatchWindow is how long the pause (or continue) of a supervised
	// launch in a sandbox that implements sandbox.HostBatcher waits for
	// others of the same host to join it in one ngsup command (0:
	// DefaultBatchWindow; negative: never batch).
	BatchWindow time.Duration
	// BatchMax bounds the launches of one batched command (0:
	// DefaultBatchMax).
	BatchMax int
	// BatchConcurrency bounds the batched commands of one verb that run at
	// once on one host (0: DefaultBatchConcurrency). A launch whose
	// command runs alone takes a slot too.
	BatchConcurrency int

	mu       sync.Mutex
	tools    *Tools
	uploaded map[string]string // sandbox id -> path of ngsup in it
	batches  *batcher
}

// Launcher returns the launcher of supervised launches (`ngsup run
// --detach`), or of launches that run tagged only (the fallback when ngsup
// cannot supervise; pause, continue and stop find their processes by the
// tag, with `--id`).
func (n *Ngsup) Launcher(supervised bool) Launcher {
	if supervised {
		return supervisedLauncher{control{n: n}}
	}
	return tagOnlyLauncher{control{n: n, byTag: true}}
}

func (n *Ngsup) log() *slog.Logger {
	if n.Log == nil {
		return slog.Default()
	}
	return n.Log
}

// Ensure returns the path of ngsup inside sb, uploading it if it is not
// there yet: once per sandbox, skipped when the file with that hash exists.
func (n *Ngsup) Ensure(ctx context.Context, sb sandbox.Sandbox) (string, error) {
	n.mu.Lock()
	if p, ok := n.uploaded[sb.ID()]; ok {
		n.mu.Unlock()
		return p, nil
	}
	if n.tools == nil {
		n.tools = &Tools{}
	}
	tools := n.tools
	n.mu.Unlock()
	dst, err := tools.Ensure(ctx, sb, "ngsup", n.Binaries)
	if err != nil {
		return "", err
	}
	n.mu.Lock()
	if n.uploaded == nil {
		n.uploaded = map[string]string{}
	}
	n.uploaded[sb.ID()] = dst
	n.mu.Unlock()
	return dst, nil
}

// verb runs one ngsup verb and decodes its one line of JSON into out. It
// returns the exit code; an error means the outcome is unknown or the
// output was not what the contract promises.
//
// wait, status, continue and stop are safe to send again: they are sent
// again after a transient failure, and also when what came back is not one
// whole line of JSON (an exec whose output was cut, under load, must not
// fail the run: the launch is still there to ask).
func (n *Ngsup) verb(ctx context.Context, sb sandbox.Sandbox, bin string, timeout time.Duration, out any, args ...string) (int, sandbox.ExecResult, error) {
	req := sandbox.ExecRequest{Argv: append([]string{bin}, args...), Timeout: timeout, HostPaths: true}
	// check reads the last line of the output, the verb's answer.
	check := func(res sandbox.ExecResult) ([]byte, error) {
		line := bytes.TrimSpace(res.Stdout)
		if i := bytes.LastIndexByte(line, '\n'); i >= 0 {
			line = line[i+1:]
		}
		if out != nil && len(line) > 0 && !json.Valid(line) {
			return nil, fmt.Errorf("ngsup %s in %s exited %d and %w: %d bytes: %q", args[0], sb.ID(), res.ExitCode, ErrBadOutput, len(line), truncateMiddle(line, 200))
		}
		return line, nil
	}
	var res sandbox.ExecResult
	var line []byte
	if args[0] == "pause" {
		// A pause is retried only as the contract says (an empty answer,
		// once), never after its budget ran out: the caller falls back
		// to stop.
		var err error
		if res, err = sb.Exec(ctx, req); err != nil {
			return -1, res, fmt.Errorf("run ngsup %s in %s: %w", args[0], sb.ID(), err)
		}
		if line, err = check(res); err != nil {
			return res.ExitCode, res, err
		}
	} else {
		err := retry(ctx, func() error {
			var err error
			if res, err = sb.Exec(ctx, req); err != nil {
				return fmt.Errorf("run ngsup %s in %s: %w", args[0], sb.ID(), err)
			}
			if busyBinary(res) {
				return fmt.Errorf("run ngsup %s in %s: %w: %s", args[0], sb.ID(), ErrBusy, bin)
			}
			line, err = check(res)
			return err
		}, resend)
		if err != nil && !errors.Is(err, ErrBusy) {
			return -1, res, err
		}
	}
	if out != nil && len(line) > 0 {
		if err := json.Unmarshal(line, out); err != nil {
			return res.ExitCode, res, fmt.Errorf("ngsup %s in %s printed %q: %w", args[0], sb.ID(), truncateBytes(line, 200), err)
		}
	}
	return res.ExitCode, res, nil
}

// control is what both launchers share: the control verbs, which differ
// only in how they name the launch.
type control struct {
	n *Ngsup
	// byTag: the launch keeps no receipt, so ngsup is told its id (--id)
	// to find it by its tag; such a launch is never batched.
	byTag bool
}

// Prepare uploads ngsup into sb (once per sandbox).
func (c control) Prepare(ctx context.Context, sb sandbox.Sandbox) error {
	_, err := c.n.Ensure(ctx, sb)
	return err
}

// args is a control verb's arguments.
func (c control) args(ref Ref, verb string) []string {
	args := []string{verb, "--dir", ref.Dir}
	if c.byTag {
		args = append(args, "--id", ref.ID)
	}
	return args
}

// Continue continues a paused launch. It returns an error unless every
// process it stopped runs again. Like Pause, a supervised launch of a
// sandbox.HostBatcher is continued in one command with the others of its
// host that arrive within BatchWindow; a batch that could not be run, or
// that printed no line for the launch, is run again for the launch alone.
func (c control) Continue(ctx context.Context, sb sandbox.Sandbox, ref Ref) (proto.ContinueResult, error) {
	n := c.n
	bin, err := n.Ensure(ctx, sb)
	if err != nil {
		return proto.ContinueResult{}, err
	}
	a, ok := c.batched(ctx, "continue", sb, bin, ref)
	if a.release != nil {
		defer a.release()
	}
	if ok && (a.err != nil || a.line != nil) {
		var r proto.ContinueLine
		if a.err != nil {
			return r.ContinueResult, a.err
		}
		if err := json.Unmarshal(a.line, &r); err != nil {
			return r.ContinueResult, fmt.Errorf("ngsup continue in %s printed %q: %w", sb.ID(), truncateBytes(a.line, 200), err)
		}
		if a.code != 0 {
			return r.ContinueResult, exitError(a.code, fmt.Errorf("ngsup continue in %s exited %d: %s (pending %s)", sb.ID(), a.code, a.stderr, pendingText(r.Pending)))
		}
		return r.ContinueResult, nil
	}
	var r proto.ContinueResult
	code, res, err := n.verb(ctx, sb, bin, ControlTimeout, &r, c.args(ref, "continue")...)
	if err != nil {
		return r, err
	}
	if code != 0 {
		return r, exitError(code, fmt.Errorf("ngsup continue in %s exited %d: %s (pending %s)", sb.ID(), code, stderrLine(res), pendingText(r.Pending)))
	}
	return r, nil
}

// Stop ends the launch: SIGINT, SIGKILL after the grace, until none is left.
func (c control) Stop(ctx context.Context, sb sandbox.Sandbox, ref Ref, grace time.Duration) (proto.StopResult, error) {
	n := c.n
	var r proto.StopResult
	bin, err := n.Ensure(ctx, sb)
	if err != nil {
		return r, err
	}
	args := append(c.args(ref, "stop"), "--grace", grace.String())
	code, res, err := n.verb(ctx, sb, bin, grace+ControlTimeout, &r, args...)
	if err != nil {
		return r, err
	}
	switch {
	case r.Copied:
		// A fork's copy of an earlier launch's folder: that launch never
		// ran in this sandbox, so nothing was searched here, by design.
		n.log().Debug("a launch folder that came with a fork: nothing of it runs here", "launch", ref.ID, "sandbox", sb.ID())
	case r.OutOfTime || r.Partial && !r.Ended:
		// No survivor listed is then no proof that nothing is left.
		n.log().Warn("the stop could not make sure the launch is gone", "launch", ref.ID, "sandbox", sb.ID(),
			"partial", r.Partial, "out_of_time", r.OutOfTime, "searched", strings.Join(r.Searched, ","), "survivors", len(r.Survivors))
	case r.Partial:
		// An ended launch's supervisor is gone by design: only what the
		// harness detached can be left, found by the known set and the tag.
		n.log().Info("stopped what an ended launch left", "launch", ref.ID, "sandbox", sb.ID(),
			"searched", strings.Join(r.Searched, ","), "survivors", len(r.Survivors))
	}
	if code != 0 {
		return r, exitError(code, fmt.Errorf("ngsup stop in %s exited %d: %s (survivors %s)", sb.ID(), code, stderrLine(res), pendingText(r.Survivors)))
	}
	return r, nil
}

// exitError is err, the failure of a control verb that exited code,
// marked ErrNotConfirmed when the code says so (4).
func exitError(code int, err error) error {
	if code == proto.ExitNotConfirmed {
		return fmt.Errorf("%w: %w", ErrNotConfirmed, err)
	}
	return err
}

// Output reads the tails of the launch's stdout and stderr.
func (c control) Output(ctx context.Context, sb sandbox.Sandbox, ref Ref) (stdout, stderr []byte, err error) {
	read := func(name string) ([]byte, error) {
		res, err := execRetry(ctx, sb, sandbox.ExecRequest{
			Argv:      []string{"tail", "-c", strconv.Itoa(outputTail), path.Join(ref.Dir, name)},
			Timeout:   60 * time.Second,
			HostPaths: true,
		})
		if err != nil {
			return nil, fmt.Errorf("read the harness's %s in %s: %w", name, sb.ID(), err)
		}
		if res.ExitCode != 0 {
			return nil, nil // nothing written
		}
		return res.Stdout, nil
	}
	if stdout, err = read(proto.StdoutFile); err != nil {
		return nil, nil, err
	}
	stderr, err = read(proto.StderrFile)
	return stdout, stderr, err
}

// StopSandbox ends every launch in the sandbox (each launch folder under its
// root), then stops the sandbox itself where its backend can. A launch
// folder a fork carried in from the sandbox it was taken from is a copy:
// ngsup answers it at once (copied), searching nothing.
func (n *Ngsup) StopSandbox(ctx context.Context, sb sandbox.Sandbox) error {
	return n.StopSandboxGrace(ctx, sb, 2*time.Second)
}

// StopSandboxGrace is StopSandbox with the SIGINT-to-SIGKILL grace given (0:
// SIGKILL at once, for a sandbox whose run crashed).
func (n *Ngsup) StopSandboxGrace(ctx context.Context, sb sandbox.Sandbox, grace time.Duration) error {
	if _, err := n.Ensure(ctx, sb); err != nil {
		return err
	}
	dir := path.Join(sb.Root(), "launches")
	res, err := execRetry(ctx, sb, sandbox.ExecRequest{Argv: []string{"ls", "-1", dir}, Timeout: 30 * time.Second, HostPaths: true})
	if err != nil {
		return fmt.Errorf("list the launches in %s: %w", sb.ID(), err)
	}
	var errs []error
	for _, name := range strings.Fields(string(res.Stdout)) {
		if proto.ValidateID(name) != nil {
			continue
		}
		// Named by --id (the folder's name is the launch id): a launch
		// that runs tagged only has no receipt, and a stop without --id on
		// a folder without a receipt exits 0 having found nothing. With a
		// receipt, ngsup checks that the id matches it.
		ref := Ref{ID: name, Dir: path.Join(dir, name)}
		if _, err := n.Launcher(false).Stop(ctx, sb, ref, grace); err != nil {
			if _, err2 := n.Launcher(true).Stop(ctx, sb, ref, grace); err2 != nil {
				errs = append(errs, err)
			}
		}
	}
	if s, ok := sb.(sandbox.Stopper); ok {
		if err := s.Stop(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// truncateMiddle keeps the head and the tail of b, at most n bytes in all,
// so a message about cut output shows where it was cut.
func truncateMiddle(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	return string(b[:n/2]) + " ... " + string(b[len(b)-n/2:])
}

func truncateBytes(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "..."
	}
	return string(b)
}

// stderrLine is the last line of a command's stderr, for error messages.
func stderrLine(res sandbox.ExecResult) string {
	s := strings.TrimSpace(string(res.Stderr))
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	if s == "" {
		return "no message"
	}
	return s
}

func pendingText(ps []proto.Pending) string {
	if len(ps) == 0 {
		return "none listed"
	}
	var parts []string
	for i, p := range ps {
		if i == 8 {
			parts = append(parts, fmt.Sprintf("and %d more", len(ps)-i))
			break
		}
		parts = append(parts, fmt.Sprintf("%d:%s:%s", p.PID, p.State, p.Wchan))
	}
	return strings.Join(parts, " ")
}
