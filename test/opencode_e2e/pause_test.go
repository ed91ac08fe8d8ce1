package opencodee2e

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/harnesstest"
	"github.com/ngharness/ngharness/test/fakemodel"
)

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
	h := w.Start(w.Runner(w.adapter(nil), p), 1)
	sb := w.WaitSandbox(1)
	l1 := w.LaunchID(1, 1, sb)
	w.WaitProc(sb, l1, "sleep")
	oc := w.Harness(sb, l1)

	w.Prepare(p, "ck-1")
	nreq := len(w.Model.Requests())
	a := w.Observe(sb, l1)
	if _, ok := a.Procs[oc.PID]; !ok || !slices.Contains(harnesstest.Comms(a), "sleep") || len(a.Procs) < 3 {
		t.Fatalf("the paused launch holds %v (OpenCode %d), want OpenCode, the tool's shell and sleep", harnesstest.Comms(a), oc.PID)
	}
	tr, err := suite.Tree(w.LaunchDir(sb, l1))
	if err != nil {
		t.Fatal(err)
	}
	w.Commit(p, "ck-1")
	time.Sleep(harnesstest.Hold)
	b := w.Observe(sb, l1)
	t.Logf("paused mid-tool, processes (pid/ppid/pgid/sid) %s: %s", harnesstest.DescribeSessions(tr), compareStill(t, a, b))
	if n := len(w.Model.Requests()); n != nreq {
		t.Errorf("%d model requests arrived while paused", n-nreq)
	}
	w.Resume(p, "ck-1")

	r := w.mustSucceed(h)
	w.CheckOneLaunch(r.Launches, 1)
	w.CheckSameHarnessFinished(sb, l1, oc)
	t.Logf("after continue: the same OpenCode %d finished; %s", oc.PID, checkOneToolRun(t, w.Model.Requests()))
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
	w.Model.Hold(1)
	p := newParticipant()
	h := w.Start(w.Runner(w.adapter(nil), p), 1)
	w.WaitHeld(1)
	// The title request goes beside the main turn; let it be answered.
	w.Eventually("the title request", func() (bool, string) {
		n := len(w.Model.Requests())
		return n >= 2, fmt.Sprintf("%d requests", n)
	})
	sb := w.WaitSandbox(1)
	l1 := w.LaunchID(1, 1, sb)
	oc := w.Harness(sb, l1)
	port := w.ModelPort()

	a, base := w.PausedLook(p, "ck-1", sb, l1, port)
	queued := w.ReleaseSettled(port, base)
	time.Sleep(harnesstest.Hold)
	b := w.Observe(sb, l1)
	t.Logf("paused on the held reply, processes %v: %s", harnesstest.Comms(a), compareStill(t, a, b))
	if slices.Contains(harnesstest.Comms(b), "sleep") {
		t.Errorf("the tool ran while paused")
	}
	if q, err := harnesstest.RxQueued(port); err != nil || q != queued {
		t.Errorf("OpenCode's sockets held %d unread bytes from the model, then %d (%v): it read while paused", queued, q, err)
	}
	if n := len(w.Model.Requests()); n != 2 {
		t.Errorf("%d model requests while paused, want the 2 before it", n)
	}
	w.Resume(p, "ck-1")
	w.Eventually("OpenCode reading the reply", func() (bool, string) {
		q, err := harnesstest.RxQueued(port)
		return err == nil && q <= base, fmt.Sprintf("%d bytes unread (%v)", q, err)
	})

	r := w.mustSucceed(h)
	w.CheckOneLaunch(r.Launches, 1)
	w.CheckSameHarnessFinished(sb, l1, oc)
	t.Logf("the reply (%d bytes) waited unread in OpenCode's socket while paused and was read after continue; %s",
		queued-base, checkOneToolRun(t, w.Model.Requests()))
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
	h := w.Start(w.Runner(w.adapter(nil), p), 1)
	w.Eventually("the main turn's request", func() (bool, string) {
		n := len(mainTurns(w.Model.Requests()))
		return n >= 1, fmt.Sprintf("%d main-turn requests", n)
	})
	// The first events go out at once; pause within the paced rest.
	time.Sleep(streamPace + streamPace/2)
	sb := w.WaitSandbox(1)
	l1 := w.LaunchID(1, 1, sb)
	oc := w.Harness(sb, l1)
	port := w.ModelPort()

	w.Prepare(p, "ck-1")
	paused := time.Now()
	a := w.Observe(sb, l1)
	base, err := harnesstest.RxQueued(port)
	if err != nil {
		t.Fatal(err)
	}
	w.Commit(p, "ck-1")
	// The rest of the stream arrives while OpenCode is paused: the bytes
	// queued for it grow, then stay the same once the stream has ended.
	queued, since := base, time.Now()
	for deadline := paused.Add(30 * streamPace); queued == base || time.Since(since) < 2*streamPace; time.Sleep(100 * time.Millisecond) {
		q, err := harnesstest.RxQueued(port)
		if err != nil {
			t.Fatal(err)
		}
		if q != queued {
			queued, since = q, time.Now()
		}
		if queued == base && time.Now().After(deadline) {
			t.Fatalf("no byte of the stream arrived in %s of pause: it had ended before the pause took (%s after the main turn's request); the machine is too slow for this test",
				30*streamPace, paused.Sub(mainTurns(w.Model.Requests())[0].Received).Round(time.Millisecond))
		}
	}
	time.Sleep(harnesstest.Hold)
	b := w.Observe(sb, l1)
	t.Logf("paused mid-stream (%s after the main turn's request), processes %v: %s", paused.Sub(mainTurns(w.Model.Requests())[0].Received).Round(time.Millisecond), harnesstest.Comms(a), compareStill(t, a, b))
	if slices.Contains(harnesstest.Comms(b), "touch") {
		t.Errorf("the tool ran while paused")
	}
	if n := len(w.Model.Requests()); n != 2 {
		t.Errorf("%d model requests by the end of the pause, want the 2 before it (title, main turn)", n)
	}
	w.Resume(p, "ck-1")

	r := w.mustSucceed(h)
	w.CheckOneLaunch(r.Launches, 1)
	w.CheckSameHarnessFinished(sb, l1, oc)
	t.Logf("%d bytes of the stream arrived while paused and were read after continue; %s", queued-base, checkOneToolRun(t, w.Model.Requests()))
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
	w.Model.Hold(1)
	p := newParticipant()
	h := w.Start(w.Runner(w.adapter(nil), p), 1)
	w.WaitHeld(1)
	sb := w.WaitSandbox(1)
	l1 := w.LaunchID(1, 1, sb)
	oc := w.Harness(sb, l1)

	// 1: on the held main turn, released while paused.
	w.Prepare(p, "ck-1")
	w.Commit(p, "ck-1")
	w.Model.Release()
	w.Resume(p, "ck-1")

	// 2 and 3: in the middle of the tool call.
	w.WaitContinued(1)
	w.WaitProc(sb, l1, "sleep")
	w.Prepare(p, "ck-2")
	a := w.Observe(sb, l1)
	w.Commit(p, "ck-2")
	time.Sleep(harnesstest.Hold)
	t.Logf("pause 2, mid-tool, processes %v: %s", harnesstest.Comms(a), compareStill(t, a, w.Observe(sb, l1)))
	w.Resume(p, "ck-2")
	// Wait until the run has continued its launch before the next
	// checkpoint: a Prepare right after Resume finds the run still marked
	// parked at ck-2 and reports it parked while it goes on running (see
	// the report on pkg/driver/participant.go).
	w.WaitContinued(2)
	w.Prepare(p, "ck-3")
	if b := w.Observe(sb, l1); !slices.Contains(harnesstest.Comms(b), "sleep") {
		t.Errorf("pause 3 is not mid-tool: %v", harnesstest.Comms(b))
	}
	w.Commit(p, "ck-3")
	// The final request must be held: hold it before the tool ends.
	w.Model.Hold(1)
	w.Resume(p, "ck-3")

	// 4: on the held final reply.
	w.WaitContinued(3)
	w.WaitHeld(1)
	w.Prepare(p, "ck-4")
	w.Commit(p, "ck-4")
	w.Model.Release()
	w.Resume(p, "ck-4")

	r := w.mustSucceed(h)
	w.CheckOneLaunch(r.Launches, 4)
	w.CheckSameHarnessFinished(sb, l1, oc)
	t.Logf("four pauses, one launch (OpenCode %d throughout), pauses=%d; %s", oc.PID, r.Launches[0].Pauses, checkOneToolRun(t, w.Model.Requests()))
}
