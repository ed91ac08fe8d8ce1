package codexe2e

import (
	"bufio"
	"errors"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/test/fakemodel"
)

// rxQueued sums the bytes waiting unread in the receive queues of the TCP
// sockets connected to port on 127.0.0.1 (the clients of the fake model):
// a reply the server wrote that Codex has not read yet.
func rxQueued(port int) (int, error) {
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	total := 0
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		// sl local_address rem_address st tx_queue:rx_queue ...
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		rem := fields[2]
		i := strings.IndexByte(rem, ':')
		if i < 0 {
			continue
		}
		p, err := strconv.ParseUint(rem[i+1:], 16, 16)
		if err != nil || int(p) != port {
			continue
		}
		q := fields[4]
		j := strings.IndexByte(q, ':')
		if j < 0 {
			continue
		}
		rx, err := strconv.ParseUint(q[j+1:], 16, 32)
		if err != nil {
			continue
		}
		total += int(rx)
	}
	return total, sc.Err()
}

// modelPort is the fake model's port.
func (w *world) modelPort() int {
	w.t.Helper()
	u, err := url.Parse(w.model.URL())
	if err != nil {
		w.t.Fatal(err)
	}
	p, err := strconv.Atoi(u.Port())
	if err != nil {
		w.t.Fatal(err)
	}
	return p
}

// TestCodexPauseHeldReply: a checkpoint pauses Codex while the model's
// reply to its first request is held. The reply is released while Codex
// is paused: its bytes wait unread in Codex's socket, and nothing in the
// sandbox (files, CPU times) changes. After the checkpoint opens Codex
// reads that reply, runs the tool call it holds and finishes: one launch,
// pauses 1, no model call repeated.
func TestCodexPauseHeldReply(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "held", fakemodel.Options{Script: script("sleep 1; touch done.txt", "touch done.txt")})
	w.model.Hold(1)
	p := newParticipant()
	h := w.start(w.runner(w.adapter(nil), p), 1)
	w.waitHeld(1)
	sb := w.waitSandbox(1)
	l1 := w.launchID(1, 1, sb)
	cx := w.harness(sb, l1)
	port := w.modelPort()

	w.prepare(p, "ck-1")
	a := w.observe(sb, l1)
	base, err := rxQueued(port)
	if err != nil {
		t.Fatal(err)
	}
	w.commit(p, "ck-1")
	w.model.Release()
	queued, since := base, time.Now()
	w.eventually("the released reply in Codex's socket", func() (bool, string) {
		q, err := rxQueued(port)
		if err != nil {
			return false, err.Error()
		}
		if q != queued {
			queued, since = q, time.Now()
		}
		return queued > base && time.Since(since) > 500*time.Millisecond, fmt.Sprintf("%d bytes queued (%d before the release)", q, base)
	})
	time.Sleep(hold)
	b := w.observe(sb, l1)
	t.Logf("paused on the held reply, processes %v: %s", comms(a), compareStill(t, a, b))
	if slices.Contains(comms(b), "sleep") {
		t.Errorf("the tool ran while paused")
	}
	if q, err := rxQueued(port); err != nil || q != queued {
		t.Errorf("Codex's sockets held %d unread bytes from the model, then %d (%v): it read while paused", queued, q, err)
	}
	if n := len(w.model.Requests()); n != 1 {
		t.Errorf("%d model requests while paused, want the 1 before it", n)
	}
	w.resume(p, "ck-1")

	r := w.mustSucceed(h)
	w.checkOneLaunch(r, 1)
	w.checkSameHarnessFinished(sb, l1, cx)
	t.Logf("the reply (%d bytes) waited unread in Codex's socket while paused and was read after continue; %s",
		queued-base, w.checkOneToolRun(w.model.Requests(), 1))
}

// TestCodexCrashBeforeResponse: the driver crashes after a checkpoint
// taken while Codex's first model request is held (no completed response
// saved). The relaunch in the fork starts over (resumed false, the reason
// naming the missing response), makes its two model calls with the task
// the only user turn, and is verified.
func TestCodexCrashBeforeResponse(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "noresp", fakemodel.Options{Script: script("touch done.txt", "touch done.txt")})
	w.model.Hold(1)
	p1 := newParticipant()
	h1 := w.start(w.runner(w.adapter(nil), p1), 1)
	w.waitHeld(1)
	old := w.waitSandbox(1)
	w.prepare(p1, "ck-1")
	_, ck := w.commit(p1, "ck-1")
	w.resume(p1, "ck-1")
	w.waitContinued(1)
	if w.model.Held() != 1 {
		t.Fatalf("the first request is no longer held")
	}
	h1.cancel(driver.ErrCrashed)
	if _, err := w.wait(h1); !errors.Is(err, driver.ErrCrashed) {
		t.Fatalf("attempt 1 returned %v, want the crash", err)
	}
	w.restoreOwner("ck-1", ck)
	fork := w.waitSandbox(2)

	p2 := newParticipant()
	w.restore(p2, "ck-1", ck)
	h2 := w.start(w.runner(w.adapter(nil), p2), 2)
	r := w.mustSucceed(h2)
	w.model.Release() // attempt 1's request, whose client is gone
	if len(r.Launches) != 2 {
		t.Fatalf("%d launches, want 2: %+v", len(r.Launches), r.Launches)
	}
	l1, l2 := r.Launches[0], r.Launches[1]
	if l1.SandboxID != old || l1.Outcome != driver.OutcomeInterrupted {
		t.Errorf("launch 1: %+v; want in %s, interrupted", l1, old)
	}
	if l2.SandboxID != fork || l2.Resumed || l2.Outcome != driver.OutcomeFinished ||
		!strings.Contains(l2.Reason, "holds no completed model response; starting over with the task in a fresh CODEX_HOME") {
		t.Errorf("launch 2: %+v; want in the fork %s, not resumed (no completed response), finished", l2, fork)
	}
	t.Logf("launch 2 reason %q; %s", l2.Reason, w.checkOneToolRun(byAttempt(w.model.Requests(), 2), 2))
}

