package driver_test

// The Runner's use of launch control, with fake launchers: no process, no
// ngsup, no sandbox runs here. What these tests prove is what the Runner
// does with each answer a Launcher can give.

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/drivertest"
	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/driver/launch"
	"github.com/ngharness/ngharness/pkg/driver/owner"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/harness"
	"github.com/ngharness/ngharness/pkg/proto"
)

// fakeLaunches is a pair of fake launchers (supervised, tag-only) that
// record every call, in order, as "<kind> <verb> <launch id>".
type fakeLaunches struct {
	mu    sync.Mutex
	calls []string
	ends  map[string]chan struct{} // closed when the launch ends
	// waiting gets the id of a launch whose Wait began.
	waiting chan string
	// startSupervised, if set, is what a supervised start returns.
	startSupervised error
	// pause answers a pause of the nth launch (1-based).
	pause func(f *fakeLaunches, n int, ref launch.Ref) launch.PauseOutcome
	// endAtStart: launches after the first end as soon as they start.
	endAtStart bool
	starts     int
}

func newFakeLaunches() *fakeLaunches {
	return &fakeLaunches{ends: map[string]chan struct{}{}, waiting: make(chan string, 16)}
}

func (f *fakeLaunches) Launcher(supervised bool) launch.Launcher {
	return fakeLauncher{f: f, supervised: supervised}
}

func (f *fakeLaunches) StopSandbox(context.Context, sandbox.Sandbox) error {
	f.record("any stop-sandbox -")
	return nil
}

func (f *fakeLaunches) record(call string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call)
}

// called returns the calls made so far.
func (f *fakeLaunches) called() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

// end makes the launch's Wait return that it ended (exit code 0); a
// launch never started is recorded as a call, for the test to report.
func (f *fakeLaunches) end(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.ends[id]
	if !ok {
		f.calls = append(f.calls, "test end-unknown "+id)
		return
	}
	select {
	case <-c:
	default:
		close(c)
	}
}

type fakeLauncher struct {
	f          *fakeLaunches
	supervised bool
}

func (l fakeLauncher) kind() string {
	if l.supervised {
		return "supervised"
	}
	return "tag-only"
}

func (l fakeLauncher) Supervised() bool { return l.supervised }

func (l fakeLauncher) Prepare(context.Context, sandbox.Sandbox) error { return nil }

