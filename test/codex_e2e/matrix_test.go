package codexe2e

import (
	"testing"

	"github.com/ngharness/ngharness/internal/harnesstest"
)

// The matrix every real harness passes, with Codex (kit): each test is
// the harnesstest body of the same name.

// TestCodexRunVerified: the real Codex CLI under the driver runs the task
// to a verified result (the owner's check finds done.txt): one launch,
// finished, exit 0; two model requests on the rollout's prefix, the task
// the only user turn; the response holds the session file (in the state
// folder) and the final text, and its NeMoGymResponse the call, its
// output, the final message and the usage.
func TestCodexRunVerified(t *testing.T) {
	t.Parallel()
	harnesstest.RunVerified(t, kit)
}

// TestCodexPauseMidTool: a checkpoint pauses Codex while its exec_command
// runs `sleep`. Every process of the launch (Codex, the tool's bash in a
// session and process group of its own, sleep) is stopped; every file of
// the sandbox (Codex's session file and SQLite files among them) and every
// process's CPU time stay unchanged while the owner snapshots the sandbox
// and the checkpoint holds; no model request arrives. After the checkpoint
// opens the SAME Codex process finishes (one launch, pauses 1), each model
// call made once, and the owner verifies done.txt.
func TestCodexPauseMidTool(t *testing.T) {
	t.Parallel()
	harnesstest.PauseMidTool(t, kit)
}

// TestCodexPauseHeldReply: a checkpoint pauses Codex while the model's
// reply to its first request is held. The reply is released while Codex
// is paused: its bytes wait unread in Codex's socket, no tool runs, and
// nothing in the sandbox (files, CPU times) changes. After the checkpoint
// opens Codex reads that reply, runs the tool call it holds and finishes:
// one launch, pauses 1, no model call repeated.
func TestCodexPauseHeldReply(t *testing.T) {
	t.Parallel()
	harnesstest.PauseHeldReply(t, kit)
}

// TestCodexPauseMidStream: a checkpoint pauses Codex while the reply with
// its tool call is still streaming (the fake paces its events). While
// Codex is paused the rest of the stream arrives and waits unread in its
// socket (the queued bytes grow), and nothing in the sandbox changes; after
// the checkpoint opens Codex reads it, runs the tool and finishes: one
// launch, pauses 1, no model call repeated.
func TestCodexPauseMidStream(t *testing.T) {
	t.Parallel()
	harnesstest.PauseMidStream(t, kit)
}

// TestCodexTwoRolloutsApart: two rollouts run Codex at once, each in its
// own sandbox. A checkpoint of one pauses its processes only: the other's
// Codex, tool and sleep keep running (none stopped) and it finishes while
// the first is held; then the first continues and finishes too.
func TestCodexTwoRolloutsApart(t *testing.T) {
	t.Parallel()
	harnesstest.TwoRolloutsApart(t, kit)
}

// TestCodexCrashBeforeResponse: the driver crashes after a checkpoint
// taken while Codex's first model request is held (no completed response
// saved). The relaunch in the fork starts over (resumed false, the reason
// naming the missing response and the fresh CODEX_HOME), makes its two
// model calls with the task the only user turn, and is verified.
func TestCodexCrashBeforeResponse(t *testing.T) {
	t.Parallel()
	harnesstest.CrashBeforeResponse(t, kit)
}

// TestCodexHostileTask: a hostile task of about 100 KB
// (harnesstest.HostileText) reaches the model byte for byte as the only
// user turn, runs nothing it names (no pwned-* file anywhere in the
// sandbox), and the run is verified.
func TestCodexHostileTask(t *testing.T) {
	t.Parallel()
	harnesstest.HostileTask(t, kit)
}
