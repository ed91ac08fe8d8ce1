package opensandbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	fakeexecd "github.com/ngharness/ngharness/internal/fake/execd"
	"github.com/ngharness/ngharness/internal/proctest"
	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/opensandbox"
)

// The tests of this file hold the backend to what the real lifecycle
// server does (issue 19; the list of it in docs/driver.md, "OpenSandbox"),
// as the fake OpenSandbox reproduces it.

// TestCreateWaitsUntilExecdAnswers proves a sandbox is ready when its
// execd answers, not when the server says Running: with connections to
// execd accepted and dropped for a second after the create said Running,
// Create (whose first exec makes the folders) and Fork succeed, and the
// connections the backend's pings met in the window were dropped, not
// sent an exec.
func TestCreateWaitsUntilExecdAnswers(t *testing.T) {
	t.Parallel()
	f := newFixtureWith(t, fakeexecd.Options{ListenAfter: time.Second, SnapshotWork: 50 * time.Millisecond}, opensandbox.Options{})
	ctx := context.Background()
	sb, err := f.b.Create(ctx, "window")
	if err != nil {
		t.Fatalf("create through the window: %v", err)
	}
	if n := f.srv.Dropped(sb.ID()); n == 0 {
		t.Errorf("no connection was dropped: the window was not met")
	}
	if _, err := os.Stat(f.host(sb, "/sandbox/work")); err != nil {
		t.Errorf("the workdir was not made: %v", err)
	}
	if cmds := f.srv.Commands(sb.ID()); len(cmds) != 1 {
		t.Errorf("execd ran %d commands, want the one mkdir: %q", len(cmds), cmds)
	}
	snap, err := f.b.Snapshot(ctx, sb.ID(), "window")
	if err != nil {
		t.Fatal(err)
	}
	fork, err := f.b.Fork(ctx, snap, "window-fork")
	if err != nil {
		t.Fatalf("fork through the window: %v", err)
	}
	if res := run(t, fork, sandbox.ExecRequest{Argv: []string{"true"}}); res.ExitCode != 0 {
		t.Errorf("exec in the fork: %+v", res)
	}
}

// TestFailedIsGone proves the one rule for a sandbox that is gone: in the
// Failed window of a delete (the container killed, not yet removed: GET
// answers 200 Failed, execd's port accepts and drops), an exec, an
// upload, an open and a snapshot are all sandbox.ErrGone naming it, as
// after the 404.
func TestFailedIsGone(t *testing.T) {
	t.Parallel()
	f := newFixtureWith(t, fakeexecd.Options{FailedFor: 5 * time.Second}, opensandbox.Options{})
	ctx := context.Background()
	sb := f.create("failed")
	deleted := make(chan error, 1)
	go func() { deleted <- f.srv.Delete(sb.ID()) }()
	testkit.Eventually(t, "the sandbox to say Failed", func() (bool, string) { return f.srv.State(sb.ID()) == opensandbox.StateFailed, "" })
	_, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}})
	if !errors.Is(err, sandbox.ErrGone) || !strings.Contains(err.Error(), sb.ID()) {
		t.Errorf("exec in a Failed sandbox: %v, want ErrGone naming %s", err, sb.ID())
	}
	if err := sb.Upload(ctx, "/sandbox/work/x", []byte("x"), 0o644); !errors.Is(err, sandbox.ErrGone) {
		t.Errorf("upload to a Failed sandbox: %v, want ErrGone", err)
	}
	if _, err := f.b.Open(ctx, sb.ID()); !errors.Is(err, sandbox.ErrGone) {
		t.Errorf("open a Failed sandbox: %v, want ErrGone", err)
	}
	if _, err := f.b.Snapshot(ctx, sb.ID(), "late"); !errors.Is(err, sandbox.ErrGone) {
		t.Errorf("snapshot a Failed sandbox: %v, want ErrGone", err)
	}
	if f.srv.State(sb.ID()) != opensandbox.StateFailed {
		t.Fatalf("the Failed window ended before the checks: they may have met the 404")
	}
	if err := <-deleted; err != nil {
		t.Fatal(err)
	}
}

// TestExecStreamEndsWithoutItsFinalEvent proves a stream that ends
// cleanly without execution_complete or error is neither the command's
// failure nor its success: the exec returns what the command did, from
// the report lines already sent (the stream ended just before the final
// event) or from the report the script keeps (the stream ended right
// after init, the command going on), and leaves no file behind but the
// last exec's report, which the next exec removes.
func TestExecStreamEndsWithoutItsFinalEvent(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	sb := f.create("no-final")
	for _, when := range []fakeexecd.DropPoint{fakeexecd.DropAfterInit, fakeexecd.DropBeforeEnd} {
		word := []string{"after-init", "before-end"}[when]
		f.srv.EndStreams(func(c string) bool { return strings.Contains(c, word) }, 1, when)
		res, err := sb.Exec(context.Background(), sandbox.ExecRequest{Argv: []string{"sh", "-c", `sleep 0.5; echo "$0" >>ran; printf 'out\n\001'; printf err >&2; exit 3`, word}})
		if err != nil || res.ExitCode != 3 || string(res.Stdout) != "out\n\001" || string(res.Stderr) != "err" {
			t.Errorf("%s: exit %d stdout %q stderr %q %v, want 3 \"out\\n\\001\" \"err\" and no error", word, res.ExitCode, res.Stdout, res.Stderr, err)
		}
	}
	if n := f.srv.DropsPending(); n != 0 {
		t.Errorf("%d of the streams to end early never did", n)
	}
	data, _ := os.ReadFile(f.host(sb, "/sandbox/work/ran"))
	if string(data) != "after-init\nbefore-end\n" {
		t.Errorf("ran holds %q: each command must run once, to its end", data)
	}
	f.lastReport(sb)
}

