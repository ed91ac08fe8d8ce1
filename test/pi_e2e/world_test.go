package pie2e

import (
	"strings"
	"testing"
	"time"

	fakemodel "github.com/ngharness/ngharness/internal/fake/model"
	"github.com/ngharness/ngharness/internal/harnesstest"
	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/pi"
)

// patience bounds every wait on something that should happen: generous
// (Pi starts in about a second alone, slower beside the other tests on 2
// cores), never an assertion about speed.
const patience = 4 * time.Minute

// The run body's task and check, and the final text of the scripted
// model: the same in every real-harness suite.
const (
	task      = harnesstest.Task
	check     = harnesstest.Check
	finalText = harnesstest.FinalText
)

// bashCall is a reply calling Pi's bash tool with cmd.
func bashCall(r fakemodel.Request, cmd string) fakemodel.Reply {
	return fakemodel.Reply{ToolCall: r.ShellCall(cmd)}
}

// isNoResult tells Pi's own result for a tool call that has none, which a
// continue saves for an interrupted call.
func isNoResult(m fakemodel.Message) bool {
	return m.Role == "tool" && m.Content == pi.NoResultText
}

// script is the fake model of these tests, deciding each reply from the
// request alone: one whose history ends with an interrupted tool call's
// result gets a bash call running again; one that ends with another tool
// result gets the final text; any other gets a bash call, running first in
// attempt 1 and again in later attempts (the rollout prefix names the
// attempt).
func script(first, again string) func(fakemodel.Request) fakemodel.Reply {
	return func(r fakemodel.Request) fakemodel.Reply {
		last := r.LastMessage()
		switch {
		case isNoResult(last):
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

// userTurns are the user turns of a request, each byte for byte: the text
// parts of its user messages, joined.
func userTurns(r fakemodel.Request) []string {
	var out []string
	for _, m := range r.Messages {
		if m.Role == "user" {
			out = append(out, strings.Join(m.Parts, ""))
		}
	}
	return out
}

// toolRun is one completed single-tool run of Pi on the wire: two chat
// completions, the bash call and its real result (not Pi's "No result
// provided"), the first ending with the task.
var toolRun = harnesstest.ToolRun{
	API: fakemodel.APIChat, Path: "/v1/chat/completions", Tool: "bash", UserTurns: userTurns, Synthetic: isNoResult, TaskLast: true,
}

// world is one test's world (harnesstest.World) running Pi.
type world struct {
	*harnesstest.World
	pi, node string // the pi command and node (host paths, visible in sandboxes)
}

// newWorld makes a world for t, named name (in its folders and rollout). It
// needs Pi (see piBin). Its cleanup is harnesstest.World's. The harness
// process of every launch is node running the launcher.
func newWorld(t *testing.T, name string, model fakemodel.Options) *world {
	t.Helper()
	bin, node := piBin(t), nodeBin(t)
	return &world{World: suite.NewWorld(t, harnesstest.WorldOptions{
		Name: name, Model: model, Harness: "Pi (node)", HarnessBin: node, Task: task, Check: check,
	}), pi: bin, node: node}
}

// adapter is the Pi adapter of the world: the host paths of Pi and node,
// the fake model's URL.
func (w *world) adapter() *pi.Adapter {
	w.T.Helper()
	return w.adapterWith(pi.Options{})
}

// adapterWith is the Pi adapter of the world with opt (its pi command,
// node and model URL filled in).
func (w *world) adapterWith(opt pi.Options) *pi.Adapter {
	w.T.Helper()
	opt.Pi, opt.Node, opt.ModelURL = w.pi, w.node, w.Model.URL()
	a, err := pi.New(opt)
	if err != nil {
		w.T.Fatal(err)
	}
	return a
}

// session is what this suite shares with the other suites of harnesses
// whose adapter collects the session file: the result, its checks, the
// participant and the rig.
var session = harnesstest.SessionKit{Adapter: "pi", Tool: "bash"}

// result is a run's result: the owner's verdict and the launch log, and
// Pi's response (what the adapter collected).
type result = harnesstest.SessionResult

// mustSucceed waits for the run, which must be verified, with the
// launcher's exit code 0, Pi's session read and the final text, and a Gym
// reply with its pi_* fields (harnesstest.SessionKit.MustSucceed).
func (w *world) mustSucceed(h *harnesstest.Run) result {
	w.T.Helper()
	return session.MustSucceed(w.World, w.adapter(), h)
}

// newParticipant is a participant for the Pi adapter.
func newParticipant() *driver.Participant { return session.Participant() }

// kit is what the shared matrix (harnesstest.Harness) needs of Pi.
var kit = harnesstest.Harness{
	Name: "Pi",
	NewRig: func(t *testing.T, name string, model fakemodel.Options) harnesstest.Rig {
		return newWorld(t, name, model).rig()
	},
	Script:         script,
	NewParticipant: newParticipant,
	ToolShell:      "bash",
	FilesNote:      " (Pi's state folder among them)",
	// Pi writes nothing before its first reply ends: a checkpoint taken
	// while the first request is held finds no session.
	FreshReason: "the saved Pi state folder holds no session; starting over with the task in a fresh Pi state folder",
	SessionFile: func(id, path string) bool {
		return strings.Contains(path, "/state/pi/") && strings.HasSuffix(path, "_"+id+".jsonl")
	},
}

// rig is the world as the shared matrix drives it.
func (w *world) rig() harnesstest.Rig {
	return session.Rig(w.World, func() harnesstest.SessionAdapter { return w.adapter() }, func(reqs []fakemodel.Request, attempt int) string {
		w.T.Helper()
		return w.CheckToolRun(reqs, attempt, toolRun)
	})
}
