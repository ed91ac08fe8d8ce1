package opencodee2e

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/proto"
	"github.com/ngharness/ngharness/test/fakemodel"
)

// hold is how long a checkpoint in these tests keeps a launch paused
// between two looks at it: long enough for anything that could move to
// move.
const hold = 3 * time.Second

// checkOneLaunch checks the launch log of a run that paused in place only:
// one launch, not resumed, finished, paused pauses times.
func (w *world) checkOneLaunch(r result, pauses int) {
	t := w.t
	t.Helper()
	w.obs.mu.Lock()
	if w.obs.pauses != pauses || w.obs.continues != pauses || w.obs.ends != 1 {
		t.Errorf("the runner reported %d confirmed pauses, %d continues, %d launch ends; want %d, %d, 1", w.obs.pauses, w.obs.continues, w.obs.ends, pauses, pauses)
	}
	w.obs.mu.Unlock()
	if len(r.Launches) != 1 {
		t.Fatalf("%d launches, want 1: %+v", len(r.Launches), r.Launches)
	}
	l := r.Launches[0]
	if l.Outcome != driver.OutcomeFinished || l.Pauses != pauses || l.Resumed || !l.Supervised || l.ExitCode != 0 {
		t.Errorf("launch %s: outcome %s, pauses %d, resumed %v, supervised %v, exit code %d (error %q); want finished, %d, false, true, 0",
			l.ID, l.Outcome, l.Pauses, l.Resumed, l.Supervised, l.ExitCode, l.Error, pauses)
	}
}

// harness is the launch's harness process, read from its receipt: the
// OpenCode process itself (the adapter's `sh -c 'exec opencode run ...'`
// replaces the shell). The test fails unless its executable is OpenCode.
func (w *world) harness(sandboxID, launchID string) proto.Proc {
	w.t.Helper()
	r := w.receipt(sandboxID, launchID)
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", r.HarnessPID))
	if err != nil || exe != w.oc {
		w.t.Fatalf("the harness %d of launch %s runs %q (%v), want OpenCode %s", r.HarnessPID, launchID, exe, err, w.oc)
	}
	return proto.Proc{PID: r.HarnessPID, StartTicks: r.HarnessStartTicks}
}

// checkSameHarnessFinished checks that the launch's receipt says the
// harness oc (the OpenCode process seen paused) is the one that ran to the
// end and exited 0.
func (w *world) checkSameHarnessFinished(sandboxID, launchID string, oc proto.Proc) {
	w.t.Helper()
	r := w.receipt(sandboxID, launchID)
	if r.HarnessPID != oc.PID || r.HarnessStartTicks != oc.StartTicks || !r.Ended || r.ExitCode != 0 || r.Signal != 0 {
		w.t.Errorf("receipt of %s: harness %d (start %d), ended %v, exit code %d, signal %d; want the paused OpenCode %d (start %d), ended, 0",
			launchID, r.HarnessPID, r.HarnessStartTicks, r.Ended, r.ExitCode, r.Signal, oc.PID, oc.StartTicks)
	}
}