// TestExecAcrossASnapshot proves execs through a snapshot, which freezes
// the whole sandbox (execd too) while the server takes it: an exec in
// flight when it starts (its stream ended at the thaw without its final
// event) and one sent during it (it waits) both return what their command
// did; the exec's own wrapper, stopped and continued by the freeze, still
// waits for its command to end.
func TestExecAcrossASnapshot(t *testing.T) {
	t.Parallel()
	f := newFixtureWith(t, fakeexecd.Options{SnapshotWork: 1500 * time.Millisecond}, opensandbox.Options{})
	sb := f.create("across")
	ctx := context.Background()
	var wg sync.WaitGroup
	var inFlight, during sandbox.ExecResult
	var inFlightErr, duringErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		inFlight, inFlightErr = sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", "touch started; sleep 1; echo in-flight; exit 4"}})
	}()
	testkit.Eventually(t, "the exec in flight to start", func() (bool, string) {
		_, err := os.Stat(f.host(sb, "/sandbox/work/started"))
		return err == nil, ""
	})
	snapped := make(chan error, 1)
	go func() {
		_, err := f.b.Snapshot(ctx, sb.ID(), "across")
		snapped <- err
	}()
	testkit.Eventually(t, "the freeze", func() (bool, string) {
		procs := fakeexecd.ProcsIn(f.srv.HostPath(sb.ID()), f.srv.MountPoint())
		for _, p := range procs {
			if !strings.Contains(proctest.Describe(p), " T ") {
				return false, ""
			}
		}
		return len(procs) > 0, ""
	})
	during, duringErr = sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"date", "+%s%N"}})
	wg.Wait()
	if err := <-snapped; err != nil {
		t.Fatal(err)
	}
	if inFlightErr != nil || inFlight.ExitCode != 4 || string(inFlight.Stdout) != "in-flight\n" {
		t.Errorf("the exec in flight: %+v %v, want exit 4 \"in-flight\\n\"", inFlight, inFlightErr)
	}
	fz := f.srv.Freezes()
	if len(fz) != 1 || fz[0].Processes == 0 {
		t.Fatalf("freezes %+v, want one that stopped the exec's processes", fz)
	}
	var ns int64
	if _, err := fmt.Sscan(string(during.Stdout), &ns); duringErr != nil || err != nil || time.Unix(0, ns).Before(fz[0].End) {
		t.Errorf("the exec sent during the freeze: %+v %v, want it run after the thaw at %s", during, duringErr, fz[0].End)
	}
	// The stream in flight was ended at the thaw: the backend read the
	// report the script kept.
	if n := f.srv.Downloads(sb.ID()); n == 0 {
		t.Errorf("no report was read: the stream in flight was not ended at the thaw")
	}
}

// TestSweepRemovesWhatATestMade proves the tests' cleanup on a server:
// Sweep removes every sandbox carrying the test's label and every one it
// names, with the snapshots taken of them (one a labelled fork uses is
// removed once the fork is gone; one of a sandbox removed earlier is
// found by that sandbox), and nothing of anyone else's.
func TestSweepRemovesWhatATestMade(t *testing.T) {
	t.Parallel()
	f := newFixtureWith(t, fakeexecd.Options{SnapshotWork: 10 * time.Millisecond}, opensandbox.Options{Metadata: map[string]string{fakeexecd.RealLabel: "sweep-test"}})
	other, err := opensandbox.New(opensandbox.Options{Server: f.srv.URL(), APIKey: apiKey, Image: "x", Root: "/sandbox/.ngharness", Workdir: "/sandbox/work", Poll: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	theirs, err := other.Create(ctx, "someone-else")
	if err != nil {
		t.Fatal(err)
	}
	theirSnap, err := other.Snapshot(ctx, theirs.ID(), "theirs")
	if err != nil {
		t.Fatal(err)
	}
	lender := &fakeexecd.Lender{Backend: f.b}
	a, err := lender.Create(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	snapA, err := lender.Snapshot(ctx, a.ID(), "a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lender.Fork(ctx, snapA, "a-fork"); err != nil {
		t.Fatal(err)
	}
	gone, err := lender.Create(ctx, "removed-early")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lender.Snapshot(ctx, gone.ID(), "left"); err != nil {
		t.Fatal(err)
	}
	if err := lender.Remove(ctx, gone.ID()); err != nil {
		t.Fatal(err)
	}
	if err := f.b.Lifecycle().Sweep(ctx, map[string]string{fakeexecd.RealLabel: "sweep-test"}, lender.Made()); err != nil {
		t.Fatal(err)
	}
	if left := f.srv.Sandboxes(); !slices.Equal(left, []string{theirs.ID()}) {
		t.Errorf("sandboxes left %v, want only someone else's %s", left, theirs.ID())
	}
	if left := f.srv.Snapshots(); !slices.Equal(left, []string{theirSnap}) {
		t.Errorf("snapshots left %v, want only someone else's %s", left, theirSnap)
	}
	if err := f.b.Lifecycle().Sweep(ctx, nil, nil); err == nil {
		t.Errorf("a sweep with no label and no sandbox was accepted")
	}
}
