package opencodee2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	fakemodel "github.com/ngharness/ngharness/internal/fake/model"
	"github.com/ngharness/ngharness/internal/harnesstest"
	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/driver/launch"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/local"
	"github.com/ngharness/ngharness/pkg/harness"
	"github.com/ngharness/ngharness/pkg/opencode"
)

// patience bounds every wait on something that should happen: generous
// (OpenCode starts in 3 to 9 s alone, slower beside the other tests on 2
// cores), never an assertion about speed.
const patience = 4 * time.Minute

// The run body's task and check, and the final text of the scripted model
// (the same in every real-harness suite); the title OpenCode asks for.
const (
	task      = harnesstest.Task
	check     = harnesstest.Check
	finalText = harnesstest.FinalText
	titleText = "OpenCode e2e"
)

// script is the fake model of these tests, deciding each reply from the
// request alone: the title request (no tools) gets a short title; a main
// turn whose history ends with an interrupted tool result gets a bash call
// running again; one ending with any other tool result gets the final
// text; any other main turn gets a bash call running first.
func script(first, again string) func(fakemodel.Request) fakemodel.Reply {
	call := func(cmd string) *fakemodel.ToolCall {
		args, err := json.Marshal(map[string]string{"command": cmd, "description": "Runs the scripted command"})
		if err != nil {
			panic(err)
		}
		return &fakemodel.ToolCall{Name: "bash", Arguments: string(args)}
	}
	return func(r fakemodel.Request) fakemodel.Reply {
		last := r.LastMessage()
		switch {
		case !r.HasTools:
			return fakemodel.Reply{Text: titleText}
		case last.Role == "tool" && strings.Contains(last.Content, "interrupted"):
			return fakemodel.Reply{ToolCall: call(again)}
		case last.Role == "tool":
			return fakemodel.Reply{Text: finalText}
		default:
			return fakemodel.Reply{ToolCall: call(first)}
		}
	}
}

// world is one test's world (harnesstest.World) running one OpenCode
// version.
type world struct {
	*harnesstest.World
	oc      string // the opencode binary (host path, visible in sandboxes)
	version string // its version
}

// newWorld makes a world for t running OpenCode oc, named name and oc's
// version (in its folders and rollout). Its cleanup is
// harnesstest.World's. Its looks at a paused launch read OpenCode's
// database too (dbFiles).
func newWorld(t *testing.T, oc openCode, name string, model fakemodel.Options) *world {
	t.Helper()
	w := &world{World: suite.NewWorld(t, harnesstest.WorldOptions{
		Name: name + "-" + oc.version, Model: model, Harness: "OpenCode", HarnessBin: oc.bin, Task: task, Check: check,
	}), oc: oc.bin, version: oc.version}
	w.Extra = w.dbFiles
	return w
}

// adapter is the OpenCode adapter of the world: the host path of OpenCode,
// the fake model's URL, the built ngresume, and env added to OpenCode's
// environment.
func (w *world) adapter(env map[string]string) *opencode.Adapter {
	w.T.Helper()
	a, err := opencode.New(opencode.Options{
		OpenCode:       w.oc,
		CLIOptions:     harness.CLIOptions{ModelURL: w.Model.URL(), Env: env},
		ResumeBinaries: launch.FindBinaries(suite.BinDir, "ngresume"),
	})
	if err != nil {
		w.T.Fatal(err)
	}
	return a
}

// checkGymReply checks the /run reply of the run (harnesstest's
// CheckGymReply: the final answer is the last output message, the usage
// is counted) and its opencode_* fields: the run finished, its export was
// found, and its path.
func (w *world) checkGymReply(response json.RawMessage) {
	w.T.Helper()
	fields := w.CheckGymReply(w.adapter(nil), response, "", finalText)
	if string(fields["opencode_finished"]) != "true" || string(fields["opencode_export_found"]) != "true" || len(fields["opencode_results_fpath"]) < 3 {
		w.T.Errorf("the opencode_* fields %v: want finished, export found and its path", fields)
	}
}

