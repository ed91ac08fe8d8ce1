package memsandbox

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/fake"
	"github.com/ngharness/ngharness/pkg/driver/launch"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/harness"
	"github.com/ngharness/ngharness/pkg/proto"
)

// TestExecErrorClasses: the error classes of the backend contract.
func TestExecErrorClasses(t *testing.T) {
	s := New(Options{})
	ctx := context.Background()
	sb, err := s.Create(ctx, "sb-1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Exec(ctx, sandbox.ExecRequest{}); err == nil {
		t.Errorf("an empty argv was accepted")
	}
	if _, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"uname", "-m"}, Env: map[string]string{"A B": "x"}}); err == nil {
		t.Errorf("an environment key with a space was accepted")
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := sb.Exec(cctx, sandbox.ExecRequest{Argv: []string{"uname", "-m"}}); !errors.Is(err, context.Canceled) {
		t.Errorf("exec with a cancelled context: %v", err)
	}
	res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"no-such-command"}})
	if err != nil || res.ExitCode != 127 || s.Stats().Unknown != 1 {
		t.Errorf("an unknown command: %+v %v, unknown %d", res, err, s.Stats().Unknown)
	}
	if _, err := s.Connect(ctx, sandbox.Descriptor{Provider: Name, SandboxID: "sb-unknown"}); !errors.Is(err, sandbox.ErrGone) {
		t.Errorf("connect to a sandbox never made: %v", err)
	}
	if err := s.Remove(ctx, "sb-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"uname", "-m"}}); !errors.Is(err, sandbox.ErrGone) {
		t.Errorf("exec in a removed sandbox: %v", err)
	}
	if _, err := s.Open(ctx, "sb-1"); !errors.Is(err, sandbox.ErrGone) {
		t.Errorf("open a removed sandbox: %v", err)
	}
}

// world is a memory sandbox and the driver's launch layer over it, with
// the fake adapter's launch spec.
type world struct {
	svc *Service
	sb  sandbox.Sandbox
	ng  *launch.Ngsup
}

func newWorld(t *testing.T) *world {
	bin := filepath.Join(t.TempDir(), "ngsup-linux-amd64")
	if err := os.WriteFile(bin, []byte("not ngsup: the memory sandbox answers for it"), 0o755); err != nil {
		t.Fatal(err)
	}
	svc := New(Options{Adopt: true})
	sb, err := svc.Connect(context.Background(), sandbox.Descriptor{Provider: Name, SandboxID: "sb-a"})
	if err != nil {
		t.Fatal(err)
	}
	return &world{svc: svc, sb: sb, ng: &launch.Ngsup{Binaries: map[string]string{"amd64": bin}}}
}

// start launches the fake harness as the driver does: the adapter's spec,
// started by the supervised launcher.
func (w *world) start(t *testing.T, id string, steps int, stepS float64) launch.Ref {
	t.Helper()
	ctx := context.Background()
	ad := &fake.Adapter{Pause: true}
	lsb := harness.LentSandbox{Sandbox: w.sb}
	state, err := ad.NewState(id, 0, lsb)
	if err != nil {
		t.Fatal(err)
	}
	input, _ := json.Marshal(map[string]any{"task": "memory " + id, "fake": map[string]any{"steps": steps, "step_s": stepS}})
	spec, err := ad.Launch(ctx, harness.LaunchContext{Sandbox: lsb, State: state, Input: input})
	if err != nil {
		t.Fatal(err)
	}
	l := w.ng.Launcher(true)
	if err := l.Prepare(ctx, w.sb); err != nil {
		t.Fatal(err)
	}
	ref := launch.Ref{ID: id, Dir: RootDir + "/launches/" + id, SandboxID: w.sb.ID(), Supervised: true}
	if err := l.Start(ctx, w.sb, ref, spec); err != nil {
		t.Fatal(err)
	}
	return ref
}

