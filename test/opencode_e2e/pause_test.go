package opencodee2e

import (
	"slices"
	"testing"
	"time"

	fakemodel "github.com/ngharness/ngharness/internal/fake/model"
	"github.com/ngharness/ngharness/internal/harnesstest"
)

// TestPauseMidTool: a checkpoint pauses OpenCode while its bash tool call
// runs `sleep` (harnesstest.PauseMidTool). Every process of the launch
// (OpenCode, the tool's bash in a session and process group of its own,
// sleep) is stopped; opencode.db, -wal and -shm, every file of the sandbox
// and every process's CPU time stay unchanged while the owner snapshots the
// sandbox and the checkpoint holds; no model request arrives. After the
// checkpoint opens the SAME OpenCode process finishes (one launch, pauses
// 1), with title, tool call and final requested once each, and the owner
// verifies done.txt.
func TestPauseMidTool(t *testing.T) {
	t.Parallel()
	forEachOpenCode(t, func(t *testing.T, oc openCode) { harnesstest.PauseMidTool(t, kit(oc)) })
}

// TestPauseHeldReply: a checkpoint pauses OpenCode while the model's reply
// to its main turn is held (harnesstest.PauseHeldReply; the title request
// answered). The reply is released while OpenCode is paused: its bytes
// wait unread in OpenCode's socket, and nothing in the sandbox (database,
// files, CPU times) changes. After the checkpoint opens OpenCode reads
// that reply, runs the tool call it holds and finishes: one launch, pauses
// 1, no model call repeated.
func TestPauseHeldReply(t *testing.T) {
	t.Parallel()
	forEachOpenCode(t, func(t *testing.T, oc openCode) { harnesstest.PauseHeldReply(t, kit(oc)) })
}

// TestPauseMidStream: a checkpoint pauses OpenCode while the model's reply
// to its main turn (the tool call) is still streaming
// (harnesstest.PauseMidStream): OpenCode has the headers and the first
// events, and the rest keeps arriving while it is paused, waiting unread
// in its socket; nothing in the sandbox (database, files, CPU times)
// changes and no tool runs. After the checkpoint opens OpenCode reads the
// rest of the stream, runs the tool call and finishes: one launch, pauses
// 1, the same process, no model call repeated.
func TestPauseMidStream(t *testing.T) {
	t.Parallel()
	forEachOpenCode(t, func(t *testing.T, oc openCode) { harnesstest.PauseMidStream(t, kit(oc)) })
}

// TestTwoRolloutsApart: two rollouts run OpenCode at once, each in its own
// sandbox (harnesstest.TwoRolloutsApart). A checkpoint of one pauses its
// processes only: the other's OpenCode, tool and sleep are none of the
// first's paused processes and keep running (none stopped), and it
// finishes while the first is held; then the first continues and finishes
// too.
func TestTwoRolloutsApart(t *testing.T) {
	t.Parallel()
	forEachOpenCode(t, func(t *testing.T, oc openCode) { harnesstest.TwoRolloutsApart(t, kit(oc)) })
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
	// checkpoint, so pause 3 holds the launch ck-2's resume let go on. (A
	// Prepare at once would wait for it too: the resume sets a parked run
	// back to waiting, Participant.OpenAdmission in pkg/driver/agent.go, so
	// it is not exported while its harness goes on.)
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
	t.Logf("four pauses, one launch (OpenCode %d throughout), pauses=%d; %s", oc.PID, r.Launches[0].Pauses, checkOneToolRun(t, w.Model.Requests(), 1))
}