// result is a run's result: the owner's verdict and the launch log
// (harnesstest.Verdict), and OpenCode's response (what the adapter
// collected).
type result struct {
	harnesstest.Verdict
	Response struct {
		ExitCode    int             `json:"exit_code"`
		SessionID   string          `json:"session_id"`
		Session     json.RawMessage `json:"session"`
		FinalText   string          `json:"final_text"`
		ExportError string          `json:"export_error"`
		StderrTail  string          `json:"stderr_tail"`
	} `json:"response"`
}

// mustSucceed waits for the run, which must return a result with reward 1
// (the owner's check found done.txt in the workdir of the current sandbox),
// OpenCode's exit code 0, its export read and the final text, and a Gym
// reply that checkGymReply accepts.
func (w *world) mustSucceed(h *harnesstest.Run) result {
	w.T.Helper()
	return harnesstest.MustSucceed(w.World, h, func(r result, response json.RawMessage) {
		w.T.Helper()
		if r.Response.ExitCode != 0 || r.Response.ExportError != "" || r.Response.FinalText != finalText {
			w.T.Errorf("response: exit code %d, export error %q, final text %q (want 0, none, %q); stderr tail %q",
				r.Response.ExitCode, r.Response.ExportError, r.Response.FinalText, finalText, r.Response.StderrTail)
		}
		w.checkGymReply(response)
	})
}

// newParticipant is a participant for the OpenCode adapter.
func newParticipant() *driver.Participant {
	return driver.MustParticipant(driver.ParticipantConfig{Adapter: "opencode"})
}

// dbFiles reads opencode.db, -wal and -shm of every OpenCode data folder of
// the sandbox (host paths), by base name; the test fails unless there is
// exactly one database.
func (w *world) dbFiles(sandboxID string) map[string][]byte {
	w.T.Helper()
	dbs, _ := filepath.Glob(filepath.Join(w.Local.HostPath(sandboxID), local.RootFolder, "state", "opencode", "*", "data", "opencode", "opencode.db"))
	if len(dbs) != 1 {
		w.T.Fatalf("OpenCode databases in %s: %v, want one", sandboxID, dbs)
	}
	out := map[string][]byte{}
	for _, suffix := range []string{"", "-wal", "-shm"} {
		data, err := os.ReadFile(dbs[0] + suffix)
		if err != nil {
			w.T.Fatalf("read the database: %v", err)
		}
		out["opencode.db"+suffix] = data
	}
	return out
}

// compareStill is harnesstest.CompareStill for OpenCode: its looks carry
// the bytes of opencode.db, -wal and -shm.
func compareStill(t *testing.T, a, b harnesstest.Still) string {
	t.Helper()
	return harnesstest.CompareStill(t, a, b, "")
}

// kit is what the shared matrix (harnesstest.Harness) needs of OpenCode
// oc. Its side request is the title request (no tools), made beside the
// first main turn.
func kit(oc openCode) harnesstest.Harness {
	return harnesstest.Harness{
		Name: "OpenCode",
		NewRig: func(t *testing.T, name string, model fakemodel.Options) harnesstest.Rig {
			return newWorld(t, oc, name, model).rig()
		},
		Script:         script,
		NewParticipant: newParticipant,
		ToolShell:      "bash",
		MainTurn:       func(r fakemodel.Request) bool { return r.HasTools },
		SideRequests:   1,
		FreshReason:    "holds no completed model response",
	}
}

// rig is the world as the shared matrix drives it.
func (w *world) rig() harnesstest.Rig {
	return harnesstest.Rig{
		World:   w.World,
		Adapter: func() harness.Adapter { return w.adapter(nil) },
		MustSucceed: func(h *harnesstest.Run) harnesstest.Finished {
			w.T.Helper()
			r := w.mustSucceed(h)
			return harnesstest.Finished{Verdict: r.Verdict, SessionID: r.Response.SessionID}
		},
		CheckOneToolRun: func(reqs []fakemodel.Request, attempt int) string {
			w.T.Helper()
			return checkOneToolRun(w.T, reqs, attempt)
		},
	}
}
