package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/harness"
	"github.com/ngharness/ngharness/pkg/proto"
)

// TestTransientByClassOnly proves that what is tried again is decided by
// the sentinel an error wraps, at any depth, and never by its text.
func TestTransientByClassOnly(t *testing.T) {
	wrap := func(class error) error { return fmt.Errorf("run ngsup wait in sb-1: exec in sb-1: %w: reset", class) }
	cases := []struct {
		name              string
		err               error
		transient, resend bool
	}{
		{"nil", nil, false, false},
		{"transport", wrap(sandbox.ErrTransport), true, true},
		{"timeout", wrap(sandbox.ErrTimeout), true, true},
		{"setup", wrap(sandbox.ErrSetup), true, true},
		{"busy binary", fmt.Errorf("run ngsup stop in sb-1: %w: /bin/ngsup", ErrBusy), true, true},
		{"gone", wrap(sandbox.ErrGone), false, false},
		{"gone over transport", errors.Join(wrap(sandbox.ErrTransport), sandbox.ErrGone), false, false},
		{"cancelled transport", errors.Join(wrap(sandbox.ErrTransport), context.Canceled), false, false},
		{"not found", wrap(sandbox.ErrNotFound), false, false},
		{"the old text without its class", errors.New("exec in sb-1: the sandbox's mount namespace could not be set up"), false, false},
		{"cut answer", fmt.Errorf("ngsup status in sb-1 exited 0 and %w: 3 bytes", ErrBadOutput), false, true},
	}
	for _, c := range cases {
		if got := transient(c.err); got != c.transient {
			t.Errorf("%s: transient(%v) = %v, want %v", c.name, c.err, got, c.transient)
		}
		if got := resend(c.err); got != c.resend {
			t.Errorf("%s: resend(%v) = %v, want %v", c.name, c.err, got, c.resend)
		}
	}
}

// TestPauseCauses proves that each way a pause can fail is named by the
// sentinel judgePause wraps (not by its message): exit 4 is not_confirmed
// whatever else went wrong, an empty answer within the budget no_output,
// the rest exec_error; and that only an empty answer is run again.
func TestPauseCauses(t *testing.T) {
	n := &Ngsup{Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ref := Ref{ID: "l1", Dir: "/r/launches/l1"}
	cases := []struct {
		name  string
		a     pauseAnswer
		cause string
		sent  error // the sentinel Err wraps, if any
		again bool
	}{
		{"paused", pauseAnswer{code: proto.ExitOK, result: proto.PauseResult{Paused: true}}, "", nil, false},
		{"ended", pauseAnswer{code: proto.ExitEnded}, "ended", nil, false},
		{"not confirmed", pauseAnswer{code: proto.ExitNotConfirmed, result: proto.PauseResult{Error: "D state"}}, "not_confirmed", ErrNotConfirmed, false},
		{"not confirmed, cut answer", pauseAnswer{code: proto.ExitNotConfirmed, err: fmt.Errorf("ngsup pause in sb-1 %w", ErrBadOutput)}, "not_confirmed", ErrNotConfirmed, false},
		{"not confirmed, printed nothing", pauseAnswer{code: proto.ExitNotConfirmed, empty: true}, "not_confirmed", ErrNoOutput, true},
		{"printed nothing", pauseAnswer{code: proto.ExitOK, empty: true, stderr: "no message"}, "no_output", ErrNoOutput, true},
		{"printed nothing, out of budget", pauseAnswer{code: proto.ExitOK, empty: true, took: ControlTimeout}, "exec_error", nil, true},
		{"exec error", pauseAnswer{code: -1, err: fmt.Errorf("run ngsup pause in sb-1: %w", sandbox.ErrTimeout)}, "exec_error", sandbox.ErrTimeout, false},
		{"usage error", pauseAnswer{code: 2, stderr: "no launch folder"}, "exec_error", nil, false},
	}
	for _, c := range cases {
		var out PauseOutcome
		_, again := n.judgePause(context.Background(), &out, c.a, ref, "r1")
		if got := out.Cause(); got != c.cause {
			t.Errorf("%s: cause %q, want %q (err %v)", c.name, got, c.cause, out.Err)
		}
		if c.sent != nil && !errors.Is(out.Err, c.sent) {
			t.Errorf("%s: err %v does not wrap %v", c.name, out.Err, c.sent)
		}
		if again != c.again {
			t.Errorf("%s: again %v, want %v", c.name, again, c.again)
		}
	}
}

// scripted is a sandbox whose execs answer from a script, by call; it
// records every argv. ngsup is taken as already uploaded.
type scripted struct {
	mu    sync.Mutex
	calls [][]string
	exec  func(call int, req sandbox.ExecRequest) (sandbox.ExecResult, error)
}

func (s *scripted) ID() string      { return "sb-1" }
func (s *scripted) Root() string    { return "/r" }
func (s *scripted) Workdir() string { return "/w" }
func (s *scripted) Upload(context.Context, string, []byte, uint32) error {
	return errors.New("no upload in this test")
}
func (s *scripted) Exec(_ context.Context, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	s.mu.Lock()
	s.calls = append(s.calls, slices.Clone(req.Argv))
	call := len(s.calls)
	s.mu.Unlock()
	return s.exec(call, req)
}

func (s *scripted) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.calls)
}

