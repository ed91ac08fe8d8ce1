package claudee2e

import (
	"testing"

	"github.com/ngharness/ngharness/internal/harnesstest"
)

// The matrix every real harness passes, with Claude Code (kit): each test is
// the harnesstest body of the same name.

// TestClaudeRunVerified: the real Claude Code under the driver runs the task
// to a verified result (the owner's check finds done.txt): one launch,
// finished, exit 0; two model requests on the rollout's prefix, the task
// the only user turn; the response holds the session file (in the state
// folder) and the final text, and its NeMoGymResponse the call, its
// output, the final message and the usage.
func TestClaudeRunVerified(t *testing.T) {
	t.Parallel()
	harnesstest.RunVerified(t, kit)
}

// TestClaudePauseMidTool: a checkpoint pauses Claude Code while its Bash
// runs `sleep`. Every process of the launch (Claude Code, the tool's bash
// in a session and process group of its own, sleep) is stopped; every file
// of the sandbox (Claude Code's session file and shell snapshots among
// them) and every process's CPU time stay unchanged while the owner
// snapshots the sandbox and the checkpoint holds; no model request arrives.
// After the checkpoint opens the SAME Claude Code process finishes (one
// launch, pauses 1), each model call made once, and the owner verifies
// done.txt.
func TestClaudePauseMidTool(t *testing.T) {
	t.Parallel()
	harnesstest.PauseMidTool(t, kit)
}

// TestClaudePauseHeldReply: a checkpoint pauses Claude Code while the
// model's reply to its first request is held. The reply is released while
// Claude Code is paused: its bytes wait unread in Claude Code's socket, no
// tool runs, and nothing in the sandbox (files, CPU times) changes. After
// the checkpoint opens Claude Code reads that reply, runs the tool call it
// holds and finishes: one launch, pauses 1, no model call repeated.
func TestClaudePauseHeldReply(t *testing.T) {
	t.Parallel()
	harnesstest.PauseHeldReply(t, kit)
}

// TestClaudePauseMidStream: a checkpoint pauses Claude Code while the reply
// with its tool call is still streaming (the fake paces its events). While
// Claude Code is paused the rest of the stream arrives and waits unread in
// its socket (the queued bytes grow), and nothing in the sandbox changes;
// after the checkpoint opens Claude Code reads it, runs the tool and
// finishes: one launch, pauses 1, no model call repeated.
func TestClaudePauseMidStream(t *testing.T) {
	t.Parallel()
	harnesstest.PauseMidStream(t, kit)
}

// TestClaudeTwoRolloutsApart: two rollouts run Claude Code at once, each in
// its own sandbox. A checkpoint of one pauses its processes only: the
// other's Claude Code, tool and sleep keep running (none stopped) and it
// finishes while the first is held; then the first continues and finishes
// too.
func TestClaudeTwoRolloutsApart(t *testing.T) {
	t.Parallel()
	harnesstest.TwoRolloutsApart(t, kit)
}

// TestClaudeCrashBeforeResponse: the driver crashes after a checkpoint
// taken while Claude Code's first model request is held (no completed
// response saved). The relaunch in the fork starts over (resumed false, the
// reason naming the missing response and the fresh CLAUDE_CONFIG_DIR),
// makes its two model calls with the task the only user turn, and is
// verified.
func TestClaudeCrashBeforeResponse(t *testing.T) {
	t.Parallel()
	harnesstest.CrashBeforeResponse(t, kit)
}

// TestClaudeHostileTask: a hostile task of about 100 KB
// (harnesstest.HostileText) reaches the model byte for byte as the only
// user turn, runs nothing it names (no pwned-* file anywhere in the
// sandbox), and the run is verified.
func TestClaudeHostileTask(t *testing.T) {
	t.Parallel()
	harnesstest.HostileTask(t, kit)
}
