package e2e

import (
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/e2eproc"
	"github.com/ngharness/ngharness/internal/testkit"
)

// TestGracefulShutdown: SIGTERM while runs are in flight with a short
// shutdown_timeout: a new POST /run answers 503 during the drain (and
// /healthz still answers), a run that finishes within the bound returns
// its verified result, the one that cannot is parked (its harness paused in
// place) and answered without a result, left to the checkpoint, and the
// process exits 0 within the bound plus a margin.
func TestGracefulShutdown(t *testing.T) {
	const bound = 8 * time.Second
	e := newEnv(t, options{shutdown: bound.String()})
	short, long := e.rollout("short"), e.rollout("long")
	shortCh := e.startRun("/run", short, e.body(short, 3, 0.3))
	longCh := e.startRun("/run", long, e.body(long, 200, 0.3))
	e.waitStepped(short, long)

	d := e.driver()
	begin := time.Now()
	if err := syscall.Kill(d.PID(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the driver logs that it is shutting down", func() (bool, string) {
		return strings.Contains(d.Errs.String(), `"msg":"shutting down"`), "no log line yet"
	})
	late := e.rollout("late")
	r := postRun(t.Context(), e.ctl.url, "/run", late, e.body(late, 2, 0.1))
	if r.err != nil || r.status != http.StatusServiceUnavailable || !strings.Contains(string(r.body), "shutting down") {
		t.Errorf("POST /run during the drain: %s, want 503 shutting down", r)
	}
	if h := e.health(); !h.OK || h.Runs == 0 {
		t.Errorf("/healthz during the drain: %+v, want ok with the runs in flight", h)
	}

	res := await(t, shortCh).result(t)
	checkOneLaunch(t, e, short, res, 3, 0)
	lr := await(t, longCh)
	if lr.err == nil && lr.status == http.StatusOK {
		t.Errorf("the run that could not finish within the bound returned a result: %s", lr)
	} else {
		t.Logf("the run left to the checkpoint was answered: %s", lr)
	}
	code, ok := d.WaitExit(bound + 30*time.Second)
	if !ok {
		t.Fatalf("the driver did not exit within %s of SIGTERM", bound+30*time.Second)
	}
	took := time.Since(begin)
	t.Logf("the driver exited %d, %s after SIGTERM (bound %s)", code, took.Round(time.Millisecond), bound)
	if code != 0 {
		t.Errorf("the driver exited %d after SIGTERM, want 0; stderr:\n%s", code, e2eproc.Tail(d.Errs.String(), 3000))
	}
	if took < bound/2 {
		t.Errorf("the driver exited %s after SIGTERM, before half the bound %s let the runs finish", took, bound)
	}
	if !strings.Contains(d.Errs.String(), "runs parked for the shutdown") {
		t.Errorf("the driver did not log that it parked the run in flight for the checkpoint")
	}
	// The long run's harness was parked (paused in place) for the
	// checkpoint, not killed: the cleanup stops it.
	if live := e.liveHarnesses(); len(live) != 1 {
		t.Errorf("after the shutdown the live harnesses are %v, want the long run's only", live)
	}
}