func (l fakeLauncher) Start(_ context.Context, _ sandbox.Sandbox, ref launch.Ref, _ harness.LaunchSpec) error {
	f := l.f
	f.record(l.kind() + " start " + ref.ID)
	if l.supervised && f.startSupervised != nil {
		return f.startSupervised
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.starts++
	f.ends[ref.ID] = make(chan struct{})
	if f.endAtStart && f.starts > 1 {
		close(f.ends[ref.ID])
	}
	return nil
}

func (l fakeLauncher) Wait(ctx context.Context, _ sandbox.Sandbox, ref launch.Ref, _ time.Duration) (*proto.Receipt, bool, error) {
	f := l.f
	f.mu.Lock()
	ended := f.ends[ref.ID]
	f.mu.Unlock()
	select {
	case f.waiting <- ref.ID:
	default:
	}
	select {
	case <-ended:
		return &proto.Receipt{ID: ref.ID, Ended: true}, true, nil
	case <-ctx.Done():
		return nil, false, ctx.Err()
	}
}

func (l fakeLauncher) Status(context.Context, sandbox.Sandbox, launch.Ref) (*proto.Receipt, error) {
	return nil, launch.ErrNoReceipt
}

func (l fakeLauncher) Pause(_ context.Context, _ sandbox.Sandbox, ref launch.Ref, _ string) launch.PauseOutcome {
	f := l.f
	f.record(l.kind() + " pause " + ref.ID)
	f.mu.Lock()
	n := f.starts
	f.mu.Unlock()
	return f.pause(f, n, ref)
}

func (l fakeLauncher) Continue(_ context.Context, _ sandbox.Sandbox, ref launch.Ref) (proto.ContinueResult, error) {
	l.f.record(l.kind() + " continue " + ref.ID)
	return proto.ContinueResult{}, nil
}

func (l fakeLauncher) Stop(_ context.Context, _ sandbox.Sandbox, ref launch.Ref, _ time.Duration) (proto.StopResult, error) {
	l.f.record(l.kind() + " stop " + ref.ID)
	l.f.end(ref.ID)
	return proto.StopResult{Stopped: true}, nil
}

func (l fakeLauncher) Output(context.Context, sandbox.Sandbox, launch.Ref) ([]byte, []byte, error) {
	return []byte("done\n"), nil, nil
}

// memOwner is an owner that lends the one sandbox "sb-1" and verifies
// every run with reward 1.
type memOwner struct{}

func (memOwner) SeedSession(context.Context, string, json.RawMessage) (owner.SeedReply, error) {
	return owner.SeedReply{Cookies: owner.Cookies{"session": "s1"}}, nil
}

func (memOwner) SandboxAccess(context.Context, string, owner.Cookies) (owner.Access, error) {
	var a owner.Access
	a.Connection.Descriptor = sandbox.Descriptor{Provider: "mem", SandboxID: "sb-1", Workdir: "/work"}
	return a, nil
}

func (memOwner) Verify(context.Context, string, owner.Cookies, json.RawMessage) (owner.VerifyReply, error) {
	return owner.VerifyReply{Reward: 1}, nil
}

func (memOwner) CloseSession(context.Context, string, owner.Cookies) error { return nil }

// memBackend connects to plainSandbox, in which nothing runs.
type memBackend struct{}

func (memBackend) Name() string { return "mem" }
func (memBackend) Connect(context.Context, sandbox.Descriptor) (sandbox.Sandbox, error) {
	return plainSandbox{}, nil
}

// plainSandbox has no capability beyond Sandbox.
type plainSandbox struct{}

func (plainSandbox) ID() string { return "plain" }
func (plainSandbox) Exec(context.Context, sandbox.ExecRequest) (sandbox.ExecResult, error) {
	return sandbox.ExecResult{}, nil
}
func (plainSandbox) Upload(context.Context, string, []byte, uint32) error { return nil }
func (plainSandbox) Root() string                                         { return "/root" }
func (plainSandbox) Workdir() string                                      { return "/work" }

// memAdapter is an adapter whose harness pauses at checkpoints and whose
// saved session can always be continued.
type memAdapter struct{}

func (memAdapter) Name() string { return "fake" }
func (memAdapter) NewState(string, int, harness.LentSandbox) (json.RawMessage, error) {
	return json.RawMessage(`{}`), nil
}
func (memAdapter) ResumeDecision(context.Context, harness.LentSandbox, json.RawMessage, string, int) (harness.Decision, error) {
	return harness.Decision{Resume: true, Reason: "saved session"}, nil
}
func (memAdapter) Launch(context.Context, harness.LaunchContext) (harness.LaunchSpec, error) {
	return harness.LaunchSpec{Argv: []string{"harness"}}, nil
}
func (memAdapter) Response(context.Context, harness.LentSandbox, json.RawMessage, harness.HarnessResult) (json.RawMessage, error) {
	return json.RawMessage(`{"text":"done"}`), nil
}
func (memAdapter) PausesAtCheckpoints() bool { return true }

// pauseCauses records the causes the Runner reports for its pauses.
type pauseCauses struct {
	mu     sync.Mutex
	causes []string
}

func (o *pauseCauses) LaunchEnded(driver.Outcome) {}
func (o *pauseCauses) Paused(_ time.Duration, ok bool, cause string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.causes = append(o.causes, fmt.Sprintf("%v:%s", ok, cause))
}
func (o *pauseCauses) Continued(time.Duration, bool, string) {}
func (o *pauseCauses) Relaunched(bool)                       {}

func (o *pauseCauses) got() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.causes...)
}

// fakeRun runs one rollout through a Runner with the fake launchers; when
// checkpoint is set, one checkpoint is prepared once the first launch is
// being followed, then resumed. It returns the result.
func fakeRun(t *testing.T, f *fakeLaunches, obs *pauseCauses, rollout string, checkpoint bool) drivertest.Result {
	t.Helper()
	p := drivertest.NewParticipant()
	rn := &driver.Runner{Adapter: memAdapter{}, Owner: memOwner{}, Backends: map[string]sandbox.Backend{"mem": memBackend{}},
		Launchers: f, Participant: p, Observer: obs}
	ctx, cancel := context.WithTimeout(context.Background(), drivertest.Patience)
	defer cancel()
	type ran struct {
		raw json.RawMessage
		err error
	}
	done := make(chan ran, 1)
	go func() {
		raw, err := rn.Run(ctx, driver.RunRequest{RolloutID: rollout, Attempt: 1, Body: json.RawMessage(`{"task":"x"}`)})
		done <- ran{raw, err}
	}()
	if checkpoint {
		select {
		case <-f.waiting:
		case r := <-done:
			t.Fatalf("the run ended before its launch was followed: %v", r.err)
		}
		prepare(t, p, "ckpt-1")
		resume(t, p, "ckpt-1")
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("run %s: %v (calls %v)", rollout, r.err, f.called())
	}
	return drivertest.ParseResult(t, r.raw)
}