const bin = "/r/bin/ngsup-0123456789abcdef"

// uploaded is an Ngsup that takes ngsup as already in sb-1.
func uploaded() *Ngsup {
	return &Ngsup{Log: slog.New(slog.NewTextHandler(io.Discard, nil)), uploaded: map[string]string{"sb-1": bin}}
}

func ok(stdout string) (sandbox.ExecResult, error) {
	return sandbox.ExecResult{Stdout: []byte(stdout)}, nil
}

// TestVerbResentByClass proves which failures of a verb that is safe to
// send again are sent again (a transport error, a busy binary, a cut
// answer), which end it at once (a sandbox that is gone), and that a pause
// is never sent again after an exec error.
func TestVerbResentByClass(t *testing.T) {
	receipt := `{"id":"l1","ended":true,"exit_code":0}`
	cases := []struct {
		name  string
		first func() (sandbox.ExecResult, error)
		verb  string
		calls int
		class error // what the error wraps; nil: it succeeds
	}{
		{"transport", func() (sandbox.ExecResult, error) {
			return sandbox.ExecResult{}, fmt.Errorf("exec in sb-1: %w: reset", sandbox.ErrTransport)
		}, "status", 2, nil},
		{"busy", func() (sandbox.ExecResult, error) {
			return sandbox.ExecResult{ExitCode: 126, Stderr: []byte("sh: ngsup: Text file busy")}, nil
		}, "status", 2, nil},
		{"cut answer", func() (sandbox.ExecResult, error) { return ok(`{"id":"l1","en`) }, "status", 2, nil},
		{"gone", func() (sandbox.ExecResult, error) {
			return sandbox.ExecResult{}, fmt.Errorf("exec in sb-1: %w", sandbox.ErrGone)
		}, "status", 1, sandbox.ErrGone},
		{"pause after a timeout", func() (sandbox.ExecResult, error) {
			return sandbox.ExecResult{}, fmt.Errorf("exec in sb-1: %w", sandbox.ErrTimeout)
		}, "pause", 1, sandbox.ErrTimeout},
	}
	for _, c := range cases {
		sb := &scripted{exec: func(call int, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
			if call == 1 {
				return c.first()
			}
			return ok(receipt)
		}}
		var r proto.Receipt
		_, _, err := uploaded().verb(context.Background(), sb, bin, time.Minute, &r, c.verb, "--dir", "/r/launches/l1")
		if sb.count() != c.calls {
			t.Errorf("%s: %d execs, want %d", c.name, sb.count(), c.calls)
		}
		switch {
		case c.class == nil && err != nil:
			t.Errorf("%s: %v, want the receipt", c.name, err)
		case c.class == nil && r.ID != "l1":
			t.Errorf("%s: receipt %+v, want l1's", c.name, r)
		case c.class != nil && !errors.Is(err, c.class):
			t.Errorf("%s: %v, want an error wrapping %v", c.name, err, c.class)
		case c.class != nil && !strings.Contains(err.Error(), "ngsup "+c.verb+" in sb-1"):
			t.Errorf("%s: %q does not name the verb and the sandbox", c.name, err)
		}
	}
}

