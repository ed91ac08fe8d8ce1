package codex

// NeMo Gym's view of a Codex rollout: the `response` of the /run reply, a
// NeMoGymResponse (gym.Response and its items) built from the saved
// session, and the adapter's codex_* fields beside it.

import (
	"encoding/json"

	"github.com/ngharness/ngharness/pkg/gym"
	"github.com/ngharness/ngharness/pkg/harness"
)

// GymRunFields are the fields the adapter adds beside `response` in the
// /run reply.
type GymRunFields struct {
	// SessionPath is the session file inside the sandbox, "" when none was
	// found.
	SessionPath string `json:"codex_session_path"`
	// RunStdout and RunStderr are (the tails of) what `codex exec` printed.
	RunStdout string `json:"codex_run_stdout"`
	RunStderr string `json:"codex_run_stderr"`
	// SessionFound: a session file was read.
	SessionFound bool `json:"codex_session_found"`
	// Finished: `codex exec` exited 0.
	Finished bool `json:"codex_finished"`
}

// BuildGymResponse builds the NeMoGymResponse of a run from its session:
// the output is every response item after the task (the first user turn)
// but Codex's own context (developer messages, the environment context):
// assistant messages, reasoning (its summary), function calls (arguments
// as Codex sent them) and their outputs (see unanswered for a call without
// one), and later user turns; the usage
// is the sum over the completed model responses. A nil session gives no
// output and a null usage.
func BuildGymResponse(s *Session, opt gym.ResponseOptions) gym.Response {
	r := gym.NewResponse(&opt)
	newHex := opt.NewHex
	if s == nil {
		return r
	}
	answered := map[string]bool{}
	for _, it := range s.Items {
		if it.Type == "function_call_output" {
			answered[it.CallID] = true
		}
	}
	task := false
	for i, it := range s.Items {
		if !task {
			task = it.IsUserTurn()
			continue
		}
		switch it.Type {
		case "message":
			switch {
			case it.Role == "assistant":
				r.Output = append(r.Output, &gym.OutputMessage{
					ID:      "msg_" + newHex(),
					Content: []gym.OutputText{{Annotations: []json.RawMessage{}, Text: it.Text(), Type: "output_text"}},
					Role:    "assistant", Status: "completed", Type: "message",
				})
			case it.IsUserTurn():
				r.Output = append(r.Output, &gym.InputMessage{
					Content: []gym.InputText{{Text: it.Text(), Type: "input_text"}}, Role: "user", Type: "message",
				})
			}
		case "reasoning":
			rs := &gym.Reasoning{ID: "rs_" + newHex(), Summary: []gym.Summary{}, Type: "reasoning"}
			for _, p := range it.Summary {
				rs.Summary = append(rs.Summary, gym.Summary{Text: p.Text, Type: "summary_text"})
			}
			r.Output = append(r.Output, rs)
		case "function_call":
			r.Output = append(r.Output, &gym.FunctionCall{Arguments: it.Arguments, CallID: it.CallID, Name: it.Name, Type: "function_call"})
			if !answered[it.CallID] {
				r.Output = append(r.Output, &gym.FunctionCallOutput{CallID: it.CallID, Output: unanswered(s.Items[i+1:]), Type: "function_call_output"})
			}
		case "function_call_output":
			r.Output = append(r.Output, &gym.FunctionCallOutput{CallID: it.CallID, Output: it.OutputText(), Type: "function_call_output"})
		}
	}
	var u gym.Usage
	for _, resp := range s.Responses {
		u.InputTokens += resp.Usage.InputTokens
		u.InputTokensDetails.CachedTokens += resp.Usage.CachedTokens
		u.OutputTokens += resp.Usage.OutputTokens
		u.OutputTokensDetails.ReasoningTokens += resp.Usage.ReasoningTokens
		u.TotalTokens += resp.Usage.TotalTokens
	}
	r.Usage = &u
	return r
}

// GymResult implements harness.GymResulter: `response` is the
// NeMoGymResponse of the saved session (BuildGymResponse, the request side
// from the body's responses_create_params, the model from Options.Model),
// and the codex_* fields go beside it.
func (a *Adapter) GymResult(response, body json.RawMessage) (json.RawMessage, map[string]json.RawMessage, error) {
	return harness.LinesGymResult("codex", response, body, a.opt.Model, ParseSession, BuildGymResponse,
		func(r harness.StoredRun, found bool) any {
			return GymRunFields{SessionPath: r.SessionPath, RunStdout: r.Stdout, RunStderr: r.Stderr, SessionFound: found, Finished: r.ExitCode == 0}
		})
}

// unanswered is the output of a call the session holds none for, given
// the items after it: "aborted" when the session went on (Codex sent the
// model that synthetic output without saving it: a call interrupted by a
// crash, then resumed), else "" (the call never returned).
func unanswered(after []Item) string {
	for _, it := range after {
		if it.Type == "message" || it.Type == "function_call" || it.Type == "reasoning" {
			return "aborted"
		}
	}
	return ""
}
