package claude

// NeMo Gym's view of a Claude Code rollout: the `response` of the /run
// reply, a NeMoGymResponse (gym.Response and its items) built from the
// saved session, and the adapter's claude_* fields beside it.

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
	SessionPath string `json:"claude_session_path"`
	// RunStdout and RunStderr are (the tails of) what `claude -p` printed:
	// its stream-json events and its errors.
	RunStdout string `json:"claude_run_stdout"`
	RunStderr string `json:"claude_run_stderr"`
	// SessionFound: a session file was read.
	SessionFound bool `json:"claude_session_found"`
	// Finished: `claude -p` exited 0.
	Finished bool `json:"claude_finished"`
}

// BuildGymResponse builds the NeMoGymResponse of a run from its session:
// the output is every message after the task (the first user turn) as
// Responses items: an assistant message's text blocks as one output
// message, its thinking blocks as reasoning (the thinking as the summary)
// and its tool_use blocks as function calls (arguments the input as JSON
// text), each tool_result as a function call output (a call the session
// holds no result for gets an empty one), and later user turns as input
// messages; Claude Code's synthetic assistant messages and its notes are
// left out. The usage is the sum over the completed model responses, the
// input counting cache reads and writes (cache reads also as cached
// tokens). A nil session gives no output and a null usage.
func BuildGymResponse(s *Session, opt gym.ResponseOptions) gym.Response {
	r := gym.NewResponse(&opt)
	if s == nil {
		return r
	}
	answered := map[string]bool{}
	for _, m := range s.Messages {
		for _, b := range m.Blocks {
			if b.Type == "tool_result" {
				answered[b.ToolUseID] = true
			}
		}
	}
	// The empty outputs of a reply's unanswered calls go after the results
	// the session holds for its other calls, where a result would be.
	var pending []gym.Item
	flush := func() {
		r.Output = append(r.Output, pending...)
		pending = nil
	}
	task := false
	for _, m := range s.Messages {
		if !task {
			task = m.IsUserTurn()
			continue
		}
		switch {
		case m.Role == "assistant" && m.Model != "<synthetic>":
			flush()
			items, unanswered := assistantItems(m, answered, opt.NewHex)
			r.Output = append(r.Output, items...)
			pending = unanswered
		case m.IsUserTurn():
			flush()
			r.Output = append(r.Output, &gym.InputMessage{
				Content: []gym.InputText{{Text: m.Text(), Type: "input_text"}}, Role: "user", Type: "message",
			})
		case m.Role == "user" && !m.Meta:
			for _, b := range m.Blocks {
				if b.Type == "tool_result" {
					r.Output = append(r.Output, &gym.FunctionCallOutput{CallID: b.ToolUseID, Output: b.ResultText(), Type: "function_call_output"})
				}
			}
			flush()
		}
	}
	flush()
	var u gym.Usage
	for _, m := range s.Responses() {
		in := m.Usage.InputTokens + m.Usage.CacheCreationInputTokens + m.Usage.CacheReadInputTokens
		u.InputTokens += in
		u.InputTokensDetails.CachedTokens += m.Usage.CacheReadInputTokens
		u.OutputTokens += m.Usage.OutputTokens
		u.TotalTokens += in + m.Usage.OutputTokens
	}
	r.Usage = &u
	return r
}

// assistantItems are one assistant message's items, in block order: its
// thinking as reasoning, its text as one message, its tool calls; and an
// empty output for each call the session holds no result for.
func assistantItems(m Message, answered map[string]bool, newHex func() string) (items, unanswered []gym.Item) {
	text := m.Text()
	textDone := false
	for _, b := range m.Blocks {
		switch b.Type {
		case "thinking":
			items = append(items, &gym.Reasoning{ID: "rs_" + newHex(), Type: "reasoning",
				Summary: []gym.Summary{{Text: b.Thinking, Type: "summary_text"}}})
		case "text":
			if textDone || text == "" {
				continue
			}
			textDone = true
			items = append(items, &gym.OutputMessage{
				ID:      "msg_" + newHex(),
				Content: []gym.OutputText{{Annotations: []json.RawMessage{}, Text: text, Type: "output_text"}},
				Role:    "assistant", Status: "completed", Type: "message",
			})
		case "tool_use":
			args := harness.ArgumentsJSON(b.Input)
			items = append(items, &gym.FunctionCall{Arguments: args, CallID: b.ID, Name: b.Name, Type: "function_call"})
			if !answered[b.ID] {
				unanswered = append(unanswered, &gym.FunctionCallOutput{CallID: b.ID, Output: "", Type: "function_call_output"})
			}
		}
	}
	return items, unanswered
}

// GymResult implements harness.GymResulter: `response` is the
// NeMoGymResponse of the saved session (BuildGymResponse, the request side
// from the body's responses_create_params, the model from Options.Model),
// and the claude_* fields go beside it.
func (a *Adapter) GymResult(response, body json.RawMessage) (json.RawMessage, map[string]json.RawMessage, error) {
	return harness.LinesGymResult("claude", response, body, a.opt.Model, ParseSession, BuildGymResponse,
		func(r harness.StoredRun, found bool) any {
			return GymRunFields{SessionPath: r.SessionPath, RunStdout: r.Stdout, RunStderr: r.Stderr, SessionFound: found, Finished: r.ExitCode == 0}
		})
}