func (w *world) steps(t *testing.T) int {
	t.Helper()
	res, err := w.sb.Exec(context.Background(), sandbox.ExecRequest{Argv: []string{"cat", WorkDir + "/progress"}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("read progress: %+v %v", res, err)
	}
	return strings.Count(string(res.Stdout), "\n")
}

// TestLaunchRunsPausesContinuesAndEnds: through the driver's own launch
// layer (ngsup's verbs as launch.Ngsup sends and reads them), a launch of
// the fake harness starts, holds its progress while paused, continues,
// ends with the harness's summary as its output, and every command the
// layer sent was understood.
func TestLaunchRunsPausesContinuesAndEnds(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	ref := w.start(t, "r-1", 4, 0.02)
	l := w.ng.Launcher(true)
	if r, err := l.Status(ctx, w.sb, ref); err != nil || r.ID != "r-1" || r.Ended {
		t.Fatalf("status after the start: %+v %v", r, err)
	}
	out := l.Pause(ctx, w.sb, ref, "r-1")
	if !out.Paused() || out.Result.Processes != processes {
		t.Fatalf("pause: %+v", out)
	}
	held := w.steps(t)
	time.Sleep(100 * time.Millisecond) // five steps' time, paused
	if got := w.steps(t); got != held {
		t.Fatalf("%d steps while paused, %d at the pause", got, held)
	}
	if _, ended, err := l.Wait(ctx, w.sb, ref, 10*time.Millisecond); err != nil || ended {
		t.Fatalf("a paused launch's wait: ended %v, %v", ended, err)
	}
	if r, err := l.Continue(ctx, w.sb, ref); err != nil || r.Continued != processes {
		t.Fatalf("continue: %+v %v", r, err)
	}
	r, ended, err := l.Wait(ctx, w.sb, ref, time.Minute)
	if err != nil || !ended || r.ExitCode != 0 {
		t.Fatalf("wait for the end: %+v %v %v", r, ended, err)
	}
	if got := w.steps(t); got != 4 {
		t.Fatalf("%d steps at the end, want 4", got)
	}
	stdout, _, err := l.Output(ctx, w.sb, ref)
	if err != nil || !strings.Contains(string(stdout), `"done after 4 steps"`) {
		t.Fatalf("output: %q %v", stdout, err)
	}
	if out := l.Pause(ctx, w.sb, ref, "r-1"); !out.Ended() {
		t.Fatalf("pause of an ended launch: %+v", out)
	}
	if st := w.svc.Stats(); st.Unknown != 0 || st.Ended != 1 {
		t.Fatalf("stats: %+v", st)
	}
}

// TestPauseSeveralDirsAndStop: pause with several --dir prints a line per
// folder with its own code, as ngsup does; stop ends a running launch,
// which a relaunch then continues from its session's steps.
func TestPauseSeveralDirsAndStop(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	a := w.start(t, "r-a", 1000, 1)
	b := w.start(t, "r-b", 1000, 1)
	bin, err := w.ng.Ensure(ctx, w.sb)
	if err != nil {
		t.Fatal(err)
	}
	res, err := w.sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{bin, "pause", "--dir", a.Dir, "--dir", b.Dir, "--dir", RootDir + "/launches/none"}})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(res.Stdout)), "\n")
	if len(lines) != 3 || res.ExitCode != proto.ExitUsage {
		t.Fatalf("pause of three folders: exit %d, %q", res.ExitCode, res.Stdout)
	}
	for i, want := range []struct {
		dir  string
		code int
	}{{a.Dir, 0}, {b.Dir, 0}, {RootDir + "/launches/none", proto.ExitUsage}} {
		var pl proto.PauseLine
		if err := json.Unmarshal([]byte(lines[i]), &pl); err != nil || pl.Dir != want.dir || pl.Code != want.code {
			t.Errorf("line %d: %q (%v), want dir %s code %d", i, lines[i], err, want.dir, want.code)
		}
	}
	l := w.ng.Launcher(true)
	sr, err := l.Stop(ctx, w.sb, a, time.Second)
	if err != nil || !sr.Stopped || sr.Interrupted != processes {
		t.Fatalf("stop: %+v %v", sr, err)
	}
	r, err := l.Status(ctx, w.sb, a)
	if err != nil || !r.Ended || r.ExitCode != 130 {
		t.Fatalf("status after the stop: %+v %v", r, err)
	}
	if err := w.ng.StopSandbox(ctx, w.sb); err != nil {
		t.Fatalf("stop the sandbox: %v", err)
	}
	if r, err := l.Status(ctx, w.sb, b); err != nil || !r.Ended {
		t.Fatalf("the second launch after the sandbox's stop: %+v %v", r, err)
	}
	if st := w.svc.Stats(); st.Unknown != 0 {
		t.Fatalf("commands not understood: %+v", st)
	}
}

// TestFinishAll: every running or paused launch finishes at once, with
// the steps it had done, and its wait says so.
func TestFinishAll(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	a := w.start(t, "r-a", 1000, 100)
	b := w.start(t, "r-b", 1000, 100)
	l := w.ng.Launcher(true)
	if out := l.Pause(ctx, w.sb, b, "r-b"); !out.Paused() {
		t.Fatalf("pause: %+v", out)
	}
	if n := w.svc.FinishAll(); n != 2 {
		t.Fatalf("FinishAll finished %d launches, want 2", n)
	}
	for _, ref := range []launch.Ref{a, b} {
		r, ended, err := l.Wait(ctx, w.sb, ref, time.Minute)
		if err != nil || !ended || r.ExitCode != 0 {
			t.Fatalf("wait for %s: %+v %v %v", ref.ID, r, ended, err)
		}
	}
}