// TestSupervisedStartFallsBackOnlyWhenItCan proves that a supervised start
// that fails while the sandbox is there says ErrNoSupervisor (the caller
// may launch tagged only), and that one whose sandbox is gone, or whose
// caller went away, does not.
func TestSupervisedStartFallsBackOnlyWhenItCan(t *testing.T) {
	ref := Ref{ID: "l1", Dir: "/r/launches/l1"}
	spec := harness.LaunchSpec{Argv: []string{"harness"}}
	refused := func(int, sandbox.ExecRequest) (sandbox.ExecResult, error) {
		return sandbox.ExecResult{ExitCode: 1, Stderr: []byte("ngsup: cannot become a subreaper")}, nil
	}
	gone := func(int, sandbox.ExecRequest) (sandbox.ExecResult, error) {
		return sandbox.ExecResult{}, fmt.Errorf("exec in sb-1: %w", sandbox.ErrGone)
	}
	l := uploaded().Launcher(true)
	err := l.Start(context.Background(), &scripted{exec: refused}, ref, spec)
	if !errors.Is(err, ErrNoSupervisor) || !errors.Is(err, ErrLaunch) || !strings.Contains(err.Error(), "subreaper") {
		t.Errorf("a refused ngsup run: %v, want ErrNoSupervisor and ErrLaunch with ngsup's reason", err)
	}
	if err := l.Start(context.Background(), &scripted{exec: gone}, ref, spec); !errors.Is(err, sandbox.ErrGone) || errors.Is(err, ErrNoSupervisor) {
		t.Errorf("a gone sandbox: %v, want ErrGone and no fallback", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := l.Start(ctx, &scripted{exec: refused}, ref, spec); err == nil || errors.Is(err, ErrNoSupervisor) {
		t.Errorf("a cancelled start: %v, want an error and no fallback", err)
	}
}

// TestLaunchersNameLaunchesTheirWay proves that the tag-only launcher names
// the launch by --id in every control verb and keeps no receipt, and that
// the supervised one names it by its folder alone.
func TestLaunchersNameLaunchesTheirWay(t *testing.T) {
	ref := Ref{ID: "l1", Dir: "/r/launches/l1"}
	for _, supervised := range []bool{true, false} {
		sb := &scripted{exec: func(_ int, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
			switch req.Argv[1] {
			case "pause":
				return ok(`{"paused":true,"processes":1}`)
			case "continue":
				return ok(`{"continued":1}`)
			}
			return ok(`{"ended":true}`)
		}}
		l := uploaded().Launcher(supervised)
		if l.Supervised() != supervised {
			t.Errorf("Launcher(%v).Supervised() = %v", supervised, l.Supervised())
		}
		if out := l.Pause(context.Background(), sb, ref, "r1"); !out.Paused() {
			t.Errorf("supervised %v: pause %+v, want paused", supervised, out)
		}
		if _, err := l.Continue(context.Background(), sb, ref); err != nil {
			t.Errorf("supervised %v: continue: %v", supervised, err)
		}
		if _, err := l.Stop(context.Background(), sb, ref, time.Second); err != nil {
			t.Errorf("supervised %v: stop: %v", supervised, err)
		}
		for _, argv := range sb.calls {
			if byID := slices.Contains(argv, "--id"); byID == supervised {
				t.Errorf("supervised %v: %v names the launch by --id: %v", supervised, argv, byID)
			}
		}
		_, err := l.Status(context.Background(), sb, ref)
		if supervised == errors.Is(err, ErrNoReceipt) {
			t.Errorf("supervised %v: status: %v", supervised, err)
		}
	}
}