// TestCodexTwoRolloutsApart: two rollouts run Codex at once, each in its
// own sandbox. A checkpoint of one pauses its processes only: the other's
// Codex, tool and sleep keep running (none stopped) and it finishes while
// the first is held; then the first continues and finishes too.
func TestCodexTwoRolloutsApart(t *testing.T) {
	t.Parallel()
	wa := newWorld(t, "twoa", fakemodel.Options{Script: script("sleep 6; touch done.txt", "touch done.txt")})
	wb := newWorld(t, "twob", fakemodel.Options{Script: script("sleep 3; touch done.txt", "touch done.txt")})
	pa, pb := newParticipant(), newParticipant()
	ha := wa.start(wa.runner(wa.adapter(nil), pa), 1)
	hb := wb.start(wb.runner(wb.adapter(nil), pb), 1)
	sa, sb := wa.waitSandbox(1), wb.waitSandbox(1)
	la, lb := wa.launchID(1, 1, sa), wb.launchID(1, 1, sb)
	wa.waitProc(sa, la, "sleep")
	wb.waitProc(sb, lb, "sleep")

	wa.prepare(pa, "ck-a")
	a := wa.observe(sa, la)
	trb, err := tree(wb.launchDir(sb, lb))
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range trb.Processes {
		if _, ok := a.procs[q.PID]; ok {
			t.Errorf("process %d (%s) of rollout B is among rollout A's paused processes", q.PID, q.Comm)
		}
		if st, ok := readStat(q.PID); ok && (st.State == 'T' || st.State == 't') {
			t.Errorf("process %d (%s) of rollout B is stopped while A is paused", q.PID, q.Comm)
		}
	}
	rb := wb.mustSucceed(hb) // B finishes while A is held
	wb.checkOneLaunch(rb, 0)
	wa.commit(pa, "ck-a")
	wa.resume(pa, "ck-a")
	ra := wa.mustSucceed(ha)
	wa.checkOneLaunch(ra, 1)
	t.Logf("A paused (%d processes) while B's %d processes ran on and B finished; then A finished: %s",
		len(a.procs), len(trb.Processes), wa.checkOneToolRun(wa.model.Requests(), 1))
}

// TestCodexPauseMidStream: a checkpoint pauses Codex while the reply with
// its tool call is still streaming (the fake paces its events). While
// Codex is paused the rest of the stream arrives and waits unread in its
// socket (the queued bytes grow), and nothing in the sandbox changes; after
// the checkpoint opens Codex reads it, runs the tool and finishes: one
// launch, pauses 1, no model call repeated.
func TestCodexPauseMidStream(t *testing.T) {
	t.Parallel()
	base := script("touch done.txt", "touch done.txt")
	w := newWorld(t, "stream", fakemodel.Options{Script: func(r fakemodel.Request) fakemodel.Reply {
		rep := base(r)
		if rep.ToolCall != nil {
			rep.Pace = 800 * time.Millisecond
		}
		return rep
	}})
	p := newParticipant()
	h := w.start(w.runner(w.adapter(nil), p), 1)
	w.eventually("the first model request", func() (bool, string) {
		n := len(w.model.Requests())
		return n >= 1, fmt.Sprintf("%d requests", n)
	})
	sb := w.waitSandbox(1)
	l1 := w.launchID(1, 1, sb)
	cx := w.harness(sb, l1)
	port := w.modelPort()

	w.prepare(p, "ck-1")
	a := w.observe(sb, l1)
	q0, err := rxQueued(port)
	if err != nil {
		t.Fatal(err)
	}
	w.commit(p, "ck-1")
	time.Sleep(hold)
	b := w.observe(sb, l1)
	q1, err := rxQueued(port)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("paused mid-stream, processes %v: %s", comms(a), compareStill(t, a, b))
	if q1 <= q0 {
		t.Errorf("no stream bytes arrived while paused (%d then %d queued): the pause did not come mid-stream", q0, q1)
	}
	if n := len(w.model.Requests()); n != 1 {
		t.Errorf("%d model requests by the end of the pause, want 1", n)
	}
	w.resume(p, "ck-1")

	r := w.mustSucceed(h)
	w.checkOneLaunch(r, 1)
	w.checkSameHarnessFinished(sb, l1, cx)
	t.Logf("%d stream bytes arrived unread while paused (%d queued at the pause); %s", q1-q0, q0, w.checkOneToolRun(w.model.Requests(), 1))
}
