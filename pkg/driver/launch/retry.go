package launch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
)

// execAttempts bounds the tries of a command that is safe to send again.
const execAttempts = 5

// busyBinary reports an exec that failed because its binary was still open
// for writing somewhere (ETXTBSY): see ErrBusy.
func busyBinary(res sandbox.ExecResult) bool {
	return res.ExitCode == 126 && bytes.Contains(res.Stderr, []byte("Text file busy"))
}

// execRetry runs a command that is safe to repeat, again after a transient
// failure, with backoff, up to execAttempts times. A binary still busy
// after the last try is reported as the result it was.
func execRetry(ctx context.Context, sb sandbox.Sandbox, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	var res sandbox.ExecResult
	err := retry(ctx, func() error {
		var err error
		res, err = sb.Exec(ctx, req)
		if err == nil && busyBinary(res) {
			return fmt.Errorf("%w: %s", ErrBusy, req.Argv[0])
		}
		return err
	}, transient)
	if errors.Is(err, ErrBusy) {
		return res, nil
	}
	return res, err
}

// retry calls try until it succeeds, again(err) says the failure is final,
// ctx ends, or execAttempts tries were made; it returns the last error.
func retry(ctx context.Context, try func() error, again func(error) bool) error {
	var err error
	for attempt := 0; attempt < execAttempts; attempt++ {
		if attempt > 0 {
			if cerr := sleepCtx(ctx, backoff(attempt)); cerr != nil {
				return err
			}
		}
		if err = try(); err == nil || !again(err) {
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
