package harnesstest

import (
	"encoding/json"

	fakemodel "github.com/ngharness/ngharness/internal/fake/model"
	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/harness"
)

// The run body every real-harness suite sends (its task and the owner's
// check), and the final text of its scripted model.
const (
	Task      = "run the tool"
	Check     = "test -f done.txt"
	FinalText = "all done"
)

// SessionKit is the part of a suite's world that is the same for every
// harness whose adapter collects the harness's session file (Codex, Claude
// Code, Pi): how a verified run is checked, the participant, and the Rig
// the matrix drives. A suite's world_test.go declares one and wraps it in
// its own names (mustSucceed, newParticipant, rig); what differs between
// the harnesses is in its fields.
type SessionKit struct {
	// Adapter is the adapter's name: its row in the adapter table, its
	// participant's Adapter, and the prefix of its Gym fields
	// (<Adapter>_finished, _session_found, _session_path).
	Adapter string
	// Tool is the harness's shell tool as its Gym reply names the calls
	// ("Bash", "exec_command").
	Tool string
}

// SessionAdapter is the adapter of such a harness: a harness.Adapter whose
// results shape the Gym reply.
type SessionAdapter interface {
	harness.Adapter
	GymShaper
}

// SessionResult is a run's result: the owner's verdict and the launch log
// (Verdict), and the harness's response as the adapter collected it.
type SessionResult struct {
	Verdict
	Response SessionResponse `json:"response"`
}

// CheckGymReply checks the /run reply of a run of adapter a
// (World.CheckGymReply: the tool calls and their outputs, the final
// answer FinalText, the usage) and its <Adapter>_* fields: the run
// finished, its session was found, and its path is there.
func (k SessionKit) CheckGymReply(w *World, a GymShaper, response json.RawMessage) {
	w.T.Helper()
	fields := w.CheckGymReply(a, response, k.Tool, FinalText)
	p := k.Adapter + "_"
	if string(fields[p+"finished"]) != "true" || string(fields[p+"session_found"]) != "true" || len(fields[p+"session_path"]) < 3 {
		w.T.Errorf("the %s* fields: finished %s, session_found %s, session_path %s; want true, true and its path",
			p, fields[p+"finished"], fields[p+"session_found"], fields[p+"session_path"])
	}
}

// MustSucceed waits for the run h of adapter a, which must return a result
// with reward 1 (the owner's check held in the workdir of the current
// sandbox), the harness's exit code 0, its session read and the final text
// FinalText, and a Gym reply that CheckGymReply accepts.
func (k SessionKit) MustSucceed(w *World, a GymShaper, h *Run) SessionResult {
	w.T.Helper()
	return MustSucceed(w, h, func(r SessionResult, response json.RawMessage) {
		w.T.Helper()
		r.Response.Check(w.T, FinalText)
		k.CheckGymReply(w, a, response)
	})
}

// Participant is a participant for the kit's adapter.
func (k SessionKit) Participant() *driver.Participant {
	return driver.MustParticipant(driver.ParticipantConfig{Adapter: k.Adapter})
}

// Rig is the world w as the matrix drives it: adapter makes the harness's
// adapter of w, and check checks one completed single-tool run.
func (k SessionKit) Rig(w *World, adapter func() SessionAdapter, check func(reqs []fakemodel.Request, attempt int) string) Rig {
	return Rig{
		World:   w,
		Adapter: func() harness.Adapter { return adapter() },
		MustSucceed: func(h *Run) Finished {
			w.T.Helper()
			r := k.MustSucceed(w, adapter(), h)
			return Finished{Verdict: r.Verdict, SessionID: r.Response.SessionID, SessionPath: r.Response.SessionPath}
		},
		CheckOneToolRun: check,
	}
}
