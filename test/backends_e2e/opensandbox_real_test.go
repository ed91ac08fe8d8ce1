package backends_e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"testing"
	"time"

	fakeexecd "github.com/ngharness/ngharness/internal/fake/execd"
	"github.com/ngharness/ngharness/internal/syncbuf"
	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/driver/owner"
	"github.com/ngharness/ngharness/pkg/driver/owner/lending"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/opensandbox"
)

// The tests of this file run against the real OpenSandbox server that
// NGHARNESS_OPENSANDBOX_URL, _API_KEY and _IMAGE name (they skip without
// it): a rollout verified end to end, a checkpoint that pauses and
// continues in place, and the owner's renewals, every check made through
// the server and the sandboxes' own exec (this machine cannot see them).

// newRealWorld is a world on the real server: the opensandbox backend,
// the owner lending its sandboxes, ngsup and the fake adapter, as
// newWorld wires them, without the fake's host view. Every sandbox it
// makes carries this test process's fakeexecd.RealLabel; at the end those,
// and the snapshots taken of them (the owner's at each commit), are
// removed from the server.
func newRealWorld(t *testing.T) (*world, *fakeexecd.Lender) {
	t.Helper()
	real, ok, err := fakeexecd.RealServer()
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Skipf("%s is not set: no real OpenSandbox server to run against (the fake one runs in the other tests)", fakeexecd.RealURLEnv)
	}
	b, err := opensandbox.New(opensandbox.Options{Server: real.URL, APIKey: real.APIKey, Image: real.Image, Root: real.Root, Workdir: real.Workdir,
		Metadata: map[string]string{fakeexecd.RealLabel: fakeexecd.RunLabel}})
	if err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, name: "opensandbox", buf: &syncbuf.Buffer{}}
	var out io.Writer = w.buf
	if os.Getenv("BACKENDS_E2E_VERBOSE") != "" {
		out = io.MultiWriter(w.buf, os.Stderr)
	}
	w.log = slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
	lender := &fakeexecd.Lender{Backend: b}
	w.raw, w.lender = b, lender
	w.rec = &recorder{inner: b, uploads: map[string][]string{}}
	w.ownerNgsup = w.newNgsup()
	lo := lending.New(lending.Options{
		Sandboxes:   lender,
		StopSandbox: func(ctx context.Context, sb sandbox.Sandbox) error { return w.ownerNgsup.StopSandbox(ctx, sb) },
		KillSandbox: func(ctx context.Context, sb sandbox.Sandbox) error { return w.ownerNgsup.StopSandboxGrace(ctx, sb, 0) },
		Logger:      w.log,
	})
	w.owner = &trackingOwner{Owner: lo, cookies: map[string][]owner.Cookies{}}
	t.Cleanup(func() {
		w.mu.Lock()
		handles := slices.Clone(w.handles)
		w.mu.Unlock()
		for _, h := range handles {
			h.cancel(errors.New("backends_e2e: the test ended"))
			<-h.done
		}
		ctx, cancel := context.WithTimeout(context.Background(), Patience)
		defer cancel()
		if err := lender.Sweep(ctx); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		if t.Failed() {
			t.Logf("driver and owner log:\n%s", w.buf.String())
		}
	})
	return w, lender
}

// stepsIn counts the steps a fake session recorded, read through the
// sandbox's exec.
func stepsIn(t *testing.T, w *world, id, rollout string) int {
	t.Helper()
	sb, err := w.lender.Open(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	pattern := sb.Root() + "/state/fake/*" + sanitize(rollout) + "*/steps"
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
	w, _ := newRealWorld(t)
	ro := w.rollout("real-plain")
	h := w.start(w.runner(newParticipant(), nil), ro, 1, task(ro, "count", 4, 0.2))
	r := h.mustSucceed(t)
	if len(r.Launches) != 1 {
		t.Fatalf("want one launch, got %+v", r.Launches)
	}
	checkLaunch(t, r.Launches[0], driver.OutcomeFinished, 0, false)
	if r.Fake.Steps != 4 {
		t.Errorf("harness output %+v", r.Fake)
	}
	if n := w.rec.ngsupUploads(r.Launches[0].SandboxID); n != 1 {
		t.Errorf("ngsup was uploaded %d times, want once", n)
	}
}

// TestRealServerPausedInPlace proves a checkpoint pauses the launch in
// place on the real server (`ngsup pause` by exec), the owner snapshots
// the sandbox while it is held, and the same launch continues to a
// verified end: one launch, paused once, every step once.
func TestRealServerPausedInPlace(t *testing.T) {
	t.Parallel()
	w, _ := newRealWorld(t)
	ro := w.rollout("real-pause")
	p := newParticipant()
	h := w.start(w.runner(p, nil), ro, 1, task(ro, "count", 8, 0.5))
	sb := w.session(ro).SandboxID
	testkit.Eventually(t, "two steps", func() (bool, string) {
		n := stepsIn(t, w, sb, ro)
		return n >= 2, "steps so far"
	})
	if _, err := w.checkpoint(p, "ckpt-1", 500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	r := h.mustSucceed(t)
	if len(r.Launches) != 1 {
		t.Fatalf("want one launch, got %+v", r.Launches)
	}
	checkLaunch(t, r.Launches[0], driver.OutcomeFinished, 1, false)
	if n := stepsIn(t, w, sb, ro); n != 8 {
		t.Errorf("%d steps recorded, want each of the 8 once", n)
	}
}

// TestRealServerRenewsOpenSessions proves the owner renews, through the
// real server, the expiration of the sandboxes of open sessions only.
func TestRealServerRenewsOpenSessions(t *testing.T) {
	t.Parallel()
	w, lender := newRealWorld(t)
	ctx := context.Background()
	open, err := w.owner.SeedSession(ctx, "", json.RawMessage(`{"rollout_id":"`+w.rollout("renew-open")+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	closed, err := w.owner.SeedSession(ctx, "", json.RawMessage(`{"rollout_id":"`+w.rollout("renew-closed")+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	ci, _ := w.owner.Session(closed.Cookies)
	before, err := lender.Lifecycle().Get(ctx, ci.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.owner.CloseSession(ctx, "", closed.Cookies); err != nil {
		t.Fatal(err)
	}
	if err := w.owner.RenewOpen(ctx, 3*time.Hour); err != nil {
		t.Fatal(err)
	}
	oi, _ := w.owner.Session(open.Cookies)
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
