package launch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/harness"
	"github.com/ngharness/ngharness/pkg/proto"
)

// supervisedLauncher launches under `ngsup run --detach`: the supervisor
// keeps the launch's receipt, and the control verbs name the launch by its
// folder alone.
type supervisedLauncher struct{ control }

// Supervised is true: ngsup supervises these launches.
func (supervisedLauncher) Supervised() bool { return true }

// Start launches spec under ngsup run --detach and returns once the
// supervisor has recorded itself. A try whose outcome is unknown (the exec
// broke, or its answer came back cut) is followed by a look at the launch
// folder before anything else: a supervisor that started must not be taken
// for one that could not, or the caller would launch the harness a second
// time, unsupervised (and a second `ngsup run` on the folder fails because
// the first one worked). A failure while ctx and the sandbox are still
// there wraps ErrNoSupervisor.
func (s supervisedLauncher) Start(ctx context.Context, sb sandbox.Sandbox, ref Ref, spec harness.LaunchSpec) error {
	bin, err := s.n.Ensure(ctx, sb)
	if err != nil {
		return err
	}
	args := []string{"run", "--dir", ref.Dir, "--id", ref.ID, "--detach"}
	if spec.Timeout > 0 {
		args = append(args, "--timeout", spec.Timeout.String())
	}
	if spec.Stdin != "" {
		args = append(args, "--stdin", spec.Stdin)
	}
	args = append(append(args, "--"), spec.Argv...)
	req := sandbox.ExecRequest{Argv: append([]string{bin}, args...), Env: spec.Env, Dir: spec.Dir, Timeout: 60 * time.Second}
	started := func() bool {
		r, err := s.Status(ctx, sb, ref)
		return err == nil && r.ID == ref.ID
	}
	var lastErr error
	unknown := false // some try may have started the supervisor
	fail := func(err error) error {
		if unknown && started() {
			return nil
		}
		return noSupervisor(ctx, err)
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
			lastErr = fmt.Errorf("%w: ngsup run in %s: %w", ErrLaunch, sb.ID(), err)
			if !transient(err) {
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
			lastErr = fmt.Errorf("%w: ngsup run in %s %w: %q", ErrLaunch, sb.ID(), ErrBadOutput, truncateBytes(res.Stdout, 200))
			unknown = true
			continue
		}
		return nil
	}
	return fail(lastErr)
}

// noSupervisor marks err, the failure of a supervised start, with
// ErrNoSupervisor, unless ctx ended or the sandbox is gone (then nothing
// can be launched in its place).
func noSupervisor(ctx context.Context, err error) error {
	if err == nil || ctx.Err() != nil || errors.Is(err, sandbox.ErrGone) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrNoSupervisor, err)
}

// Wait blocks up to chunk for the launch to end and returns its receipt and
// whether it ended.
func (s supervisedLauncher) Wait(ctx context.Context, sb sandbox.Sandbox, ref Ref, chunk time.Duration) (*proto.Receipt, bool, error) {
	bin, err := s.n.Ensure(ctx, sb)
	if err != nil {
		return nil, false, err
	}
	var r proto.Receipt
	code, res, err := s.n.verb(ctx, sb, bin, chunk+30*time.Second, &r, "wait", "--dir", ref.Dir, "--timeout", chunk.String())
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
func (s supervisedLauncher) Status(ctx context.Context, sb sandbox.Sandbox, ref Ref) (*proto.Receipt, error) {
	bin, err := s.n.Ensure(ctx, sb)
	if err != nil {
		return nil, err
	}
	var r proto.Receipt
	code, res, err := s.n.verb(ctx, sb, bin, 60*time.Second, &r, "status", "--dir", ref.Dir)
	if err != nil {
		return nil, err
	}
	if code != 0 {
		return nil, fmt.Errorf("%w: ngsup status in %s exited %d: %s", ErrLaunch, sb.ID(), code, stderrLine(res))
	}
	return &r, nil
}
