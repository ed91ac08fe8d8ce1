package backends_e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/drivertest"
	fakeexecd "github.com/ngharness/ngharness/internal/fake/execd"
	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
)

// The tests of this file run against the real OpenSandbox server that
// NGHARNESS_OPENSANDBOX_URL, _API_KEY and _IMAGE name (they skip without
// it): a rollout verified end to end, a checkpoint that pauses and
// continues in place, and the owner's renewals, every check made through
// the server and the sandboxes' own exec (this machine cannot see them).
// Each runs in a drivertest.Env on drivertest.BackendRealOpenSandbox: the
// opensandbox backend, the owner lending its sandboxes, ngsup and the fake
// adapter, without the fake's host view. Every sandbox it makes carries
// this test process's fakeexecd.RealLabel; at the end those, and the
// snapshots taken of them (the owner's at each commit), are removed from
// the server.

// stepsIn counts the steps a fake session recorded, read through the
// sandbox's exec.
func stepsIn(t *testing.T, e *drivertest.Env, id, rollout string) int {
	t.Helper()
	sb, err := e.Open(id)
	if err != nil {
		t.Fatal(err)
	}
	pattern := sb.Root() + "/state/fake/*" + rollout + "*/steps"
	res, err := sb.Exec(context.Background(), sandbox.ExecRequest{Argv: []string{"sh", "-c", `cat $1 2>/dev/null | grep -c '^step'`, "sh", pattern}, Dir: "/"})
	if err != nil {
		t.Fatal(err)
	}
	var n int
	_, _ = fmt.Sscan(string(res.Stdout), &n)
	return n
}

// TestRealServerVerifiedRun proves a rollout runs end to end on the real
// server: the owner creates the sandbox there, the driver uploads ngsup
// once, launches and follows the fake harness, and the owner's check in
// the sandbox verifies it; one launch, finished.
func TestRealServerVerifiedRun(t *testing.T) {
	t.Parallel()
	e := drivertest.NewOn(t, drivertest.BackendRealOpenSandbox)
	ro := e.Rollout("real-plain")
	r := mustVerify(t, start(e, drivertest.NewParticipant(), ro, task(ro, "count", 4, 0.2)))
	if len(r.Launches) != 1 {
		t.Fatalf("want one launch, got %+v", r.Launches)
	}
	checkLaunch(t, r.Launches[0], driver.OutcomeFinished, 0, false)
	if r.Fake.Steps != 4 {
		t.Errorf("harness output %+v", r.Fake)
	}
	if n := e.Backend.NgsupUploads(r.Launches[0].SandboxID); n != 1 {
		t.Errorf("ngsup was uploaded %d times, want once", n)
	}
}

// TestRealServerPausedInPlace proves a checkpoint pauses the launch in
// place on the real server (`ngsup pause` by exec), the owner snapshots
// the sandbox while it is held, and the same launch continues to a
// verified end: one launch, paused once, every step once.
func TestRealServerPausedInPlace(t *testing.T) {
	t.Parallel()
	e := drivertest.NewOn(t, drivertest.BackendRealOpenSandbox)
	ro := e.Rollout("real-pause")
	p := drivertest.NewParticipant()
	h := start(e, p, ro, task(ro, "count", 8, 0.5))
	sb := e.WaitSeeded(ro, 1).SandboxID
	testkit.Eventually(t, "two steps", func() (bool, string) {
		n := stepsIn(t, e, sb, ro)
		return n >= 2, "steps so far"
	})
	if _, err := e.Checkpoint(p, "ckpt-1", 500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	r := mustVerify(t, h)
	if len(r.Launches) != 1 {
		t.Fatalf("want one launch, got %+v", r.Launches)
	}
	checkLaunch(t, r.Launches[0], driver.OutcomeFinished, 1, false)
	if n := stepsIn(t, e, sb, ro); n != 8 {
		t.Errorf("%d steps recorded, want each of the 8 once", n)
	}
}

// TestRealServerRenewsOpenSessions proves the owner renews, through the
// real server, the expiration of the sandboxes of open sessions only.
func TestRealServerRenewsOpenSessions(t *testing.T) {
	t.Parallel()
	e := drivertest.NewOn(t, drivertest.BackendRealOpenSandbox)
	lender := e.Lender.(*fakeexecd.Lender)
	ctx := context.Background()
	open, err := e.Owner.SeedSession(ctx, "", json.RawMessage(`{"rollout_id":"`+e.Rollout("renew-open")+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	closed, err := e.Owner.SeedSession(ctx, "", json.RawMessage(`{"rollout_id":"`+e.Rollout("renew-closed")+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	ci, _ := e.Owner.Session(closed.Cookies)
	before, err := lender.Lifecycle().Get(ctx, ci.SandboxID)
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
	info, err := lender.Lifecycle().Get(ctx, oi.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	if info.ExpiresAt == nil || info.ExpiresAt.Before(time.Now().Add(2*time.Hour)) {
		t.Errorf("the open session's sandbox expires at %v, want about 3 h from now", info.ExpiresAt)
	}
	if after, err := lender.Lifecycle().Get(ctx, ci.SandboxID); err == nil && after.ExpiresAt != nil && before.ExpiresAt != nil && after.ExpiresAt.After(before.ExpiresAt.Add(time.Minute)) {
		t.Errorf("the closed session's sandbox was renewed: %v -> %v", before.ExpiresAt, after.ExpiresAt)
	}
}