// TestRunnerKeepsTheResultOfALaunchThatEndedAsItWasPaused proves that a
// pause answering that the launch had already ended keeps its result: the
// launch is followed to its end, not stopped and not relaunched, the
// pause is reported with the cause "ended", and the run finishes with its
// one launch.
func TestRunnerKeepsTheResultOfALaunchThatEndedAsItWasPaused(t *testing.T) {
	t.Parallel()
	f := newFakeLaunches()
	f.endAtStart = true // a relaunch, which must not come, ends at once
	f.pause = func(f *fakeLaunches, _ int, ref launch.Ref) launch.PauseOutcome {
		f.end(ref.ID) // it ended just as the pause came
		return launch.PauseOutcome{Code: proto.ExitEnded, Attempts: 1}
	}
	obs := &pauseCauses{}
	ro := "fake-ended"
	r := fakeRun(t, f, obs, ro, true)
	id := driver.LaunchID(ro, 1, 1, "plain")
	if got, want := strings.Join(f.called(), "; "), "supervised start "+id+"; supervised pause "+id; got != want {
		t.Errorf("launch calls: %s\nwant: %s", got, want)
	}
	if len(r.Launches) != 1 {
		t.Fatalf("want one launch, got %+v", r.Launches)
	}
	if l := r.Launches[0]; l.Outcome != driver.OutcomeFinished || l.Pauses != 0 || !l.Supervised || l.ExitCode != 0 {
		t.Errorf("the launch record %+v, want finished, supervised, exit 0, no pause", l)
	}
	if got := obs.got(); len(got) != 1 || got[0] != "false:ended" {
		t.Errorf("pauses observed %v, want one, not ok, cause ended", got)
	}
}

// TestRunnerStopsAndRelaunchesWhenAPauseIsNotConfirmed proves that a pause
// ngsup could not confirm (its error wraps launch.ErrNotConfirmed) falls
// back to the stop, with the same launcher, and the run relaunches on its
// saved session after the checkpoint; the pause is reported as
// not_confirmed and the first launch's record says why it was interrupted.
func TestRunnerStopsAndRelaunchesWhenAPauseIsNotConfirmed(t *testing.T) {
	t.Parallel()
	f := newFakeLaunches()
	f.endAtStart = true
	f.pause = func(_ *fakeLaunches, _ int, _ launch.Ref) launch.PauseOutcome {
		return launch.PauseOutcome{Code: proto.ExitNotConfirmed, Attempts: 1,
			Err: fmt.Errorf("pause %w: 1 process in D state", launch.ErrNotConfirmed)}
	}
	obs := &pauseCauses{}
	ro := "fake-unconfirmed"
	r := fakeRun(t, f, obs, ro, true)
	first, second := driver.LaunchID(ro, 1, 1, "plain"), driver.LaunchID(ro, 1, 2, "plain")
	want := []string{"supervised start " + first, "supervised pause " + first, "supervised stop " + first, "supervised start " + second}
	if got := f.called(); strings.Join(got, "; ") != strings.Join(want, "; ") {
		t.Errorf("launch calls: %v\nwant: %v", got, want)
	}
	if len(r.Launches) != 2 {
		t.Fatalf("want two launches, got %+v", r.Launches)
	}
	if l := r.Launches[0]; l.Outcome != driver.OutcomeInterrupted || !strings.Contains(l.Error, "pause not confirmed") {
		t.Errorf("the first launch %+v, want interrupted because its pause was not confirmed", l)
	}
	if l := r.Launches[1]; l.Outcome != driver.OutcomeFinished || !l.Resumed {
		t.Errorf("the second launch %+v, want finished on the saved session", l)
	}
	if got := obs.got(); len(got) != 1 || got[0] != "false:not_confirmed" {
		t.Errorf("pauses observed %v, want one, not ok, cause not_confirmed", got)
	}
}

// TestRunnerFallsBackToTagOnlyOnce proves that a supervised start that
// says launch.ErrNoSupervisor is followed by one tag-only start, and that
// the tag-only launcher then controls the launch to its end (its record
// says unsupervised); without that sentinel the run fails with no second
// start.
func TestRunnerFallsBackToTagOnlyOnce(t *testing.T) {
	t.Parallel()
	f := newFakeLaunches()
	f.startSupervised = fmt.Errorf("%w: %w: ngsup run in sb-1 exited 1: cannot become a subreaper", launch.ErrNoSupervisor, launch.ErrLaunch)
	ro := "fake-fallback"
	id := driver.LaunchID(ro, 1, 1, "plain")
	go func() { f.end(<-f.waiting) }()
	r := fakeRun(t, f, &pauseCauses{}, ro, false)
	if got, want := strings.Join(f.called(), "; "), "supervised start "+id+"; tag-only start "+id; got != want {
		t.Errorf("launch calls: %s\nwant: %s", got, want)
	}
	if len(r.Launches) != 1 || r.Launches[0].Supervised || r.Launches[0].Outcome != driver.OutcomeFinished {
		t.Errorf("launches %+v, want one finished tag-only launch", r.Launches)
	}

	f = newFakeLaunches()
	f.startSupervised = fmt.Errorf("%w: ngsup run in sb-1: %w", launch.ErrLaunch, sandbox.ErrGone)
	rn := &driver.Runner{Adapter: memAdapter{}, Owner: memOwner{}, Backends: map[string]sandbox.Backend{"mem": memBackend{}},
		Launchers: f, Participant: drivertest.NewParticipant()}
	_, err := rn.Run(context.Background(), driver.RunRequest{RolloutID: "fake-gone", Attempt: 1, Body: json.RawMessage(`{}`)})
	if err == nil || len(f.called()) != 1 {
		t.Errorf("a start in a gone sandbox: %v, calls %v; want the run failed after one start", err, f.called())
	}
}
