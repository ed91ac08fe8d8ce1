package driver

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/proto"
)

// Budgets of the commands that control a launch.
const (
	// ControlTimeout bounds a pause or continue command.
	ControlTimeout = 120 * time.Second
	// WaitChunk is how long one `ngsup wait` blocks, so no exec stays open
	// for the whole harness.
	WaitChunk = 30 * time.Second
	// StopGrace is the time between SIGINT and SIGKILL of a stop.
	StopGrace = 10 * time.Second
	// outputTail bounds how much of the harness's output is read back.
	outputTail = 1 << 20
)

// Ngsup drives ngsup inside sandboxes: it uploads the binary once per
// sandbox, for the sandbox's architecture, to a path named by its hash, and
// runs its verbs through exec.
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

	mu       sync.Mutex
	tools    *Tools
	uploaded map[string]string // sandbox id -> path of ngsup in it
	batches  *batcher
}

type ngsupImage struct {
	data []byte
	sum  string
}

// ErrNoNgsup means no ngsup binary is configured for the sandbox's
// architecture.
var ErrNoNgsup = errors.New("no ngsup binary for this architecture")

// DefaultBinaries finds bin/ngsup-linux-<arch> beside the running program,
// or in dir when it is not empty.
func DefaultBinaries(dir string) map[string]string {
	return FindBinaries(dir, "ngsup")
}

