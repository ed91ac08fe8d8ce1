package launch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/proto"
)

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

// Ended reports a launch that had already ended: its result is kept.
func (o PauseOutcome) Ended() bool { return o.Code == proto.ExitEnded }

// Cause names why a pause did not confirm, for metrics: "" when it did,
// "ended", "not_confirmed" (Err wraps ErrNotConfirmed), "no_output"
// (ErrNoOutput) or "exec_error" (anything else).
func (o PauseOutcome) Cause() string {
	switch {
	case o.Paused():
		return ""
	case o.Ended():
		return "ended"
	case errors.Is(o.Err, ErrNotConfirmed):
		return "not_confirmed"
	case errors.Is(o.Err, ErrNoOutput):
		return "no_output"
	}
	return "exec_error"
}

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
func (c control) Pause(ctx context.Context, sb sandbox.Sandbox, ref Ref, rollout string) PauseOutcome {
	n := c.n
	begin := time.Now()
	var out PauseOutcome
	bin, err := n.Ensure(ctx, sb)
	if err != nil {
		out.Code, out.Err = -1, err
		return pauseFailed(out, begin)
	}
	a, ok := c.batched(ctx, "pause", sb, bin, ref)
	if a.release != nil {
		defer a.release()
	}
	if ok {
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
		code, res, err := n.verb(ctx, sb, bin, ControlTimeout, &r, c.args(ref, "pause")...)
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
func (n *Ngsup) judgePause(ctx context.Context, out *PauseOutcome, a pauseAnswer, ref Ref, rollout string) (done, again bool) {
	out.Result, out.Code, out.Err = a.result, a.code, a.err
	switch {
	case a.err == nil && (a.code == proto.ExitOK || a.code == proto.ExitEnded || a.code == proto.ExitNotConfirmed) && !a.empty:
		if a.code == proto.ExitNotConfirmed {
			out.Err = fmt.Errorf("pause %w: %s (pending %s)", ErrNotConfirmed, a.result.Error, pendingText(a.result.Pending))
			n.log().Warn("pause failed", "rollout", rollout, "launch", ref.ID, "exit_code", a.code,
				"error", out.Err.Error(), "took_ms", a.took.Milliseconds(), "attempt", out.Attempts)
		}
		return true, false
	case a.empty && a.took < ControlTimeout:
		out.Err = fmt.Errorf("ngsup pause %w (exit %d, stderr: %s)", ErrNoOutput, a.code, a.stderr)
	case a.err == nil:
		out.Err = fmt.Errorf("ngsup pause exited %d: %s", a.code, a.stderr)
	}
	// Exit code 4 is "not confirmed" whatever else went wrong.
	out.Err = exitError(a.code, out.Err)
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
