package codexe2e

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	fakemodel "github.com/ngharness/ngharness/internal/fake/model"
	"github.com/ngharness/ngharness/internal/harnesstest"
	"github.com/ngharness/ngharness/pkg/codex"
	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/harness"
)

// patience bounds every wait on something that should happen: generous
// (Codex starts in about a second alone, slower beside the other tests on
// 2 cores), never an assertion about speed.
const patience = 4 * time.Minute

// The run body's task and check, and the final text of the scripted
// model: the same in every real-harness suite.
const (
	task      = harnesstest.Task
	check     = harnesstest.Check
	finalText = harnesstest.FinalText
)

// yieldMS is how long Codex's exec_command waits for the command before it
// hands the model what the command printed so far (its range is 250 to
// 30000 ms): the scripted commands end well within it, paused time
// included.
const yieldMS = 30000

// execCall is a reply calling Codex's exec_command tool with cmd.
func execCall(cmd string) fakemodel.Reply {
	args, err := json.Marshal(map[string]any{"cmd": cmd, "yield_time_ms": yieldMS})
	if err != nil {
		panic(err)
	}
	return fakemodel.Reply{ToolCall: &fakemodel.ToolCall{Name: "exec_command", Arguments: string(args)}}
}

// script is the fake model of these tests, deciding each reply from the
// request alone: one whose history ends with a tool result gets the final
// text; any other gets an exec_command call, running first in attempt 1
// and again in later attempts (the rollout prefix names the attempt).
func script(first, again string) func(fakemodel.Request) fakemodel.Reply {
	return func(r fakemodel.Request) fakemodel.Reply {
		switch {
		case r.LastMessage().Role == "tool":
			return fakemodel.Reply{Text: finalText}
		case r.Attempt > 1:
			return execCall(again)
		default:
			return execCall(first)
		}
	}
}

// world is one test's world (harnesstest.World) running Codex.
type world struct {
	*harnesstest.World
	codex string // the codex binary (host path, visible in sandboxes)
}

// newWorld makes a world for t, named name (in its folders and rollout). It
// needs Codex (see codexBin). Its cleanup is harnesstest.World's.
func newWorld(t *testing.T, name string, model fakemodel.Options) *world {
	t.Helper()
	bin := codexBin(t)
	return &world{World: suite.NewWorld(t, harnesstest.WorldOptions{
		Name: name, Model: model, Harness: "Codex", HarnessBin: bin, Task: task, Check: check,
	}), codex: bin}
}

// adapter is the Codex adapter of the world: the host path of Codex, the
// fake model's URL, and env added to Codex's environment.
func (w *world) adapter(env map[string]string) *codex.Adapter {
	w.T.Helper()
	return w.adapterWith(codex.Options{CLIOptions: harness.CLIOptions{Env: env}})
}

// adapterWith is the Codex adapter of the world with opt (its binary and
// model URL filled in).
func (w *world) adapterWith(opt codex.Options) *codex.Adapter {
	w.T.Helper()
	opt.Codex, opt.ModelURL = w.codex, w.Model.URL()
	a, err := codex.New(opt)
	if err != nil {
		w.T.Fatal(err)
	}
	return a
}

// session is what this suite shares with the other suites of harnesses
// whose adapter collects the session file: the result, its checks, the
// participant and the rig.
var session = harnesstest.SessionKit{Adapter: "codex", Tool: "exec_command"}

// result is a run's result: the owner's verdict and the launch log, and
// Codex's response (what the adapter collected).
type result = harnesstest.SessionResult

// mustSucceed waits for the run, which must be verified, with Codex's
// exit code 0, its session read and the final text, and a Gym reply with
// its codex_* fields (harnesstest.SessionKit.MustSucceed).
func (w *world) mustSucceed(h *harnesstest.Run) result {
	w.T.Helper()
	return session.MustSucceed(w.World, w.adapter(nil), h)
}

// newParticipant is a participant for the Codex adapter.
func newParticipant() *driver.Participant { return session.Participant() }

// kit is what the shared matrix (harnesstest.Harness) needs of Codex.
var kit = harnesstest.Harness{
	Name: "Codex",
	NewRig: func(t *testing.T, name string, model fakemodel.Options) harnesstest.Rig {
		return newWorld(t, name, model).rig()
	},
	Script:         script,
	NewParticipant: newParticipant,
	ToolShell:      "bash",
	FilesNote:      " (the session file and Codex's SQLite files among them)",
	FreshReason:    "holds no completed model response; starting over with the task in a fresh CODEX_HOME",
	SessionFile: func(id, path string) bool {
		return strings.Contains(path, "/state/codex/") && strings.HasSuffix(path, "-"+id+".jsonl")
	},
}

// rig is the world as the shared matrix drives it.
func (w *world) rig() harnesstest.Rig {
	return session.Rig(w.World, func() harnesstest.SessionAdapter { return w.adapter(nil) }, w.checkOneToolRun)
}
