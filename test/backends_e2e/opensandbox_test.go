package backends_e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/drivertest"
	fakeexecd "github.com/ngharness/ngharness/internal/fake/execd"
	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/driver/launch"
)

// modeRun runs one rollout through the opensandbox backend with a
// checkpoint in the middle (paused in place), while disturb does its worst
// to execd once the harness has taken two steps. The run must verify with
// one launch, paused once, the harness started once and every step once;
// every command the driver sent was a foreground one (it never follows a
// launch by execd's command ids).
func modeRun(t *testing.T, e *drivertest.Env, disturb func(sandboxID string)) {
	t.Helper()
	ro := e.Rollout("mode")
	p := drivertest.NewParticipant()
	h := start(e, p, ro, task(ro, "count", 10, 0.4))
	sb := e.WaitSeeded(ro, 1).SandboxID
	dir := e.WaitSession(sb, ro)
	e.WaitSteps(dir, 2)
	disturb(sb)
	if _, err := e.Checkpoint(p, "ckpt-1", 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	r := mustVerify(t, h)
	if len(r.Launches) != 1 {
		t.Fatalf("want one launch, got %+v", r.Launches)
	}
	checkLaunch(t, r.Launches[0], driver.OutcomeFinished, 1, false)
	drivertest.CheckStepsOnce(t, dir, 10)
	if n := harnesses(dir); n != 1 {
		t.Errorf("the harness was started %d times, want once", n)
	}
	if _, bg := e.OpenSandbox.CommandCounts(sb); bg != 0 {
		t.Errorf("the driver ran %d background commands", bg)
	}
	e.CheckNoProcs("after verify", sb)
}

// TestExecdLateCompletion proves a run verifies while execd reports every
// finished background command 30 s late: the driver never waits on
// execd's command status (a launch is followed with `ngsup wait` on the
// sandbox's disk).
func TestExecdLateCompletion(t *testing.T) {
	t.Parallel()
	skipIfReal(t)
	e := drivertest.NewOn(t, "opensandbox")
	e.OpenSandbox.SetLateCompletion(30 * time.Second)
	modeRun(t, e, func(string) {})
}

// TestExecdRestartsAndForgetsIDs proves a launch survives execd
// restarting mid-run (its connections dropped, the `ngsup wait` in flight
// killed, new connections refused for a second, every command id
// forgotten) and execd forgetting its ids again later: the detached
// supervisor keeps the launch, the driver retries its wait and goes on
// with the same launch.
func TestExecdRestartsAndForgetsIDs(t *testing.T) {
	t.Parallel()
	skipIfReal(t)
	e := drivertest.NewOn(t, "opensandbox")
	modeRun(t, e, func(sb string) {
		if err := e.OpenSandbox.RestartExecd(sb, time.Second); err != nil {
			t.Fatal(err)
		}
		e.OpenSandbox.ForgetCommandIDs()
	})
}

// TestExecdDropsConnections proves a run verifies when execd's connection
// drops mid-stream: a `ngsup run` whose reply is lost after it ran (the
// driver finds the launch by `ngsup status` instead of launching twice),
// two `ngsup wait` cut after they started (retried), and a `ngsup
// continue` whose reply is lost after it ran (sent again, harmlessly).
func TestExecdDropsConnections(t *testing.T) {
	t.Parallel()
	skipIfReal(t)
	e := drivertest.NewOn(t, "opensandbox")
	has := func(word string) func(string) bool {
		return func(c string) bool { return strings.Contains(c, " "+word+" --dir ") }
	}
	e.OpenSandbox.DropStreams(has("run"), 1, fakeexecd.DropBeforeEnd)
	modeRun(t, e, func(string) {
		e.OpenSandbox.DropStreams(has("wait"), 2, fakeexecd.DropAfterInit)
		e.OpenSandbox.DropStreams(has("continue"), 1, fakeexecd.DropBeforeEnd)
	})
	if n := e.OpenSandbox.DropsPending(); n != 0 {
		t.Errorf("%d of the dropped streams never happened", n)
	}
}

// TestNgsupForTheSandboxArchitecture proves that ngsup is uploaded for the
// architecture the sandbox reports (uname -m through the backend): arm64
// gets the arm64 build, x86-64 the amd64 one, each at a path named by its
// hash; a machine with no build is ErrNoNgsup.
func TestNgsupForTheSandboxArchitecture(t *testing.T) {
	t.Parallel()
	skipIfReal(t)
	e := drivertest.NewOn(t, "opensandbox")
	ctx := context.Background()
	sb, err := e.Lender.Create(ctx, "arch")
	if err != nil {
		t.Fatal(err)
	}
	arm := filepath.Join(t.TempDir(), "ngsup-linux-arm64")
	armData := []byte("#!/bin/sh\necho arm64 stand-in\n")
	if err := os.WriteFile(arm, armData, 0o755); err != nil {
		t.Fatal(err)
	}
	bins := map[string]string{runtime.GOARCH: ngsupPath, "arm64": arm}
	if runtime.GOARCH == "arm64" {
		t.Skip("this machine is arm64: the stand-in would replace the real build")
	}
	if err := e.OpenSandbox.SetMachine("aarch64"); err != nil {
		t.Fatal(err)
	}
	p, err := (&launch.Ngsup{Binaries: bins, Log: e.Log}).Ensure(ctx, sb)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(e.HostOf(sb.ID(), p)); !bytes.Equal(got, armData) {
		t.Errorf("an aarch64 sandbox got %s holding %q, want the arm64 build", p, got)
	}
	if err := e.OpenSandbox.SetMachine("mips"); err != nil {
		t.Fatal(err)
	}
	if _, err := (&launch.Ngsup{Binaries: bins}).Ensure(ctx, sb); !errors.Is(err, launch.ErrNoNgsup) {
		t.Errorf("a mips sandbox: %v, want ErrNoNgsup", err)
	}
	if err := e.OpenSandbox.SetMachine(""); err != nil {
		t.Fatal(err)
	}
	p2, err := (&launch.Ngsup{Binaries: bins}).Ensure(ctx, sb)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(ngsupPath)
	if got, _ := os.ReadFile(e.HostOf(sb.ID(), p2)); p2 == p || !bytes.Equal(got, want) {
		t.Errorf("an x86-64 sandbox got %s, want the %s build at a path of its own", p2, runtime.GOARCH)
	}
	ups := e.OpenSandbox.Uploads(sb.ID())
	if len(ups) != 2 {
		t.Errorf("uploads %v, want the two builds once each", ups)
	}
}

// TestOwnerRenewsOpenSessions proves the owner renews, through the
// lifecycle server, the expiration of the sandboxes of open sessions only.
func TestOwnerRenewsOpenSessions(t *testing.T) {
	t.Parallel()
	skipIfReal(t)
	e := drivertest.NewOn(t, "opensandbox")
	ctx := context.Background()
	open, err := e.Owner.SeedSession(ctx, "", json.RawMessage(`{"rollout_id":"renew-open"}`))
	if err != nil {
		t.Fatal(err)
	}
	closed, err := e.Owner.SeedSession(ctx, "", json.RawMessage(`{"rollout_id":"renew-closed"}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Owner.CloseSession(ctx, "", closed.Cookies); err != nil {
		t.Fatal(err)
	}
	if err := e.Owner.RenewOpen(ctx, 3*time.Hour); err != nil {
		t.Fatal(err)
	}
	oi, _ := e.Owner.Session(open.Cookies)
	ci, _ := e.Owner.Session(closed.Cookies)
	if r := e.OpenSandbox.Renewals(oi.SandboxID); len(r) != 1 || r[0].Before(time.Now().Add(2*time.Hour)) {
		t.Errorf("the open session's sandbox was renewed to %v", r)
	}
	if r := e.OpenSandbox.Renewals(ci.SandboxID); len(r) != 0 {
		t.Errorf("the closed session's sandbox was renewed: %v", r)
	}
}

// skipIfReal skips a test of the fake's fault modes, or of what only the
// fake lets this machine see, when the OpenSandbox tests run against a
// real server (opensandbox_real_test.go has those).
func skipIfReal(t *testing.T) {
	t.Helper()
	if why := fakeexecd.SkipIfReal(); why != "" {
		t.Skip(why)
	}
}
