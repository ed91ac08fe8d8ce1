package claudee2e

import (
	"strings"
	"testing"
	"time"

	fakemodel "github.com/ngharness/ngharness/internal/fake/model"
	"github.com/ngharness/ngharness/internal/harnesstest"
	"github.com/ngharness/ngharness/pkg/claude"
	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/harness"
)

// patience bounds every wait on something that should happen: generous
// (Claude Code starts in about a second alone, slower beside the other
// tests on 2 cores), never an assertion about speed.
const patience = 4 * time.Minute

// The run body's task and check, and the final text of the scripted
// model: the same in every real-harness suite.
const (
	task      = harnesstest.Task
	check     = harnesstest.Check
	finalText = harnesstest.FinalText
)

// bashCall is a reply calling Claude Code's Bash tool with cmd.
func bashCall(r fakemodel.Request, cmd string) fakemodel.Reply {
	return fakemodel.Reply{ToolCall: r.ShellCall(cmd)}
}

// script is the fake model of these tests, deciding each reply from the
// request alone: one whose history ends with an interrupted tool call's
// result gets a Bash call running again; one that ends with another tool
// result gets the final text; any other gets a Bash call, running first
// in attempt 1 and again in later attempts (the rollout prefix names the
// attempt).
func script(first, again string) func(fakemodel.Request) fakemodel.Reply {
	return func(r fakemodel.Request) fakemodel.Reply {
		last := r.LastMessage()
		switch {
		case last.Role == "tool" && strings.Contains(last.Content, "interrupted"):
			return bashCall(r, again)
		case last.Role == "tool":
			return fakemodel.Reply{Text: finalText}
		case r.Attempt > 1:
			return bashCall(r, again)
		default:
			return bashCall(r, first)
		}
	}
}

// world is one test's world (harnesstest.World) running Claude Code.
type world struct {
	*harnesstest.World
	claude string // the claude binary (host path, visible in sandboxes)
}

// newWorld makes a world for t, named name (in its folders and rollout). It
// needs Claude Code (see claudeBin). Its cleanup is harnesstest.World's.
func newWorld(t *testing.T, name string, model fakemodel.Options) *world {
	t.Helper()
	bin := claudeBin(t)
	return &world{World: suite.NewWorld(t, harnesstest.WorldOptions{
		Name: name, Model: model, Harness: "Claude Code", HarnessBin: bin, Task: task, Check: check,
	}), claude: bin}
}

// adapter is the Claude Code adapter of the world: the host path of
// Claude Code, the fake model's URL, and env added to its environment.
func (w *world) adapter(env map[string]string) *claude.Adapter {
	w.T.Helper()
	return w.adapterWith(claude.Options{CLIOptions: harness.CLIOptions{Env: env}})
}

// adapterWith is the Claude Code adapter of the world with opt (its
// binary and model URL filled in).
func (w *world) adapterWith(opt claude.Options) *claude.Adapter {
	w.T.Helper()
	opt.Claude, opt.ModelURL = w.claude, w.Model.URL()
	a, err := claude.New(opt)
	if err != nil {
		w.T.Fatal(err)
	}
	return a
}

// session is what this suite shares with the other suites of harnesses
// whose adapter collects the session file: the result, its checks, the
// participant and the rig.
var session = harnesstest.SessionKit{Adapter: "claude", Tool: "Bash"}

// result is a run's result: the owner's verdict and the launch log, and
// Claude Code's response (what the adapter collected).
type result = harnesstest.SessionResult

// mustSucceed waits for the run, which must be verified, with Claude Code's
// exit code 0, its session read and the final text, and a Gym reply with
// its claude_* fields (harnesstest.SessionKit.MustSucceed).
func (w *world) mustSucceed(h *harnesstest.Run) result {
	w.T.Helper()
	return session.MustSucceed(w.World, w.adapter(nil), h)
}

// newParticipant is a participant for the Claude Code adapter.
func newParticipant() *driver.Participant { return session.Participant() }

// kit is what the shared matrix (harnesstest.Harness) needs of Claude
// Code.
var kit = harnesstest.Harness{
	Name: "Claude Code",
	NewRig: func(t *testing.T, name string, model fakemodel.Options) harnesstest.Rig {
		return newWorld(t, name, model).rig()
	},
	Script:         script,
	NewParticipant: newParticipant,
	// Claude Code's Bash will not run a command that starts with sleep.
	ToolPrefix: "echo start; ",
	ToolShell:  "bash",
	FilesNote:  " (the session file and Claude Code's shell snapshots among them)",
	// Claude Code writes its session file on its own time: a checkpoint
	// taken while the first request is held finds either no session yet
	// ("holds no session") or one without a completed response (seen
	// both ways in CI); either way the relaunch starts over, and says so.
	FreshReason: "; starting over with the task in a fresh CLAUDE_CONFIG_DIR",
	SessionFile: func(id, path string) bool {
		return strings.Contains(path, "/state/claude/") && strings.HasSuffix(path, "/"+id+".jsonl")
	},
}

// rig is the world as the shared matrix drives it.
func (w *world) rig() harnesstest.Rig {
	return session.Rig(w.World, func() harnesstest.SessionAdapter { return w.adapter(nil) }, w.checkOneToolRun)
}