// describeSessions lists a tree's processes with their process groups and
// sessions (OpenCode starts each tool call in a session of its own).
func describeSessions(tr proto.TreeResult) string {
	var parts []string
	for _, p := range tr.Processes {
		parts = append(parts, fmt.Sprintf("%s %d/%d/%d/%d", p.Comm, p.PID, p.PPID, p.PGID, p.SID))
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// comms lists the command names of the processes of a look.
func comms(s still) []string {
	var out []string
	for _, p := range s.procs {
		out = append(out, p.Comm)
	}
	slices.Sort(out)
	return out
}

// TestPauseMidTool: a checkpoint pauses OpenCode while its bash tool call
// runs `sleep`. Every process of the launch (OpenCode, the tool's shell in
// its own session, sleep) is stopped; opencode.db, -wal and -shm, every
// file of the sandbox and every process's CPU time stay unchanged while the
// owner snapshots the sandbox and the checkpoint holds; no model request
// arrives. After the checkpoint opens the SAME OpenCode process finishes
// (one launch, pauses 1), with title, tool call and final requested once
// each, and the owner verifies done.txt.
func TestPauseMidTool(t *testing.T) {
	t.Parallel()
	forEachOpenCode(t, testPauseMidTool)
}

func testPauseMidTool(t *testing.T, ver openCode) {
	w := newWorld(t, ver, "midtool", fakemodel.Options{Script: script("sleep 15; touch done.txt", "touch done.txt")})
	p := newParticipant()
	h := w.start(w.runner(w.adapter(nil), p), 1)
	sb := w.waitSandbox(1)
	l1 := w.launchID(1, 1, sb)
	w.waitProc(sb, l1, "sleep")
	oc := w.harness(sb, l1)

	w.prepare(p, "ck-1")
	nreq := len(w.model.Requests())
	a := w.observe(sb, l1)
	if _, ok := a.procs[oc.PID]; !ok || !slices.Contains(comms(a), "sleep") || len(a.procs) < 3 {
		t.Fatalf("the paused launch holds %v (OpenCode %d), want OpenCode, the tool's shell and sleep", comms(a), oc.PID)
	}
	tr, err := tree(w.launchDir(sb, l1))
	if err != nil {
		t.Fatal(err)
	}
	w.commit(p, "ck-1")
	time.Sleep(hold)
	b := w.observe(sb, l1)
	t.Logf("paused mid-tool, processes (pid/ppid/pgid/sid) %s: %s", describeSessions(tr), compareStill(t, a, b))
	if n := len(w.model.Requests()); n != nreq {
		t.Errorf("%d model requests arrived while paused", n-nreq)
	}
	w.resume(p, "ck-1")

	r := w.mustSucceed(h)
	w.checkOneLaunch(r, 1)
	w.checkSameHarnessFinished(sb, l1, oc)
	t.Logf("after continue: the same OpenCode %d finished; %s", oc.PID, checkOneToolRun(t, w.model.Requests()))
}

// TestPauseHeldReply: a checkpoint pauses OpenCode while the model's reply
// to its main turn is held. The reply is released while OpenCode is
// paused: its bytes wait unread in OpenCode's socket, and nothing in the
// sandbox (database, files, CPU times) changes. After the checkpoint opens
// OpenCode reads that reply, runs the tool call it holds and finishes:
// one launch, pauses 1, no model call repeated.
func TestPauseHeldReply(t *testing.T) {
	t.Parallel()
	forEachOpenCode(t, testPauseHeldReply)
}

func testPauseHeldReply(t *testing.T, ver openCode) {
	w := newWorld(t, ver, "held", fakemodel.Options{
		Script:   script("sleep 1; touch done.txt", "touch done.txt"),
		Holdable: func(r fakemodel.Request) bool { return r.HasTools },
	})
	w.model.Hold(1)
	p := newParticipant()
	h := w.start(w.runner(w.adapter(nil), p), 1)
	w.waitHeld(1)
	// The title request goes beside the main turn; let it be answered.
	w.eventually("the title request", func() (bool, string) {
		n := len(w.model.Requests())
		return n >= 2, fmt.Sprintf("%d requests", n)
	})
	sb := w.waitSandbox(1)
	l1 := w.launchID(1, 1, sb)
	oc := w.harness(sb, l1)
	port := w.modelPort()

	w.prepare(p, "ck-1")
	a := w.observe(sb, l1)
	base, err := rxQueued(port)
	if err != nil {
		t.Fatal(err)
	}
	w.commit(p, "ck-1")
	w.model.Release()
	// The reply streams in pieces: wait until the bytes queued for
	// OpenCode grow and then stay the same for a while.
	queued, since := base, time.Now()
	w.eventually("the released reply in OpenCode's socket", func() (bool, string) {
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
		t.Errorf("OpenCode's sockets held %d unread bytes from the model, then %d (%v): it read while paused", queued, q, err)
	}
	if n := len(w.model.Requests()); n != 2 {
		t.Errorf("%d model requests while paused, want the 2 before it", n)
	}
	w.resume(p, "ck-1")
	w.eventually("OpenCode reading the reply", func() (bool, string) {
		q, err := rxQueued(port)
		return err == nil && q <= base, fmt.Sprintf("%d bytes unread (%v)", q, err)
	})

	r := w.mustSucceed(h)
	w.checkOneLaunch(r, 1)
	w.checkSameHarnessFinished(sb, l1, oc)
	t.Logf("the reply (%d bytes) waited unread in OpenCode's socket while paused and was read after continue; %s",
		queued-base, checkOneToolRun(t, w.model.Requests()))
}

// streamPace is the pause between the events of the streamed tool call in
// TestPauseMidStream: the stream (about eight events) lasts several seconds.
const streamPace = time.Second

// TestPauseMidStream: a checkpoint pauses OpenCode while the model's reply
// to its main turn (the tool call) is still streaming: OpenCode has the
// headers and the first events, and the rest keeps arriving while it is
// paused, waiting unread in its socket; nothing in the sandbox (database,
// files, CPU times) changes and no tool runs. After the checkpoint opens
// OpenCode reads the rest of the stream, runs the tool call and finishes:
// one launch, pauses 1, the same process, no model call repeated.
func TestPauseMidStream(t *testing.T) {
	t.Parallel()
	forEachOpenCode(t, testPauseMidStream)
}

func testPauseMidStream(t *testing.T, ver openCode) {
	paced := script("touch done.txt", "touch done.txt")
	w := newWorld(t, ver, "midstream", fakemodel.Options{Script: func(r fakemodel.Request) fakemodel.Reply {
		rep := paced(r)
		if rep.ToolCall != nil {
			rep.Pace = streamPace
		}
		return rep
	}})
	p := newParticipant()
	h := w.start(w.runner(w.adapter(nil), p), 1)
	w.eventually("the main turn's request", func() (bool, string) {
		n := len(mainTurns(w.model.Requests()))
		return n >= 1, fmt.Sprintf("%d main-turn requests", n)
	})
	// The first events go out at once; pause within the paced rest.
	time.Sleep(streamPace + streamPace/2)
	sb := w.waitSandbox(1)
	l1 := w.launchID(1, 1, sb)
	oc := w.harness(sb, l1)
	port := w.modelPort()

	w.prepare(p, "ck-1")
	paused := time.Now()
	a := w.observe(sb, l1)
	base, err := rxQueued(port)
	if err != nil {
		t.Fatal(err)
	}
	w.commit(p, "ck-1")
	// The rest of the stream arrives while OpenCode is paused: the bytes
	// queued for it grow, then stay the same once the stream has ended.
	queued, since := base, time.Now()
	for deadline := paused.Add(30 * streamPace); queued == base || time.Since(since) < 2*streamPace; time.Sleep(100 * time.Millisecond) {
		q, err := rxQueued(port)
		if err != nil {
			t.Fatal(err)
		}
		if q != queued {
			queued, since = q, time.Now()
		}
		if queued == base && time.Now().After(deadline) {
			t.Fatalf("no byte of the stream arrived in %s of pause: it had ended before the pause took (%s after the main turn's request); the machine is too slow for this test",
				30*streamPace, paused.Sub(mainTurns(w.model.Requests())[0].Received).Round(time.Millisecond))
		}
	}
	time.Sleep(hold)
	b := w.observe(sb, l1)
	t.Logf("paused mid-stream (%s after the main turn's request), processes %v: %s", paused.Sub(mainTurns(w.model.Requests())[0].Received).Round(time.Millisecond), comms(a), compareStill(t, a, b))
	if slices.Contains(comms(b), "touch") {
		t.Errorf("the tool ran while paused")
	}
	if n := len(w.model.Requests()); n != 2 {
		t.Errorf("%d model requests by the end of the pause, want the 2 before it (title, main turn)", n)
	}
	w.resume(p, "ck-1")

	r := w.mustSucceed(h)
	w.checkOneLaunch(r, 1)
	w.checkSameHarnessFinished(sb, l1, oc)
	t.Logf("%d bytes of the stream arrived while paused and were read after continue; %s", queued-base, checkOneToolRun(t, w.model.Requests()))
}

// TestPauseFourTimes: one run paused by four checkpoints: while its main
// turn is held (released while paused), twice in the middle of its tool
// call, and while the final reply is held. It is launched once, records
// pauses = 4, makes each model call once and is verified.
func TestPauseFourTimes(t *testing.T) {
	t.Parallel()
	forEachOpenCode(t, testPauseFourTimes)
}

func testPauseFourTimes(t *testing.T, ver openCode) {
	w := newWorld(t, ver, "four", fakemodel.Options{
		Script:   script("sleep 15; touch done.txt", "touch done.txt"),
		Holdable: func(r fakemodel.Request) bool { return r.HasTools },
	})
	w.model.Hold(1)
	p := newParticipant()
	h := w.start(w.runner(w.adapter(nil), p), 1)
	w.waitHeld(1)
	sb := w.waitSandbox(1)
	l1 := w.launchID(1, 1, sb)
	oc := w.harness(sb, l1)

	// 1: on the held main turn, released while paused.
	w.prepare(p, "ck-1")
	w.commit(p, "ck-1")
	w.model.Release()
	w.resume(p, "ck-1")

	// 2 and 3: in the middle of the tool call.
	w.waitContinued(1)
	w.waitProc(sb, l1, "sleep")
	w.prepare(p, "ck-2")
	a := w.observe(sb, l1)
	w.commit(p, "ck-2")
	time.Sleep(hold)
	t.Logf("pause 2, mid-tool, processes %v: %s", comms(a), compareStill(t, a, w.observe(sb, l1)))
	w.resume(p, "ck-2")
	// Wait until the run has continued its launch before the next
	// checkpoint: a Prepare right after Resume finds the run still marked
	// parked at ck-2 and reports it parked while it goes on running (see
	// the report on pkg/driver/participant.go).
	w.waitContinued(2)
	w.prepare(p, "ck-3")
	if b := w.observe(sb, l1); !slices.Contains(comms(b), "sleep") {
		t.Errorf("pause 3 is not mid-tool: %v", comms(b))
	}
	w.commit(p, "ck-3")
	// The final request must be held: hold it before the tool ends.
	w.model.Hold(1)
	w.resume(p, "ck-3")

	// 4: on the held final reply.
	w.waitContinued(3)
	w.waitHeld(1)
	w.prepare(p, "ck-4")
	w.commit(p, "ck-4")
	w.model.Release()
	w.resume(p, "ck-4")

	r := w.mustSucceed(h)
	w.checkOneLaunch(r, 4)
	w.checkSameHarnessFinished(sb, l1, oc)
	t.Logf("four pauses, one launch (OpenCode %d throughout), pauses=%d; %s", oc.PID, r.Launches[0].Pauses, checkOneToolRun(t, w.model.Requests()))
}
