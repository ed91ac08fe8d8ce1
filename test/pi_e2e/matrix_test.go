package pie2e

import (
	"testing"

	"github.com/ngharness/ngharness/internal/harnesstest"
)

// The matrix every real harness passes, with Pi (kit): each test is the
// harnesstest body of the same name.

// TestPiRunVerified: real Pi under the driver runs the task to a verified
// result (the owner's check finds done.txt): one launch, finished, exit 0;
// two model requests on the rollout's prefix, the task the only user turn;
// the response holds the session file (in the state folder) and the final
// text, and its NeMoGymResponse the call, its output, the final message
// and the usage.
func TestPiRunVerified(t *testing.T) {
	t.Parallel()
	harnesstest.RunVerified(t, kit)
}

// TestPiPauseMidTool: a checkpoint pauses Pi while its bash runs `sleep`.
// Every process of the launch (node running Pi, the tool's bash in a
// session and process group of its own, sleep) is stopped; every file of
// the sandbox (Pi's session file among them) and every process's CPU time
// stay unchanged while the owner snapshots the sandbox and the checkpoint
// holds; no model request arrives. After the checkpoint opens the SAME
// process finishes (one launch, pauses 1), each model call made once, and
// the owner verifies done.txt.
func TestPiPauseMidTool(t *testing.T) {
	t.Parallel()
	harnesstest.PauseMidTool(t, kit)
}

// TestPiPauseHeldReply: a checkpoint pauses Pi while the model's reply to
// its first request is held. The reply is released while Pi is paused:
// its bytes wait unread in Pi's socket, no tool runs, and nothing in the
// sandbox (files, CPU times) changes. After the checkpoint opens Pi reads
// that reply, runs the tool call it holds and finishes: one launch, pauses
// 1, no model call repeated.
func TestPiPauseHeldReply(t *testing.T) {
	t.Parallel()
	harnesstest.PauseHeldReply(t, kit)
}

// TestPiPauseMidStream: a checkpoint pauses Pi while the reply with its
// tool call is still streaming (the fake paces its events). While Pi is
// paused the rest of the stream arrives and waits unread in its socket
// (the queued bytes grow), and nothing in the sandbox changes; after the
// checkpoint opens Pi reads it, runs the tool and finishes: one launch,
// pauses 1, no model call repeated.
func TestPiPauseMidStream(t *testing.T) {
	t.Parallel()
	harnesstest.PauseMidStream(t, kit)
}

// TestPiTwoRolloutsApart: two rollouts run Pi at once, each in its own
// sandbox. A checkpoint of one pauses its processes only: the other's Pi,
// tool and sleep keep running (none stopped) and it finishes while the
// first is held; then the first continues and finishes too.
func TestPiTwoRolloutsApart(t *testing.T) {
	t.Parallel()
	harnesstest.TwoRolloutsApart(t, kit)
}

// TestPiCrashBeforeResponse: the driver crashes after a checkpoint taken
// while Pi's first model request is held (Pi has written no session yet).
// The relaunch in the fork starts over (resumed false, the reason saying
// the state folder holds no session and the fresh start), makes its two
// model calls with the task the only user turn, and is verified.
func TestPiCrashBeforeResponse(t *testing.T) {
	t.Parallel()
	harnesstest.CrashBeforeResponse(t, kit)
}

// TestPiHostileTask: a hostile task of about 100 KB
// (harnesstest.HostileText) reaches the model byte for byte as the only
// user turn, runs nothing it names (no pwned-* file anywhere in the
// sandbox), and the run is verified.
func TestPiHostileTask(t *testing.T) {
	t.Parallel()
	harnesstest.HostileTask(t, kit)
}