// FindBinaries finds <name>-linux-<arch> in dir (default: beside the running
// program), by architecture.
func FindBinaries(dir, name string) map[string]string {
	if dir == "" {
		if exe, err := os.Executable(); err == nil {
			dir = path.Dir(exe)
		}
	}
	out := map[string]string{}
	for _, arch := range []string{"amd64", "arm64"} {
		p := path.Join(dir, name+"-linux-"+arch)
		if _, err := os.Stat(p); err == nil {
			out[arch] = p
		}
	}
	return out
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

// Tools uploads static helper binaries into sandboxes: once per sandbox,
// for the sandbox's architecture, to <root>/bin/<name>-<hash>, skipped when
// a file of that hash is already there (a fork of a snapshot has it).
type Tools struct {
	mu     sync.Mutex
	images map[string]ngsupImage // by host path
}

// Ensure returns the path of the tool inside sb, uploading it if needed.
// binaries maps an architecture (GOARCH) to the host path of the build.
func (t *Tools) Ensure(ctx context.Context, sb sandbox.Sandbox, name string, binaries map[string]string) (string, error) {
	arch, err := Arch(ctx, sb)
	if err != nil {
		return "", err
	}
	p, ok := binaries[arch]
	if !ok {
		return "", fmt.Errorf("%w: %s for %s (build it with `make build`)", ErrNoNgsup, name, arch)
	}
	img, err := t.image(p)
	if err != nil {
		return "", err
	}
	dst := path.Join(sb.Root(), "bin", name+"-"+img.sum[:16])
	res, err := execRetry(ctx, sb, sandbox.ExecRequest{Argv: []string{"test", "-x", dst}, Timeout: 30 * time.Second, HostPaths: true})
	if err != nil {
		return "", fmt.Errorf("look for %s in %s: %w", name, sb.ID(), err)
	}
	if res.ExitCode != 0 {
		err := retry(ctx, func() (bool, error) {
			err := sb.Upload(ctx, dst, img.data, 0o755)
			return transientErr(err), err
		})
		if err != nil {
			return "", fmt.Errorf("upload %s to %s: %w", name, sb.ID(), err)
		}
	}
	return dst, nil
}

func (t *Tools) image(p string) (ngsupImage, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if img, ok := t.images[p]; ok {
		return img, nil
	}
	data, err := os.ReadFile(p)
	if err != nil {
		return ngsupImage{}, fmt.Errorf("read %s: %w", p, err)
	}
	sum := sha256.Sum256(data)
	img := ngsupImage{data: data, sum: hex.EncodeToString(sum[:])}
	if t.images == nil {
		t.images = map[string]ngsupImage{}
	}
	t.images[p] = img
	return img, nil
}

// Arch asks the sandbox for its machine and names it as Go does.
func Arch(ctx context.Context, sb sandbox.Sandbox) (string, error) {
	res, err := execRetry(ctx, sb, sandbox.ExecRequest{Argv: []string{"uname", "-m"}, Timeout: 30 * time.Second, HostPaths: true})
	if err != nil {
		return "", fmt.Errorf("ask %s for its architecture: %w", sb.ID(), err)
	}
	if res.ExitCode != 0 {
		return "", fmt.Errorf("ask %s for its architecture: uname -m exited %d: %s", sb.ID(), res.ExitCode, stderrLine(res))
	}
	m := strings.TrimSpace(string(res.Stdout))
	switch m {
	case "x86_64", "amd64":
		return "amd64", nil
	case "aarch64", "arm64":
		return "arm64", nil
	}
	return "", fmt.Errorf("%w: the sandbox %s says its machine is %q", ErrNoNgsup, sb.ID(), m)
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
			return nil, fmt.Errorf("ngsup %s in %s exited %d and printed %d bytes that are not one line of JSON: %q", args[0], sb.ID(), res.ExitCode, len(line), truncateMiddle(line, 200))
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
		err := retry(ctx, func() (bool, error) {
			var err error
			res, err = sb.Exec(ctx, req)
			switch {
			case err != nil:
				return transientErr(err), fmt.Errorf("run ngsup %s in %s: %w", args[0], sb.ID(), err)
			case busyBinary(res):
				return true, fmt.Errorf("run ngsup %s in %s: %s is busy", args[0], sb.ID(), bin)
			}
			line, err = check(res)
			return err != nil, err
		})
		if err != nil && !busyBinary(res) {
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

// Start launches spec under ngsup run --detach and returns once the
// supervisor has recorded itself. A try whose outcome is unknown (the exec
// broke, or its answer came back cut) is followed by a look at the launch
// folder before anything else: a supervisor that started must not be taken
// for one that could not, or the caller would launch the harness a second
// time, unsupervised (and a second `ngsup run` on the folder fails because
// the first one worked).
func (n *Ngsup) Start(ctx context.Context, sb sandbox.Sandbox, bin string, ref LaunchRef, spec LaunchSpec) error {
	args := []string{"run", "--dir", ref.Dir, "--id", ref.ID, "--detach"}
	if spec.Timeout > 0 {
		args = append(args, "--timeout", spec.Timeout.String())
	}
	args = append(append(args, "--"), spec.Argv...)
	req := sandbox.ExecRequest{Argv: append([]string{bin}, args...), Env: spec.Env, Dir: spec.Dir, Timeout: 60 * time.Second}
	started := func() bool {
		r, err := n.Status(ctx, sb, bin, ref)
		return err == nil && r.ID == ref.ID
	}
	var lastErr error
	unknown := false // some try may have started the supervisor
	fail := func(err error) error {
		if unknown && started() {
			return nil
		}
		return err
	}
	for attempt := 0; attempt < execAttempts; attempt++ {
		if attempt > 0 {
			if unknown && started() {
				return nil
			}
			if err := sleepCtx(ctx, backoff(attempt)); err != nil {
				return fmt.Errorf("%w: ngsup run in %s: %v (last error: %v)", ErrLaunch, sb.ID(), err, lastErr)
			}
		}
		res, err := sb.Exec(ctx, req)
		switch {
		case err != nil:
			lastErr = fmt.Errorf("%w: ngsup run in %s: %v", ErrLaunch, sb.ID(), err)
			if !transientErr(err) {
				return fail(lastErr)
			}
			unknown = true
			continue
		case res.ExitCode != 0:
			lastErr = fmt.Errorf("%w: ngsup run in %s exited %d: %s", ErrLaunch, sb.ID(), res.ExitCode, stderrLine(res))
			if !busyBinary(res) {
				return fail(lastErr)
			}
			continue
		}
		var d proto.DetachResult
		if err := json.Unmarshal(bytes.TrimSpace(res.Stdout), &d); err != nil || d.ID != ref.ID || d.PID <= 0 {
			lastErr = fmt.Errorf("%w: ngsup run in %s printed %q", ErrLaunch, sb.ID(), truncateBytes(res.Stdout, 200))
			unknown = true
			continue
		}
		return nil
	}
	return fail(lastErr)
}

// Wait blocks up to chunk for the launch to end and returns its receipt and
// whether it ended.
func (n *Ngsup) Wait(ctx context.Context, sb sandbox.Sandbox, bin string, ref LaunchRef, chunk time.Duration) (*proto.Receipt, bool, error) {
	var r proto.Receipt
	code, res, err := n.verb(ctx, sb, bin, chunk+30*time.Second, &r, "wait", "--dir", ref.Dir, "--timeout", chunk.String())
	if err != nil {
		return nil, false, err
	}
	switch code {
	case proto.ExitOK:
		return &r, true, nil
	case proto.ExitStillRunning:
		return &r, false, nil
	}
	return nil, false, fmt.Errorf("%w: ngsup wait in %s exited %d: %s", ErrLaunch, sb.ID(), code, stderrLine(res))
}

// Status returns the launch's receipt.
func (n *Ngsup) Status(ctx context.Context, sb sandbox.Sandbox, bin string, ref LaunchRef) (*proto.Receipt, error) {
	var r proto.Receipt
	code, res, err := n.verb(ctx, sb, bin, 60*time.Second, &r, "status", "--dir", ref.Dir)
	if err != nil {
		return nil, err
	}
	if code != 0 {
		return nil, fmt.Errorf("%w: ngsup status in %s exited %d: %s", ErrLaunch, sb.ID(), code, stderrLine(res))
	}
	return &r, nil
}

// PauseOutcome is what one pause of a launch came to.
type PauseOutcome struct {
	// Result is what ngsup printed.
	Result proto.PauseResult
	// Code is ngsup's exit code (0 paused, 3 ended, 4 not confirmed; -1
	// when the command's outcome is unknown).
	Code int
	// Attempts is how many pause commands ran (an empty answer is retried
	// once).
	Attempts int
	// Elapsed is the wall time of the whole pause.
	Elapsed time.Duration
	// Err is why the pause failed, when it did.
	Err error
}

// Paused reports a confirmed pause.
func (o PauseOutcome) Paused() bool { return o.Code == proto.ExitOK && o.Result.Paused && o.Err == nil }

// Cause names why a pause did not confirm, for metrics: "" when it did,
// "ended", "not_confirmed", "no_output" or "exec_error".
func (o PauseOutcome) Cause() string {
	switch {
	case o.Paused():
		return ""
	case o.Ended():
		return "ended"
	case o.Code == proto.ExitNotConfirmed:
		return "not_confirmed"
	case o.Err != nil && strings.Contains(o.Err.Error(), "printed nothing"):
		return "no_output"
	}
	return "exec_error"
}

// Ended reports a launch that had already ended: its result is kept.
func (o PauseOutcome) Ended() bool { return o.Code == proto.ExitEnded }

// Pause pauses the launch. A pause that printed nothing though it ended
// within its budget is run once more. Every failure is logged with the
// rollout, the exit code, the error, how long it took and the attempt.
//
// A supervised launch in a sandbox that implements sandbox.HostBatcher is
// paused together with the launches of the same host whose pauses arrive
// within BatchWindow: one `ngsup pause --dir H1 --dir H2 ...` (host paths)
// whose line for this launch counts as its first attempt. A batch that
// could not be run is run again for each launch alone; a batch that ran
// out of its budget is not (the caller falls back to stop, as for a pause
// of one launch).
func (n *Ngsup) Pause(ctx context.Context, sb sandbox.Sandbox, bin string, ref LaunchRef, rollout string) PauseOutcome {
	begin := time.Now()
	var out PauseOutcome
	if a, ok := n.batched(ctx, "pause", sb, bin, ref); ok {
		out.Attempts++
		var r proto.PauseLine
		if a.line != nil {
			if err := json.Unmarshal(a.line, &r); err != nil {
				a.err = fmt.Errorf("ngsup pause in %s printed %q: %w", sb.ID(), truncateBytes(a.line, 200), err)
			}
		}
		done, again := n.judgePause(ctx, &out, pauseAnswer{result: r.PauseResult, code: a.code, err: a.err,
			empty: a.err == nil && a.line == nil, stderr: a.stderr, took: a.took}, ref, rollout)
		if done {
			out.Elapsed = time.Since(begin)
			return out
		}
		if !again {
			return pauseFailed(out, begin)
		}
	}
	for out.Attempts < 2 {
		out.Attempts++
		start := time.Now()
		var r proto.PauseResult
		code, res, err := n.verb(ctx, sb, bin, ControlTimeout, &r, n.withID(ref, "pause")...)
		done, again := n.judgePause(ctx, &out, pauseAnswer{result: r, code: code, err: err,
			empty: err == nil && len(bytes.TrimSpace(res.Stdout)) == 0, stderr: stderrLine(res), took: time.Since(start)}, ref, rollout)
		if done {
			out.Elapsed = time.Since(begin)
			return out
		}
		if !again {
			break
		}
	}
	return pauseFailed(out, begin)
}

// pauseAnswer is what one pause command said about one launch.
type pauseAnswer struct {
	result proto.PauseResult
	code   int
	// err: the command's outcome is unknown, or its output is not what
	// the contract promises.
	err error
	// empty: it printed nothing (for this launch).
	empty bool
	// stderr is the reason it gave, for messages.
	stderr string
	took   time.Duration
}

// judgePause records one pause command's answer in out and logs a failure.
// done: the answer is final (paused, ended, or not confirmed); again: it
// printed nothing within its budget, and is to be run once more.
func (n *Ngsup) judgePause(ctx context.Context, out *PauseOutcome, a pauseAnswer, ref LaunchRef, rollout string) (done, again bool) {
	out.Result, out.Code, out.Err = a.result, a.code, a.err
	switch {
	case a.err == nil && (a.code == proto.ExitOK || a.code == proto.ExitEnded || a.code == proto.ExitNotConfirmed) && !a.empty:
		if a.code == proto.ExitNotConfirmed {
			out.Err = fmt.Errorf("pause not confirmed: %s (pending %s)", a.result.Error, pendingText(a.result.Pending))
			n.log().Warn("pause failed", "rollout", rollout, "launch", ref.ID, "exit_code", a.code,
				"error", out.Err.Error(), "took_ms", a.took.Milliseconds(), "attempt", out.Attempts)
		}
		return true, false
	case a.empty && a.took < ControlTimeout:
		out.Err = fmt.Errorf("ngsup pause printed nothing (exit %d, stderr: %s)", a.code, a.stderr)
	case a.err == nil:
		out.Err = fmt.Errorf("ngsup pause exited %d: %s", a.code, a.stderr)
	}
	n.log().Warn("pause failed", "rollout", rollout, "launch", ref.ID, "exit_code", a.code,
		"error", out.Err.Error(), "took_ms", a.took.Milliseconds(), "attempt", out.Attempts)
	return false, a.empty && ctx.Err() == nil
}

// pauseFailed finishes the outcome of a pause that confirmed nothing.
func pauseFailed(out PauseOutcome, begin time.Time) PauseOutcome {
	out.Elapsed = time.Since(begin)
	if out.Code == proto.ExitOK {
		out.Code = -1 // nothing confirmed
	}
	return out
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

// Continue continues a paused launch. It returns an error unless every
// process it stopped runs again. Like Pause, a supervised launch of a
// sandbox.HostBatcher is continued in one command with the others of its
// host that arrive within BatchWindow; a batch that could not be run, or
// that printed no line for the launch, is run again for the launch alone.
func (n *Ngsup) Continue(ctx context.Context, sb sandbox.Sandbox, bin string, ref LaunchRef) (proto.ContinueResult, error) {
	if a, ok := n.batched(ctx, "continue", sb, bin, ref); ok && (a.err != nil || a.line != nil) {
		var r proto.ContinueLine
		if a.err != nil {
			return r.ContinueResult, a.err
		}
		if err := json.Unmarshal(a.line, &r); err != nil {
			return r.ContinueResult, fmt.Errorf("ngsup continue in %s printed %q: %w", sb.ID(), truncateBytes(a.line, 200), err)
		}
		if a.code != 0 {
			return r.ContinueResult, fmt.Errorf("ngsup continue in %s exited %d: %s (pending %s)", sb.ID(), a.code, a.stderr, pendingText(r.Pending))
		}
		return r.ContinueResult, nil
	}
	var r proto.ContinueResult
	code, res, err := n.verb(ctx, sb, bin, ControlTimeout, &r, n.withID(ref, "continue")...)
	if err != nil {
		return r, err
	}
	if code != 0 {
		return r, fmt.Errorf("ngsup continue in %s exited %d: %s (pending %s)", sb.ID(), code, stderrLine(res), pendingText(r.Pending))
	}
	return r, nil
}

// Stop ends the launch: SIGINT, SIGKILL after the grace, until none is left.
func (n *Ngsup) Stop(ctx context.Context, sb sandbox.Sandbox, bin string, ref LaunchRef, grace time.Duration) (proto.StopResult, error) {
	var r proto.StopResult
	args := append(n.withID(ref, "stop"), "--grace", grace.String())
	code, res, err := n.verb(ctx, sb, bin, grace+ControlTimeout, &r, args...)
	if err != nil {
		return r, err
	}
	switch {
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
		return r, fmt.Errorf("ngsup stop in %s exited %d: %s (survivors %s)", sb.ID(), code, stderrLine(res), pendingText(r.Survivors))
	}
	return r, nil
}

// withID is a control verb's arguments; an unsupervised launch has no
// receipt, so ngsup is told its id to find it by its tag.
func (n *Ngsup) withID(ref LaunchRef, verb string) []string {
	args := []string{verb, "--dir", ref.Dir}
	if !ref.Supervised {
		args = append(args, "--id", ref.ID)
	}
	return args
}

// Output reads the tails of the launch's stdout and stderr.
func Output(ctx context.Context, sb sandbox.Sandbox, ref LaunchRef) (stdout, stderr []byte, err error) {
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
// root), then stops the sandbox itself where its backend can.
func (n *Ngsup) StopSandbox(ctx context.Context, sb sandbox.Sandbox) error {
	return n.StopSandboxGrace(ctx, sb, 2*time.Second)
}

// StopSandboxGrace is StopSandbox with the SIGINT-to-SIGKILL grace given (0:
// SIGKILL at once, for a sandbox whose run crashed).
func (n *Ngsup) StopSandboxGrace(ctx context.Context, sb sandbox.Sandbox, grace time.Duration) error {
	bin, err := n.Ensure(ctx, sb)
	if err != nil {
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
		// Named by --id (the folder's name is the launch id): an
		// unsupervised launch has no receipt, and a stop without --id on a
		// folder without a receipt exits 0 having found nothing. With a
		// receipt, ngsup checks that the id matches it.
		ref := LaunchRef{ID: name, Dir: path.Join(dir, name), Supervised: false}
		if _, err := n.Stop(ctx, sb, bin, ref, grace); err != nil {
			ref.Supervised = true
			if _, err2 := n.Stop(ctx, sb, bin, ref, grace); err2 != nil {
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

// Batching: the pauses (and continues) of supervised launches on one host
// are run as one ngsup command. At a checkpoint every run pauses its own
// launch at the same moment; hundreds of ngsup processes started at once
// cost more than the pauses themselves.
const (
	// DefaultBatchWindow is how long a batchable pause or continue waits
	// for others of its host to join its command.
	DefaultBatchWindow = 5 * time.Millisecond
	// DefaultBatchMax bounds the launches of one batched command. ngsup
	// handles 16 at once (reaper.BatchWorkers), so a full batch takes at
	// most four rounds: 20 s if every launch took the 5 s budget, and
	// about ControlTimeout if every one took the 30 s budget of
	// uninterruptible calls (a command that runs out keeps the lines it
	// printed; the launches left fall back to stop, as a pause alone that
	// ran out does). Fewer ngsup processes at a checkpoint is what makes
	// it fast: in the soak (512 launches), 64 a command beat 32.
	DefaultBatchMax = 64
)

// batchAnswer is what a batched command said about one launch.
type batchAnswer struct {
	// alone: run the launch's command alone (the batch held only it, or
	// could not be run).
	alone bool
	// line is the launch's line of JSON; nil when the command printed
	// none for it.
	line []byte
	// code is the line's code, or the command's exit code without a line.
	code int
	// stderr is the line's error, or else the last line of the command's
	// stderr, for messages.
	stderr string
	// err: the command's outcome for the launch is unknown (it ran out of
	// its budget before the launch's line, or every caller went away).
	err  error
	took time.Duration
}

// batchReq is one launch waiting for a batched command.
type batchReq struct {
	ctx    context.Context
	sb     sandbox.Sandbox
	bin    string // ngsup, as a HostPaths command reaches it
	dir    string // the launch folder, likewise
	answer chan batchAnswer
}

// batchGroup is the requests collected for one command.
type batchGroup struct {
	reqs []*batchReq
	full chan struct{} // closed when the group reached its bound
}

// batcher collects requests by key (verb, host, ngsup build).
type batcher struct {
	mu      sync.Mutex
	pending map[string]*batchGroup
}

func (n *Ngsup) batcher() *batcher {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.batches == nil {
		n.batches = &batcher{pending: map[string]*batchGroup{}}
	}
	return n.batches
}

// batched runs verb (pause or continue) for a supervised launch of a
// sandbox.HostBatcher in one command with the requests of the same host
// that arrive within BatchWindow (or until BatchMax are queued), through
// the first one's sandbox, and returns the launch's answer. ok is false
// when the launch is not batched (unsupervised, no capability, batching
// off) or its command is to be run alone: the batch held only it, or
// could not be run.
func (n *Ngsup) batched(ctx context.Context, verb string, sb sandbox.Sandbox, bin string, ref LaunchRef) (batchAnswer, bool) {
	if !ref.Supervised || n.BatchWindow < 0 {
		return batchAnswer{}, false
	}
	hb, ok := sandbox.AsHostBatcher(sb)
	if !ok {
		return batchAnswer{}, false
	}
	hbin, err1 := hb.HostPathOf(bin)
	hdir, err2 := hb.HostPathOf(ref.Dir)
	if err1 != nil || err2 != nil {
		return batchAnswer{}, false
	}
	window, limit := n.BatchWindow, n.BatchMax
	if window == 0 {
		window = DefaultBatchWindow
	}
	if limit <= 0 {
		limit = DefaultBatchMax
	}
	r := &batchReq{ctx: ctx, sb: sb, bin: hbin, dir: hdir, answer: make(chan batchAnswer, 1)}
	key := verb + "\x00" + hb.BatchKey() + "\x00" + path.Base(bin)
	n.batcher().add(key, r, window, limit, func(reqs []*batchReq) { n.runBatch(verb, reqs) })
	select {
	case a := <-r.answer:
		return a, !a.alone
	case <-ctx.Done():
		return batchAnswer{code: -1, err: fmt.Errorf("run ngsup %s in %s: %w", verb, sb.ID(), context.Cause(ctx))}, true
	}
}

// add queues r under key; the first request of a group starts its timer,
// and the group runs when the window ends or it holds limit requests.
func (b *batcher) add(key string, r *batchReq, window time.Duration, limit int, run func([]*batchReq)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	g := b.pending[key]
	if g == nil {
		g = &batchGroup{full: make(chan struct{})}
		b.pending[key] = g
		go func() {
			t := time.NewTimer(window)
			select {
			case <-t.C:
			case <-g.full:
				t.Stop()
			}
			b.mu.Lock()
			if b.pending[key] == g {
				delete(b.pending, key)
			}
			reqs := g.reqs
			b.mu.Unlock()
			run(reqs)
		}()
	}
	g.reqs = append(g.reqs, r)
	if len(g.reqs) >= limit {
		delete(b.pending, key)
		close(g.full)
	}
}

// runBatch runs one command for reqs (several launches; one runs alone) and
// hands each request its line. The command gets ControlTimeout, and is
// cancelled only when every caller has gone. The lines it printed count
// even if it failed; a launch without a line runs alone if the command
// failed, except a pause that ran out of its budget (not run again, as for
// a pause of one launch); if the command ended, a launch without a line is
// answered as by a command that printed nothing.
func (n *Ngsup) runBatch(verb string, reqs []*batchReq) {
	if len(reqs) == 1 {
		reqs[0].answer <- batchAnswer{alone: true}
		return
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(reqs[0].ctx))
	defer cancel()
	var left atomic.Int64
	left.Store(int64(len(reqs)))
	for _, r := range reqs {
		stop := context.AfterFunc(r.ctx, func() {
			if left.Add(-1) == 0 {
				cancel()
			}
		})
		defer stop()
	}
	argv := []string{reqs[0].bin, verb}
	for _, r := range reqs {
		argv = append(argv, "--dir", r.dir)
	}
	sb := reqs[0].sb
	start := time.Now()
	res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: argv, Timeout: ControlTimeout, HostPaths: true})
	took := time.Since(start)
	type found struct {
		line  []byte
		code  int
		error string
	}
	lines := map[string]found{}
	for _, l := range bytes.Split(res.Stdout, []byte{'\n'}) {
		var head struct {
			Dir   *string `json:"dir"`
			Code  *int    `json:"code"`
			Error string  `json:"error"`
		}
		if l = bytes.TrimSpace(l); len(l) == 0 || json.Unmarshal(l, &head) != nil || head.Dir == nil || head.Code == nil {
			continue
		}
		lines[*head.Dir] = found{line: l, code: *head.Code, error: head.Error}
	}
	// Without its line, a launch runs alone, except when the callers went
	// away or a pause ran out of its budget (as a pause alone that did).
	alone := err != nil && ctx.Err() == nil && (verb != "pause" || !errors.Is(err, sandbox.ErrTimeout))
	if err != nil {
		n.log().Warn("batched ngsup failed", "verb", verb, "launches", len(reqs), "sandbox", sb.ID(),
			"error", err.Error(), "took_ms", took.Milliseconds(), "lines", len(lines), "alone", alone)
	} else {
		n.log().Info("batched ngsup", "verb", verb, "launches", len(reqs), "sandbox", sb.ID(),
			"exit_code", res.ExitCode, "took_ms", took.Milliseconds(), "lines", len(lines))
	}
	for _, r := range reqs {
		a := batchAnswer{alone: alone, code: res.ExitCode, stderr: stderrLine(res), took: took}
		switch f, ok := lines[r.dir]; {
		case ok:
			a.alone, a.line, a.code = false, f.line, f.code
			if f.error != "" {
				a.stderr = f.error
			}
		case err != nil && !alone:
			a.code = -1
			a.err = fmt.Errorf("run ngsup %s (one command for %d launches) in %s: %w", verb, len(reqs), sb.ID(), err)
		}
		r.answer <- a
	}
}

// execAttempts bounds the tries of a command that is safe to send again.
const execAttempts = 5

// transientErr reports an exec error worth another try for a command that
// is safe to repeat: the request may not have reached the sandbox, ran out
// of time (a loaded sandbox), or the sandbox's exec could not be set up.
// A sandbox that is gone is never retried.
func transientErr(err error) bool {
	switch {
	case err == nil, errors.Is(err, sandbox.ErrGone), errors.Is(err, context.Canceled):
		return false
	case errors.Is(err, sandbox.ErrTransport), errors.Is(err, sandbox.ErrTimeout):
		return true
	}
	return strings.Contains(err.Error(), "could not be set up")
}

// busyBinary reports an exec that failed because its binary was still open
// for writing somewhere (ETXTBSY): a file just uploaded can stay open in a
// process forked at that moment until that process execs.
func busyBinary(res sandbox.ExecResult) bool {
	return res.ExitCode == 126 && bytes.Contains(res.Stderr, []byte("Text file busy"))
}

// execRetry runs a command that is safe to repeat, again after a transient
// failure, with backoff, up to execAttempts times.
func execRetry(ctx context.Context, sb sandbox.Sandbox, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	var res sandbox.ExecResult
	err := retry(ctx, func() (bool, error) {
		var err error
		res, err = sb.Exec(ctx, req)
		if err == nil && busyBinary(res) {
			return true, fmt.Errorf("%s is busy", req.Argv[0])
		}
		return transientErr(err), err
	})
	if err != nil && res.ExitCode == 126 && busyBinary(res) {
		return res, nil // report the last result as it was
	}
	return res, err
}

// retry calls try until it succeeds, says the failure is final, ctx ends,
// or execAttempts tries were made.
func retry(ctx context.Context, try func() (again bool, err error)) error {
	var err error
	for attempt := 0; attempt < execAttempts; attempt++ {
		if attempt > 0 {
			if cerr := sleepCtx(ctx, backoff(attempt)); cerr != nil {
				return err
			}
		}
		var again bool
		again, err = try()
		if err == nil || !again {
			return err
		}
	}
	return err
}

// backoff is the wait before try n (n >= 1): 200 ms, doubled, at most 5 s.
func backoff(n int) time.Duration {
	return min(200*time.Millisecond<<(n-1), 5*time.Second)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
